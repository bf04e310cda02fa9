"""Declarations the runtime's integration tests run against."""

from pydantic import BaseModel

from sluicegate.declare import App, Idempotency, Workflow


class Paid(BaseModel):
    orderId: str
    amount: int


class Note(BaseModel):
    text: str


# One run per order (seed 003's send-receipt), and a workflow with no controls at all.
receipt = Workflow(name="sendReceipt", payload=Paid, idempotency="orderId")
note = Workflow(name="note", payload=Note)

app = App([receipt, note])


class Job(BaseModel):
    jobId: str


# Seed 003's window: a key is kept while its run is live and `ttl` after it ends.
windowed = Workflow(name="windowed", payload=Job,
                    idempotency=Idempotency(key="jobId", ttl="1 hour"))

app_with_ttl = App([receipt, note, windowed])
