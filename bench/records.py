"""The input every benchmark uses: StartRequests encoded exactly as the SDK encodes them."""

from __future__ import annotations

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.schemas import codec
from sluicegate.testing import TestDriver


def payload(i: int, note_bytes: int = 0) -> dict[str, object]:
    return {"orderId": f"order-{i:09d}", "customer": f"customer-{i % 977:05d}",
            "amount": (i * 37) % 100_000, "note": "x" * note_bytes}


class StartMaker:
    """Builds (key, value) pairs through the SDK's own request builder (validation, ids,
    `requested_at_ms`, the key choice and the codec), without producing them."""

    def __init__(self, app: App, settings: Settings | None = None) -> None:
        self._builder = StartBuilder(app, settings or Settings())

    def make(self, workflow: str, i: int, note_bytes: int = 0) -> tuple[bytes, bytes]:
        start, key = self._builder.build(workflow, payload(i, note_bytes))
        return key, codec.encode(start)

    def make_payload(self, workflow: str, data: dict[str, object]) -> bytes:
        """The encoded StartRequest of `workflow` with this payload."""
        start, _key = self._builder.build(workflow, data)
        return codec.encode(start)


def make_starts(app: App, workflow: str, n: int, note_bytes: int = 0,
                first: int = 0) -> list[tuple[bytes, bytes]]:
    maker = StartMaker(app)
    return [maker.make(workflow, first + i, note_bytes) for i in range(n)]


def admission_sizes(app: App, workflow: str, note_bytes: int = 0) -> dict[str, int]:
    """The value sizes of what the worker writes for one passthrough start: its admitted
    record, its ledger row and its runs-table row (the test driver's, once committed)."""
    with TestDriver(app, stages=("identity", "runs")) as driver:
        key, value = StartMaker(app).make(workflow, 0, note_bytes)
        driver.pipe(driver.topics.starts, value, key)
        driver.commit()
        sizes = {name: [len(w.value or b"") for w in driver.sent(topic)]
                 for name, topic in (("admitted", driver.topics.admitted),
                                     ("ledger", driver.topics.ledger),
                                     ("runs", driver.topics.runs))}
    return {name: size for name, (size,) in sizes.items()}
