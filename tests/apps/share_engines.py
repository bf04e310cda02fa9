"""Declarations for the share-group engine tests (tests/integration/test_share_engines.py):
the workers load them as `tests.apps.share_engines`."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class HeldJob(BaseModel):
    n: int
    holdMs: int  # how long the engine keeps the run before it reports it completed


# At most 3 in flight, whichever engine instances run them. The lease is the default hour:
# a start an instance took and never acknowledged comes back only when the share group's
# record lock runs out (30 s) if the instance dies, and a shorter lease would take it
# for lost first (docs/decisions/share-group-engines.md).
share_job = Workflow(name="shareJob", payload=HeldJob, concurrency=Concurrency(limit=3))

app = App([share_job])
