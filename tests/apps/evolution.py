"""Declarations the schema-evolution test runs against (tests/integration/
test_schema_evolution.py): starts that wait in a stage's store across a worker upgrade,
debounced and queued for a concurrency slot."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Debounce, Workflow


class Edit(BaseModel):
    rowId: str
    editedAt: int


class Job(BaseModel):
    tenant: str
    n: int


edit = Workflow(name="edit", payload=Edit, debounce=Debounce(key="rowId", period="5 minutes"))
job = Workflow(name="job", payload=Job, concurrency=Concurrency(limit=1, key="tenant"))

app = App([edit, job])
