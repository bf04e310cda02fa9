"""Runs: each admitted run's lifecycle, the `sg.runs` table, and the releases of its holds.

Keyed by execution id, fed by `sg.admitted` and `sg.run-events` (co-partitioned). When
the engine reports that a run ended, every slot the run holds (a concurrency slot, a
singleton hold, an identity key with a ttl) is released on the partition that owns it;
when it reports `suspended`, concurrency slots are offered back (a steps-mode limit
frees them), and a `resumed` run in steps mode asks its concurrency hop to re-admit it.
"""

from __future__ import annotations

import dataclasses
import json

from sluicegate.declare import App
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    Origin,
    PendingStart,
    Release,
    ReleaseKind,
    RunEvent,
    RunEventKind,
    RunRow,
    RunStatus,
)
from sluicegate.streams.decisions import reject
from sluicegate.streams.routing import Router
from sluicegate.streams.stage import InputRecord, Stage, StageContext
from sluicegate.streams.timers import STATE_PREFIX
from sluicegate.topology.topics import Topics

NAME = "runs"
_RUN = STATE_PREFIX + b"R"
_EARLY = STATE_PREFIX + b"E"

ENDED = {RunStatus.completed, RunStatus.failed, RunStatus.cancelled}
LIVE = {RunStatus.admitted, RunStatus.running, RunStatus.suspended}

_STATUS_OF = {
    RunEventKind.started: RunStatus.running,
    RunEventKind.suspended: RunStatus.suspended,
    RunEventKind.completed: RunStatus.completed,
    RunEventKind.failed: RunStatus.failed,
    RunEventKind.cancelled: RunStatus.cancelled,
}

# -- the pure core -------------------------------------------------------------------


def admitted_row(admitted: AdmittedStart) -> RunRow:
    return RunRow(
        execution_id=admitted.execution_id, workflow=admitted.workflow,
        status=RunStatus.admitted, payload=admitted.payload,
        declaration_version=admitted.declaration_version,
        admitted_at_ms=admitted.admitted_at_ms, updated_at_ms=admitted.admitted_at_ms,
        slots=list(admitted.slots), keys={slot.stage: slot.key for slot in admitted.slots},
    )


def apply_event(row: RunRow, event: RunEvent) -> RunRow:
    """The run row after an engine report; an ended run does not change again."""
    if row.status in ENDED:
        return row
    status = _STATUS_OF.get(event.kind, row.status)
    if event.kind is RunEventKind.resumed:
        status = RunStatus.running
    return dataclasses.replace(
        row, status=status, updated_at_ms=event.at_ms,
        ended_at_ms=event.at_ms if status in ENDED else None,
        last_reason=event.reason or event.error_message or row.last_reason,
        retries_spent=event.retries_spent if event.retries_spent is not None
        else row.retries_spent,
        run_id=event.run_id or row.run_id,
    )


# -- the stage -----------------------------------------------------------------------


class RunsStage(Stage):
    name = NAME

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router

    def inputs(self, topics: Topics) -> tuple[str, ...]:
        return (topics.admitted, topics.run_events)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.topic == ctx.topics.admitted:
            try:
                admitted = codec.decode(AdmittedStart, record.value)
            except codec.DecodeError as exc:
                reject(ctx, record, f"not an admitted start: {exc}")
                return
            self._admitted(ctx, admitted)
            return
        try:
            event = codec.decode(RunEvent, record.value)
        except codec.DecodeError as exc:
            reject(ctx, record, f"not a run event: {exc}")
            return
        row = self.load(ctx, event.execution_id)
        if row is None:
            # The engine's report can be read before the admitted record (two topics):
            # keep it until the run's row exists.
            ctx.store.put(_EARLY + event.execution_id.encode() + b"\x1f"
                          + str(record.offset).encode().rjust(20, b"0"), record.value or b"")
            return
        self._event(ctx, row, event)

    @staticmethod
    def load(ctx: StageContext, execution_id: str) -> RunRow | None:
        raw = ctx.store.get(_RUN + execution_id.encode())
        return codec.decode(RunRow, raw) if raw is not None else None

    def save(self, ctx: StageContext, row: RunRow) -> None:
        value = codec.encode(row)
        ctx.store.put(_RUN + row.execution_id.encode(), value)
        ctx.send(ctx.topics.runs, row.execution_id.encode(), value)

    def _admitted(self, ctx: StageContext, admitted: AdmittedStart) -> None:
        row = self.load(ctx, admitted.execution_id)
        if admitted.kind is AdmittedKind.resume:
            if row is None:
                return
            held = {(s.stage, s.key) for s in row.slots}
            slots = [*row.slots, *(s for s in admitted.slots if (s.stage, s.key) not in held)]
            self.save(ctx, dataclasses.replace(row, status=RunStatus.running, slots=slots,
                                               updated_at_ms=admitted.admitted_at_ms))
            return
        if row is not None:
            return
        row = admitted_row(admitted)
        self.save(ctx, row)
        early = _EARLY + admitted.execution_id.encode() + b"\x1f"
        for key, value in list(ctx.store.items(early)):
            ctx.store.delete(key)
            current = self.load(ctx, admitted.execution_id)
            assert current is not None
            self._event(ctx, current, codec.decode(RunEvent, value))

    def _event(self, ctx: StageContext, row: RunRow, event: RunEvent) -> None:
        if row.status in ENDED:
            return
        if event.kind is RunEventKind.heartbeat:
            self.heartbeat(ctx, row, event)
            return
        updated = apply_event(row, event)
        if event.kind is RunEventKind.resumed and self._needs_readmission(row):
            self._ask_readmission(ctx, row)
            return
        self.save(ctx, updated)
        if updated.status in ENDED:
            self.release(ctx, updated, ReleaseKind.ended, updated.last_reason)
            self.ended(ctx, updated, event)
        elif updated.status is RunStatus.suspended:
            self.release(ctx, updated, ReleaseKind.suspended, event.reason,
                         stages={"concurrency"})

    # -- hooks for the lease, finish timeout and onFailure ------------------------------

    def heartbeat(self, ctx: StageContext, row: RunRow, event: RunEvent) -> None:
        """A live run says it is alive (extends its slot leases)."""

    def ended(self, ctx: StageContext, row: RunRow, event: RunEvent | None) -> None:
        """The run ended (onFailure is started from here for a failed run)."""

    # -- releases ------------------------------------------------------------------------

    def release(self, ctx: StageContext, row: RunRow, kind: ReleaseKind, reason: str | None,
                stages: set[str] | None = None) -> None:
        for slot in row.slots:
            if stages is not None and slot.stage not in stages:
                continue
            ctx.send(ctx.topics.stage(slot.stage), slot.key.encode(), codec.encode(Release(
                stage=slot.stage, key=slot.key, execution_id=row.execution_id,
                workflow=row.workflow, kind=kind, at_ms=ctx.now_ms, reason=reason,
            )))

    def _needs_readmission(self, row: RunRow) -> bool:
        wf = self.app.get(row.workflow)
        return wf is not None and any(limit.mode == "steps" for limit in wf.concurrency)

    def _ask_readmission(self, ctx: StageContext, row: RunRow) -> None:
        """A steps-mode run must be re-admitted before it resumes (seed 003)."""
        wf = self.app.get(row.workflow)
        route = self.router.routes.get(row.workflow)
        if wf is None or route is None:
            return
        first = next(i for i, hop in enumerate(route.hops) if hop.stage == "concurrency")
        kept = [s for s in row.slots if s.stage != "concurrency"]
        resume = PendingStart(
            execution_id=row.execution_id, workflow=row.workflow, payload=row.payload,
            origin=Origin.event, kind=AdmittedKind.resume,
            declaration_version=row.declaration_version, hop=first - 1,
            request_id=f"resume:{row.execution_id}", request_ids=[],
            requested_at_ms=ctx.now_ms, arrived_at_ms=ctx.now_ms,
            priority=wf.priority.value(json.loads(row.payload)) if wf.priority else 0.0,
            slots=kept,
        )
        self.save(ctx, dataclasses.replace(row, slots=kept, updated_at_ms=ctx.now_ms))
        self.router.forward(ctx, resume)

