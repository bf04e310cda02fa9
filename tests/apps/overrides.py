"""Declarations the overrides' integration tests run against (`tests.apps.overrides`)."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Workflow


class Call(BaseModel):
    n: int


# One limit for the whole workflow: a partner API that takes four calls at a time.
partner_call = Workflow(name="partnerCall", payload=Call, concurrency=Concurrency(limit=4))

app = App([partner_call])
