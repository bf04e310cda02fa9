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

app = App([partner_call, paced_sync, alert, slow_sync])
