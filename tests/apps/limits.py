"""Declarations of the limits integration tests (workers in other processes load them as
`tests.apps.limits`): a limit per tenant from the limits table."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class TenantJob(BaseModel):
    tenant: str
    n: int


# 2 in flight per tenant, unless the limits table's rows named "tiers" say otherwise.
tiered = Workflow(name="tiered", payload=TenantJob,
                  concurrency=Concurrency(limit=2, key="tenant", per_key="tiers"))

app = App([tiered])
