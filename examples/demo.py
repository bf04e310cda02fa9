"""The demo app: what `make demo` runs. Two workflows, a reference engine's functions for
them, and traffic that repeats some orders so the ledger shows `existing` answers."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from pydantic import BaseModel

from sluicegate.client import Client
from sluicegate.declare import App, Workflow


class Order(BaseModel):
    orderId: str
    customer: str
    amount: float


class Signup(BaseModel):
    userId: str
    email: str


# One receipt per order, however many `paid` events arrive for it (seed 003's example).
send_receipt = Workflow(name="sendReceipt", payload=Order, idempotency="orderId")
# No controls at all: the passthrough.
welcome_email = Workflow(name="welcomeEmail", payload=Signup)

app = App([send_receipt, welcome_email])


def _send_receipt(payload: dict[str, Any]) -> None:
    time.sleep(0.05)


def _welcome_email(payload: dict[str, Any]) -> None:
    time.sleep(0.02)
    if payload["userId"].endswith("13"):
        raise RuntimeError("mail server said no")


FUNCTIONS = {"sendReceipt": _send_receipt, "welcomeEmail": _welcome_email}


def traffic(client: Client, stop: threading.Event, per_second: float = 3.0) -> None:
    """Orders from a small pool of ids, so repeats (and their `existing` answers) happen."""
    rng = random.Random(7)
    n = 0
    while not stop.wait(1.0 / per_second):
        n += 1
        if rng.random() < 0.7:
            order = Order(orderId=f"o{rng.randrange(40)}", customer=f"c{rng.randrange(5)}",
                          amount=round(rng.uniform(5, 200), 2))
            client.start("sendReceipt", order)
        else:
            client.start("welcomeEmail", Signup(userId=f"u{n}", email=f"u{n}@example.com"))
