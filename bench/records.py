"""The input every benchmark uses: StartRequests encoded exactly as the SDK encodes them."""

from __future__ import annotations

import time
from pathlib import Path

from sluicegate.admission.app import node
from sluicegate.admission.decisions import dead_letter
from sluicegate.admission.routing import Router
from sluicegate.admission.stage import AdmissionStage
from sluicegate.admission.stages.identity import IdentityStage
from sluicegate.admission.stages.runs import RunsStage, admitted_row
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.stage import Headers, InputRecord, StageContext
from sluicegate.engine.store import PartitionStore, StoreTransaction
from sluicegate.engine.timers import Timers
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedStart
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

    def make_payload(self, workflow: str, data: dict[str, object]) -> bytes:
        """The encoded StartRequest of `workflow` with this payload."""
        start, _key = self._builder.build(workflow, data)
        return codec.encode(start)


def make_starts(app: App, workflow: str, n: int, note_bytes: int = 0,
                first: int = 0) -> list[tuple[bytes, bytes]]:
    maker = StartMaker(app)
    return [maker.make(workflow, first + i, note_bytes) for i in range(n)]


class InMemoryStage:
    """One of the worker's stages run in memory, without a broker: sends are collected as
    (topic, value), or handed over to the stage `hand_over` names for their topic, as the
    worker does (`Node.handed_over`); a stateful stage gets a real store (RocksDB in
    `state_dir`), committed when the caller says, as the runtime would."""

    def __init__(self, stage: AdmissionStage, settings: Settings | None = None,
                 state_dir: Path | None = None) -> None:
        settings = settings or Settings(namespace="bench.")
        self.topics = Topics(settings)
        self.stage = stage
        self.sent: list[tuple[str, bytes | None]] = []
        self.hand_over: dict[str, InMemoryStage] = {}
        self.tx: StoreTransaction | None = None
        timers = None
        if state_dir is not None:
            self.tx = StoreTransaction(PartitionStore(state_dir / stage.name))
            timers = Timers(self.tx)

        def send(topic: str, key: bytes | None, value: bytes | None,
                 partition: int | None = None, headers: Headers | None = None,
                 message: object | None = None) -> None:
            to = self.hand_over.get(topic)
            if to is None:
                self.sent.append((topic, value))
            else:
                to.stage.process(to.ctx, InputRecord(topic, 0, -1, key, value, 0, headers,
                                                     message))

        self.ctx = StageContext(stage.name, 0, self.topics, self.tx, timers, send,
                                lambda: int(time.time() * 1000), dead_letter)

    def records(self, topic: str, values: list[bytes]) -> list[InputRecord]:
        return [InputRecord(topic, 0, i, None, v, 0) for i, v in enumerate(values)]

    def commit(self) -> None:
        """What the runtime does at commit: each store write to its log (the changelog, or
        the topic of a table the stage publishes), then the store."""
        if self.tx is None:
            return
        tables = node(self.stage, self.topics).tables
        for key, value in self.tx.changes.items():
            topic = next((t.topic for t in tables if key.startswith(t.prefix)), "changelog")
            self.sent.append((topic, value))
        self.tx.commit(self.tx.store.changelog_offset + 1,
                       {t.name: self.tx.store.table_offset(t.name) + 1 for t in tables})


def in_memory_identity(app: App) -> InMemoryStage:
    """The identity stage of `app` (no pause table: that would need a broker)."""
    return InMemoryStage(IdentityStage(app, Settings().partitions, Router(app, 0, None),
                                       Settings().max_payload_bytes))


def in_memory_runs(app: App, state_dir: Path) -> InMemoryStage:
    return InMemoryStage(RunsStage(app, Router(app, 0, None)), state_dir=state_dir)


def admission_sizes(app: App, workflow: str, note_bytes: int = 0) -> dict[str, int]:
    """The value sizes of what the worker writes for one passthrough start: its admitted
    record, its ledger row and its runs-table row."""
    identity = in_memory_identity(app)
    _key, value = StartMaker(app).make(workflow, 0, note_bytes)
    identity.stage.process(identity.ctx, identity.records(identity.topics.starts, [value])[0])
    out = {topic: raw for topic, raw in identity.sent if raw is not None}
    admitted = out[identity.topics.admitted]
    row = admitted_row(codec.decode(AdmittedStart, admitted))
    return {"admitted": len(admitted), "ledger": len(out[identity.topics.ledger]),
            "runs": len(codec.encode(row))}
