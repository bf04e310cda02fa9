"""cancelOn: stop live work when a correlated event arrives (SPEC.md section 3).

An event is not keyed by run, so it cannot be co-partitioned with the runs it cancels.
The correlator therefore works in two steps, both on the exactly-once runtime
(docs/decisions/cancelon-correlator.md):

1. **Decode and fan out.** The stage consumes each declared event topic
   (`<namespace>events.<event>`). An event is decoded with each declaring workflow's
   schema; one that does not decode for a workflow is dead-lettered with a `rejected`
   ledger row and never matched for it. An event that decoded becomes a `CancelSweep`
   sent to every partition of `sg.stage.cancelon` and of each stage holding queued
   starts (`QUEUE_STAGES`).
2. **Judge per partition.** Partition p of `sg.stage.cancelon` shares its task with
   partition p of `sg.runs` (both keyed by execution id), from which the stage keeps its
   own table of the live runs of declaring workflows. A sweep cancels each live run that
   started at or before the event (and within `within` of it) and whose payload matches,
   with an `EngineCommand(cancel)` and a `cancelled` ledger row about the run. Each
   queue stage discards its queued starts that match the same way (`queued_reason`,
   `discard`).

A run row can be read after the sweep that should have cancelled it (two topics, no
order between them), so a sweep is kept for `SWEEP_GRACE_MS` and a run first seen in
that time is judged against it. The command id names the event's position and the run,
and a run is cancelled at most once, so a replayed cycle asks for nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluicegate.declare import App, CancelOn, Workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    CancelSweep,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Outcome,
    PendingStart,
    RunRow,
)
from sluicegate.streams.decisions import describe_invalid, record_decision, reject
from sluicegate.streams.payloads import Payloads, validate
from sluicegate.streams.routing import Router
from sluicegate.streams.stage import InputRecord, Stage, StageContext
from sluicegate.streams.stages.runs import LIVE
from sluicegate.streams.timers import STATE_PREFIX
from sluicegate.topology.topics import Topics

NAME = "cancelon"
# How long a sweep waits for run rows still on their way from the runs stage.
SWEEP_GRACE_MS = 10 * 60_000
# The stages that hold queued starts and accept a sweep on their own topic.
QUEUE_STAGES = ("defer", "throttle", "concurrency", "pause", "identity")

# -- the pure core -------------------------------------------------------------------


def in_window(started_at_ms: int, event_at_ms: int, within_ms: int | None) -> bool:
    """Whether a run (or queued start) that began at `started_at_ms` is one the event may
    cancel: never one that began after the event; with `within`, only one that began no
    more than `within` before it."""
    if started_at_ms > event_at_ms:
        return False
    return within_ms is None or event_at_ms - started_at_ms <= within_ms


def entries_for(wf: Workflow, event: str) -> tuple[CancelOn, ...]:
    return tuple(entry for entry in wf.cancel_on if entry.event == event)


def decode_event(entry: CancelOn, body: bytes | None) -> Any:
    """The event as its declared schema reads it; raises ValueError saying why not."""
    if body is None:
        raise ValueError("no value (a tombstone)")
    try:
        validate(entry.schema_, body)
        return json.loads(body)
    except ValueError as exc:  # pydantic's ValidationError is one
        raise ValueError(describe_invalid(exc)) from exc


def cancel_reason(wf: Workflow, event: str, data: Any, event_at_ms: int, started_at_ms: int,
                  payload: Any) -> str | None:
    """The reason of the first of `wf`'s cancelOn entries for `event` that cancels a run
    of `payload` that began at `started_at_ms`, or None when none does."""
    for entry in entries_for(wf, event):
        if not in_window(started_at_ms, event_at_ms, entry.within_ms):
            continue
        if entry.match_expr.matches({"event": data, "payload": payload}):
            return entry.cancel_reason
    return None


def queued_reason(app: App, sweep: CancelSweep, workflow: str, arrived_at_ms: int,
                  payload: bytes) -> str | None:
    """For a stage holding queued starts: why the sweep discards this one (it arrived, by
    the workers' clock, at `arrived_at_ms`), or None."""
    wf = app.get(workflow)
    if wf is None or workflow not in sweep.workflows:
        return None
    return cancel_reason(wf, sweep.event, json.loads(sweep.body), sweep.event_at_ms,
                         arrived_at_ms, Payloads.of(app.settings).open(payload))


def discard(ctx: StageContext, router: Router, start: PendingStart, sweep: CancelSweep,
            reason: str, key: str | None) -> None:
    """A queued start the sweep discards: `cancelled` with the reason, and the holds it
    took on its way given back. No onFailure: a cancel is not a failure."""
    router.decide(ctx, start, Outcome.cancelled, key=key,
                  reason=f"{reason}: event {sweep.event!r} at {sweep.source} matched the "
                         "queued start")
    router.give_back(ctx, start, reason)


@dataclass(frozen=True, slots=True)
class Decoded:
    """One event judged against every workflow declaring it."""

    workflows: list[str]  # those whose schema decoded it
    problems: list[tuple[str, str]]  # (workflow, why) for those whose schema did not


def decode_for(app: App, event: str, body: bytes | None) -> Decoded:
    ok: list[str] = []
    problems: list[tuple[str, str]] = []
    for wf in app.workflows.values():
        entries = entries_for(wf, event)
        if not entries:
            continue
        errors = []
        for entry in entries:
            try:
                decode_event(entry, body)
            except ValueError as exc:
                errors.append(str(exc))
        if errors:
            problems.append((wf.name, "; ".join(errors)))
        else:
            ok.append(wf.name)
    return Decoded(sorted(ok), problems)


# -- the stage -----------------------------------------------------------------------

# Store rows: a live run (`_LIVE workflow \x1f execution id` -> RunRow), a run already
# cancelled (`_SENT execution id`), a sweep kept for late run rows (`_SWEEP source`).
_LIVE = STATE_PREFIX + b"L"
_SENT = STATE_PREFIX + b"C"
_SWEEP = STATE_PREFIX + b"S"
_FORGET = b"S"  # timer kind: a kept sweep's grace is over


def _live_key(workflow: str, execution_id: str) -> bytes:
    return _LIVE + workflow.encode() + b"\x1f" + execution_id.encode()


class CancelOnStage(Stage):
    name = NAME

    def __init__(self, app: App) -> None:
        self.app = app
        self.events = sorted({entry.event for wf in app.workflows.values()
                              for entry in wf.cancel_on})
        self.declaring = {wf.name for wf in app.workflows.values() if wf.cancel_on}

    def inputs(self, topics: Topics) -> tuple[str, ...]:
        if not self.events:
            return ()
        return (*(topics.event(e) for e in self.events), topics.stage(NAME), topics.runs)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.topic == ctx.topics.runs:
            self._run_row(ctx, record)
        elif record.topic == ctx.topics.stage(NAME):
            try:
                sweep = codec.decode(CancelSweep, record.value)
            except codec.DecodeError as exc:
                reject(ctx, record, f"not a cancelOn sweep: {exc}")
                return
            self._sweep(ctx, sweep)
        else:
            self._event(ctx, record)

    # -- step 1: an event ----------------------------------------------------------------

    def _event(self, ctx: StageContext, record: InputRecord) -> None:
        event = next(e for e in self.events if ctx.topics.event(e) == record.topic)
        decoded = decode_for(self.app, event, record.value)
        if decoded.problems:
            # Cancelling on an event nobody could read is cancelling blind (seed 000).
            why = " | ".join(f"workflow {wf}: {error}" for wf, error in decoded.problems)
            reject(ctx, record, f"cancelOn event {event!r} does not decode, so it cancels "
                   f"nothing for: {why}",
                   workflow=", ".join(wf for wf, _ in decoded.problems))
        if not decoded.workflows:
            return
        source = f"{record.topic}:{record.partition}:{record.offset}"
        sweep = codec.encode(CancelSweep(
            event=event, body=record.value or b"", event_at_ms=record.timestamp_ms,
            source=source, workflows=decoded.workflows))
        for stage in (NAME, *QUEUE_STAGES):
            for partition in range(ctx.topics.settings.partitions):
                ctx.send(ctx.topics.stage(stage), source.encode(), sweep, partition)

    # -- step 2: a sweep on this partition -----------------------------------------------

    def _sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        data = json.loads(sweep.body)
        for workflow in sweep.workflows:
            for _, raw in list(ctx.store.items(_LIVE + workflow.encode() + b"\x1f")):
                self._judge(ctx, codec.decode(RunRow, raw), sweep, data)
        ctx.store.put(_SWEEP + sweep.source.encode(), codec.encode(sweep))
        ctx.timers.schedule(ctx.now_ms + SWEEP_GRACE_MS, _FORGET + sweep.source.encode())

    def _judge(self, ctx: StageContext, row: RunRow, sweep: CancelSweep, data: Any) -> bool:
        wf = self.app.get(row.workflow)
        if wf is None:
            return False
        reason = cancel_reason(wf, sweep.event, data, sweep.event_at_ms, row.admitted_at_ms,
                               Payloads.of(self.app.settings).open(row.payload))
        if reason is None:
            return False
        self._cancel(ctx, row, sweep, reason)
        return True

    def _cancel(self, ctx: StageContext, row: RunRow, sweep: CancelSweep, reason: str) -> None:
        now = ctx.now_ms
        ctx.send(ctx.topics.commands, row.execution_id.encode(), codec.encode(EngineCommand(
            command_id=f"cancelOn:{sweep.source}:{row.execution_id}",
            execution_id=row.execution_id, workflow=row.workflow, kind=CommandKind.cancel,
            issued_at_ms=now, reason=reason)))
        # A row about the run (not a request), as the runs stage writes its backstops.
        record_decision(ctx, LedgerRecord(
            request_id=f"run:{row.execution_id}:cancelOn:{sweep.source}",
            workflow=row.workflow, outcome=Outcome.cancelled,
            requested_at_ms=row.admitted_at_ms, decided_at_ms=now,
            waited_ms=max(0, now - row.admitted_at_ms), stage=NAME,
            reason=f"{reason}: event {sweep.event!r} at {sweep.source} matched the run",
            execution_id=row.execution_id, declaration_version=row.declaration_version,
        ), None)
        ctx.store.delete(_live_key(row.workflow, row.execution_id))
        ctx.store.put(_SENT + row.execution_id.encode(), b"")

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if key.startswith(_FORGET):
            ctx.store.delete(_SWEEP + key[len(_FORGET):])

    # -- the live runs of this partition -------------------------------------------------

    def _run_row(self, ctx: StageContext, record: InputRecord) -> None:
        if record.value is None:
            return
        try:
            row = codec.decode(RunRow, record.value)
        except codec.DecodeError as exc:
            reject(ctx, record, f"not a run row: {exc}")
            return
        if row.workflow not in self.declaring:
            return
        live, sent = _live_key(row.workflow, row.execution_id), _SENT + row.execution_id.encode()
        if row.status not in LIVE:
            ctx.store.delete(live)
            ctx.store.delete(sent)
            return
        if ctx.store.get(sent) is not None or ctx.store.get(live) is not None:
            return  # already known (or already cancelled): its start time does not change
        for _, raw in list(ctx.store.items(_SWEEP)):
            sweep = codec.decode(CancelSweep, raw)
            if row.workflow in sweep.workflows and self._judge(
                    ctx, row, sweep, json.loads(sweep.body)):
                return
        ctx.store.put(live, record.value)
