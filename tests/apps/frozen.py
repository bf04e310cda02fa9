"""Declarations of the frozen-worker fault test (tests/faults/test_frozen.py): starts
parked on a timer long enough for a frozen worker's partitions to move before it fires."""

from pydantic import BaseModel

from sluicegate.declare import App, Debounce, Workflow


class Edit(BaseModel):
    doc: str


# Parked for 8 quiet seconds: longer than a worker's session (6 s), so the timers of a
# worker frozen just after parking them fall due after its partitions have moved.
edit = Workflow(name="slowIndex", payload=Edit,
                debounce=Debounce(key="doc", period="8s", timeout="30s"))

app = App([edit])
