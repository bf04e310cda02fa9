"""Declarations the ledger-key tests run against: the keys a ledger row shows."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class Job(BaseModel):
    tenant: str
    region: str = "eu"


# Two limits: one run at a time per tenant, and one per region.
two_limits = Workflow(name="twoLimits", payload=Job, concurrency=[
    Concurrency(limit=1, key="tenant"), Concurrency(limit=1, key="region"),
])

# One run per tenant, its slot leased for a minute to a run that goes silent.
leased = Workflow(name="leasedByTenant", payload=Job,
                  concurrency=Concurrency(limit=1, key="tenant", lease="1m"))

app = App([two_limits, leased])
