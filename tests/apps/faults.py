"""Declarations the fault suite runs against (tests/faults): one workflow of each kind of
path a start can take, so every fault meets starts on every path at once."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Debounce, RateLimit, Workflow


class Order(BaseModel):
    orderId: str
    amount: int


class Note(BaseModel):
    text: str


class Job(BaseModel):
    account: str
    n: int


class Edit(BaseModel):
    doc: str
    n: int


class Alert(BaseModel):
    product: str


# The passthrough, and identity's state: one run per order.
note = Workflow(name="note", payload=Note)
receipt = Workflow(name="sendReceipt", payload=Order, idempotency="orderId")
# Gated: at most GATE_LIMIT runs in flight per account; the excess queues in the
# concurrency stage until an engine reports runs ended.
GATE_LIMIT = 3
gated = Workflow(name="gated", payload=Job,
                 concurrency=Concurrency(limit=GATE_LIMIT, key="account"))
# Parked in the defer stage until a quiet second has passed.
edit = Workflow(name="indexDocument", payload=Edit,
                debounce=Debounce(key="doc", period="1s", timeout="5s"))
# Dropped past one per hour per product.
alert = Workflow(name="lowStockAlert", payload=Alert,
                 rate_limit=RateLimit(limit=1, period="1h", key="product"))

# One run at a time per account: the stale-store tests (tests/faults/test_stale_state.py)
# watch a holder and its queue move between workers.
one = Workflow(name="oneAtATime", payload=Job,
               concurrency=Concurrency(limit=1, key="account"))

app = App([note, receipt, gated, edit, alert, one])
