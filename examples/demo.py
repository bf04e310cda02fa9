"""The demo app: what `make demo` runs. A few workflows that each declare one control, the
reference engine's functions for them, and traffic that makes every control decide
something you can watch: `existing` repeats, `collapsed` edits, `dropped` alerts, and
reports `queued` behind a concurrency limit until a slot frees."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from pydantic import BaseModel

from sluicegate.client import Client
from sluicegate.declare import App, Concurrency, Debounce, RateLimit, Workflow


class Order(BaseModel):
    orderId: str
    customer: str
    amount: float


class Edit(BaseModel):
    documentId: str
    revision: int


class LowStock(BaseModel):
    productId: str


class Report(BaseModel):
    accountId: str
    plan: str


class Signup(BaseModel):
    userId: str
    email: str


app = App([
    # One receipt per order, however many `paid` events arrive for it.
    Workflow(name="sendReceipt", payload=Order, idempotency="orderId"),
    # Index a document once it has had no edits for 3 seconds, with the last edit.
    Workflow(name="indexDocument", payload=Edit,
             debounce=Debounce(key="documentId", period="3s", timeout="20s")),
    # At most one alert per product every 30 seconds; the rest are dropped, on the record.
    Workflow(name="lowStockAlert", payload=LowStock,
             rate_limit=RateLimit(limit=1, period="30s", key="productId")),
    # Two reports at a time; enterprise accounts go first out of the queue.
    Workflow(name="generateReport", payload=Report, concurrency=Concurrency(limit=2),
             priority="plan == 'enterprise' ? 100 : 0"),
    # No controls at all: the passthrough.
    Workflow(name="welcomeEmail", payload=Signup),
])


def _work(seconds: float) -> Any:
    def run(payload: dict[str, Any]) -> None:
        time.sleep(seconds)
    return run


FUNCTIONS = {
    "sendReceipt": _work(0.05),
    "indexDocument": _work(0.1),
    "lowStockAlert": _work(0.01),
    "generateReport": _work(2.5),
    "welcomeEmail": _work(0.02),
}


def traffic(client: Client, stop: threading.Event, per_second: float = 3.0) -> None:
    rng = random.Random(7)
    n = 0
    while not stop.wait(1.0 / per_second):
        n += 1
        pick = rng.random()
        if pick < 0.3:
            client.start("sendReceipt", Order(orderId=f"o{rng.randrange(40)}",
                                              customer=f"c{rng.randrange(5)}",
                                              amount=round(rng.uniform(5, 200), 2)))
        elif pick < 0.55:
            client.start("indexDocument", Edit(documentId=f"doc{rng.randrange(3)}", revision=n))
        elif pick < 0.7:
            client.start("lowStockAlert", LowStock(productId=f"p{rng.randrange(3)}"))
        elif pick < 0.85:
            plan = "enterprise" if rng.random() < 0.3 else "free"
            client.start("generateReport", Report(accountId=f"a{rng.randrange(9)}", plan=plan))
        else:
            client.start("welcomeEmail", Signup(userId=f"u{n}", email=f"u{n}@example.com"))
