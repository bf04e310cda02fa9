"""The input every benchmark uses: StartRequests encoded exactly as the SDK encodes them."""

from __future__ import annotations

import time

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedStart
from sluicegate.streams.routing import Router
from sluicegate.streams.stage import InputRecord, StageContext
from sluicegate.streams.stages.identity import IdentityStage
from sluicegate.streams.stages.runs import admitted_row
from sluicegate.topology.topics import Topics


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


def make_starts(app: App, workflow: str, n: int, note_bytes: int = 0,
                first: int = 0) -> list[tuple[bytes, bytes]]:
    maker = StartMaker(app)
    return [maker.make(workflow, first + i, note_bytes) for i in range(n)]


class InMemoryIdentity:
    """The worker's identity stage run in memory: no broker, no store (the benchmark's
    workflow has no idempotency key), and sends collected as (topic, value)."""

    def __init__(self, app: App, settings: Settings | None = None) -> None:
        settings = settings or Settings(namespace="bench.")
        self.topics = Topics(settings)
        # No pause table: that would need a broker.
        self.stage = IdentityStage(app, settings.partitions, Router(app, 0, None))
        self.sent: list[tuple[str, bytes | None]] = []

        def send(topic: str, key: bytes | None, value: bytes | None,
                 partition: int | None) -> None:
            self.sent.append((topic, value))

        self.ctx = StageContext(self.stage.name, 0, self.topics, None, None, send,
                                lambda: int(time.time() * 1000))

    def records(self, values: list[bytes]) -> list[InputRecord]:
        return [InputRecord(self.topics.starts, 0, i, None, v, 0) for i, v in enumerate(values)]


def admission_sizes(app: App, workflow: str, note_bytes: int = 0) -> dict[str, int]:
    """The value sizes of what the worker writes for one passthrough start: its admitted
    record, its ledger row and its runs-table row."""
    identity = InMemoryIdentity(app)
    _key, value = StartMaker(app).make(workflow, 0, note_bytes)
    identity.stage.process(identity.ctx, identity.records([value])[0])
    out = {topic: raw for topic, raw in identity.sent if raw is not None}
    admitted = out[identity.topics.admitted]
    row = admitted_row(codec.decode(AdmittedStart, admitted))
    return {"admitted": len(admitted), "ledger": len(out[identity.topics.ledger]),
            "runs": len(codec.encode(row))}
