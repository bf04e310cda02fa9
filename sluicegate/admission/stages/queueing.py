"""What every stage where starts wait shares (defer, throttle, concurrency, pause): its topic
carries pending starts, cancelOn sweeps and, for a stage that hands out slots, their
releases. Each record is decoded once (or taken as handed over in-process) and goes to its
handler; a sweep is kept first, so a start still on its way when it passed is judged on
arrival (docs/decisions/cancelon-correlator.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.admission import pending
from sluicegate.admission.decisions import reject
from sluicegate.admission.routing import ControlStage
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.engine.stage import InputRecord, StoreReader
from sluicegate.engine.tables import TableSpec
from sluicegate.schemas import codec
from sluicegate.schemas.records import CancelSweep, PendingStart, Record, Release


class QueueStage(ControlStage):
    # What the stage's topic carries, in the order decoding tries them, and how a record
    # that is none of them is described in its dead letter.
    carries: tuple[type[Record], ...] = (PendingStart, CancelSweep)
    expects = "a pending start"
    tables: tuple[TableSpec[Any, Any], ...] = (*pending.TABLES, *cancelon.KEPT_TABLES)
    # Its queues' bookkeeping follows from their rows (admission/pending.py).
    derived: tuple[bytes, ...] = pending.DERIVED

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        return pending.derive(store)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        message = record.message
        if message is None or message.__class__ not in self.carries:
            if record.value is None:
                reject(ctx, record, f"empty record: {self.expects} needs a value")
                return
            try:
                message = codec.decode_one_of(self.carries, record.value)
            except codec.DecodeError as exc:
                reject(ctx, record, f"not {self.expects}: {exc}")
                return
        if isinstance(message, PendingStart):
            self.on_start(ctx, record, message)
        elif isinstance(message, CancelSweep):
            cancelon.keep(ctx, message)
            self.on_sweep(ctx, message)
        elif isinstance(message, Release):
            self.on_release(ctx, message)

    def on_start(self, ctx: StageContext, record: InputRecord, start: PendingStart) -> None:
        """A start reaching this stage: it waits here, or goes on."""
        raise NotImplementedError

    def on_sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn: discard the starts waiting here that match the event."""
        raise NotImplementedError

    def on_release(self, ctx: StageContext, release: Release) -> None:
        """A run gave back what it held here (only a stage whose topic carries them)."""
        raise NotImplementedError
