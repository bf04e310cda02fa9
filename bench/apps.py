"""The declarations the benchmarks run: one workflow with no controls (the passthrough)."""

from pydantic import BaseModel

from sluicegate.declare import App, Workflow


class Order(BaseModel):
    orderId: str
    customer: str
    amount: int
    note: str = ""


WORKFLOW = "benchPassthrough"

# No controls and no idempotency key: identity admits it on the spot.
passthrough = Workflow(name=WORKFLOW, payload=Order)

app = App([passthrough])
