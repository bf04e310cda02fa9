"""Declarations for the Java engine's integration test (tests/integration/test_java_engine.py):
the workers load them as `tests.apps.java_engine`; the Java engine knows nothing of them."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class HeldJob(BaseModel):
    n: int
    holdMs: int  # how long the Java engine keeps the run before it reports it completed


# At most 2 in flight: the Java engine's reports are what free a slot.
java_job = Workflow(name="javaJob", payload=HeldJob, concurrency=Concurrency(limit=2))

app = App([java_job])
