"""Declarations the overrides' integration tests run against (`tests.apps.overrides`)."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, RateLimit, Throttle, Workflow


class Call(BaseModel):
    n: int


# One limit for the whole workflow: a partner API that takes four calls at a time.
partner_call = Workflow(name="partnerCall", payload=Call, concurrency=Concurrency(limit=4))


class Alert(BaseModel):
    n: int


# A partner that takes one call each two seconds, and an alert sent at most twice a minute.
paced_sync = Workflow(name="pacedSync", payload=Call, throttle=Throttle(limit=1, period="2s"))
alert = Workflow(name="alert", payload=Alert, rate_limit=RateLimit(limit=2, period="1m"))

# A partner that takes one call each ten seconds: the console's throttle override.
slow_sync = Workflow(name="slowSync", payload=Call, throttle=Throttle(limit=1, period="10s"))


class Tenanted(BaseModel):
    tenant: str
    n: int = 0


# One call each two seconds per tenant, and one each two seconds in all: an override of
# the second of a workflow's several throttles.
two_paces = Workflow(name="twoPaces", payload=Tenanted, throttle=[
    Throttle(limit=1, period="2s", key="tenant"), Throttle(limit=1, period="2s")])

# A pool of one slot per tenant, then one run at a time of the workflow: a tenant's start
# holding the pool's slot while it waits for the second, the tenant's next one waits at the
# pool with no run of the tenant in flight.
pooled_one = Workflow(name="pooledOne", payload=Tenanted, concurrency=[
    Concurrency(limit=1, pool="tenants", key="tenant"), Concurrency(limit=1)])

app = App([partner_call, paced_sync, alert, slow_sync, two_paces, pooled_one])
