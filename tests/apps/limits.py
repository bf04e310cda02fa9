"""Declarations of the limits integration tests (workers in other processes load them as
`tests.apps.limits`): a limit per tenant from the limits table, and a pool's guaranteed
share per tenant."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class TenantJob(BaseModel):
    tenant: str
    n: int


# 2 in flight per tenant, unless the limits table's rows named "tiers" say otherwise.
tiered = Workflow(name="tiered", payload=TenantJob,
                  concurrency=Concurrency(limit=2, key="tenant", per_key="tiers"))

# A pool of 6 shared by tenants, big weighted 50 (its turns come 50 in a row), and each
# tenant with starts waiting guaranteed 2 of the slots.
floored = Workflow(name="floored", payload=TenantJob, concurrency=Concurrency(
    limit=6, pool="gpu", fair_by="tenant", weights={"big": 50}, floor=2))

app = App([tiered, floored])
