"""The declarations `bench.memory` runs: state that piles up and never leaves on its own.

- `benchDebounce`: every start has a debounce key of its own (its `orderId`) and a quiet
  time of a day, so each parks one pending group that fires long after the run ends;
- `benchQueued`: at most one run in flight per `customer` (977 of them in the bench's
  input) and nothing ever completes a run, so all but each customer's first start wait in
  the concurrency queue (the slots' lease is a week: none is freed during the run).
"""

from bench.apps import Order
from sluicegate.declare import App, Concurrency, Debounce, Workflow

DEBOUNCE = "benchDebounce"
QUEUED = "benchQueued"

debounced = Workflow(name=DEBOUNCE, payload=Order,
                     debounce=Debounce(key="orderId", period="1 day"))
queued = Workflow(name=QUEUED, payload=Order,
                  concurrency=Concurrency(limit=1, key="customer", lease="1 week"))

app = App([debounced, queued])
