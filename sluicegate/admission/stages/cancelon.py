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

A start can likewise be on its way between two stages when the sweep passes both, so
every queue stage keeps the sweeps it took for the same time (`keep`) and judges each
start that reaches it then against them (`discard_on_arrival`), whether it would wait
there or go straight on. A group defer let go is judged by defer's rules wherever it is
(a debounced group by its latest arrival, a batch item by item: `group_reason`), from a
record header defer gives it (`Group`), which goes on with it through every later stage
and queue (docs/decisions/cancelon-in-transit.md).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sluicegate.admission.decisions import describe_invalid, record_decision, reject
from sluicegate.admission.routing import PAUSE_STAGE, Router
from sluicegate.admission.rows import Avro
from sluicegate.admission.stage import AdmissionStage, StageContext
from sluicegate.declare import App, CancelOn, Workflow
from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.engine.tables import RAW, TEXT, Decimal, Joined, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import Payloads, validate
from sluicegate.schemas.records import (
    LIVE,
    AdmittedKind,
    CancelSweep,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Outcome,
    PendingStart,
    RunRow,
)

NAME = "cancelon"
# How long a sweep waits for run rows still on their way from the runs stage.
SWEEP_GRACE_MS = 10 * 60_000
# The stages that hold queued starts and accept a sweep on their own topic.
QUEUE_STAGES = ("defer", "throttle", "concurrency", "pause", "identity", "singleton")

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


def reason_for(app: App, sweep: CancelSweep, start: PendingStart, *,
               arrived_at_ms: int | None = None, payload: bytes | None = None) -> str | None:
    """`queued_reason` for a start, judged by its own arrival and payload unless told
    otherwise. Never a resume: its run exists, and the correlator cancels runs."""
    if start.kind is not AdmittedKind.start:
        return None
    return queued_reason(app, sweep, start.workflow,
                         start.arrived_at_ms if arrived_at_ms is None else arrived_at_ms,
                         start.payload if payload is None else payload)


# -- a group defer let go: judged by defer's rules wherever it is --------------------

# The record header that carries a `Group` (internal: sluicegate's stage topics only).
GROUP_HEADER = "sluicegate.cancelOn.group"


@dataclass(frozen=True, slots=True)
class Group:
    """What defer's rules read of a group it holds or let go, beyond the start itself: a
    debounced group is judged by its latest arrival (`last_ms`), the one whose payload
    runs; a batch (`batch`) item by item, its items having arrived from `first_ms` to
    `last_ms`. Defer gives it to a group it lets go as a record header, which goes on
    with the group through every later stage, queued or not."""

    batch: bool
    first_ms: int
    last_ms: int

    @classmethod
    def debounced(cls, last_ms: int) -> Group:
        return cls(False, last_ms, last_ms)

    @classmethod
    def batched(cls, arrivals: Iterable[int]) -> Group:
        times = list(arrivals)
        return cls(True, min(times), max(times))

    def headers(self) -> Headers:
        body = {"batch": self.batch, "first_ms": self.first_ms, "last_ms": self.last_ms}
        return [(GROUP_HEADER, json.dumps(body, separators=(",", ":")).encode())]

    @classmethod
    def of(cls, headers: Headers | None) -> Group | None:
        """The group `headers` describe; None when they describe none (or one this
        version cannot read: the group is then defer's alone, as before the header)."""
        if not headers:
            return None
        for name, value in headers:
            if name != GROUP_HEADER or not value:
                continue
            try:
                body = json.loads(value)
                group = cls(bool(body["batch"]), int(body["first_ms"]), int(body["last_ms"]))
            except (ValueError, TypeError, KeyError):
                return None
            return group
        return None


def group_headers(wf: Workflow, group: Group) -> Headers | None:
    """The headers defer gives a group of `wf` it lets go: none for a workflow without
    cancelOn, which pays nothing for it."""
    return group.headers() if wf.cancel_on else None


def group_reason(app: App, sweep: CancelSweep, start: PendingStart, group: Group, *,
                 payload: bytes | None = None) -> str | None:
    """Why `sweep` discards a group by defer's rules, or None. Defer judges the groups it
    holds with it, and every later stage the groups defer let go, arriving or waiting,
    so they all say what defer says.

    - A debounced group: by its latest arrival and the payload that runs.
    - A batch: each item as the batch of one it would be alone (`match` reads the run's
      payload), and the run only when every item is discarded. Defer takes discarded
      items out; a later stage cannot take items out of a run, so it discards the run
      only when defer would have left nothing of it, and never an item defer would have
      let run. An item that arrived after the event keeps the run; `within` holds for
      every item when it holds for the earliest.
    """
    if not group.batch:
        return reason_for(app, sweep, start, arrived_at_ms=group.last_ms, payload=payload)
    wf = app.get(start.workflow)
    if (wf is None or start.kind is not AdmittedKind.start
            or start.workflow not in sweep.workflows or group.last_ms > sweep.event_at_ms):
        return None
    run = Payloads.of(app.settings).open(start.payload if payload is None else payload)
    items = run.get("items") if isinstance(run, dict) else None
    if not isinstance(items, list) or not items:
        return None
    data = json.loads(sweep.body)
    reason = None
    for item in items:
        found = cancel_reason(wf, sweep.event, data, sweep.event_at_ms, group.first_ms,
                              {"items": [item]})
        if found is None:
            return None
        reason = reason or found
    return reason


def judge(app: App, router: Router, stage: str, sweep: CancelSweep, start: PendingStart,
          group: Group | None, *, payload: bytes | None = None) -> str | None:
    """Why `sweep` discards a start waiting at or reaching queue stage `stage`, or None:
    a group defer let go by defer's rules (`group`, from its header); one defer let go
    without that header (sent by a version before it) is left to defer; any other start
    by its own arrival. Every queue stage judges with it, the starts that wait there when
    a sweep comes and the starts that reach it after one, so both paths say the same."""
    if group is not None:
        return group_reason(app, sweep, start, group, payload=payload)
    if let_go_by_defer(router, start, stage):
        return None
    return reason_for(app, sweep, start, payload=payload)


def let_go_by_defer(router: Router, start: PendingStart, stage: str) -> bool:
    """Whether `start` is a group defer let go: a hop of its route it is past is defer's
    (at the pause stage a start's hop is the one it stopped after, elsewhere the one it is
    addressed to)."""
    route = router.routes.get(start.workflow)
    if route is None:
        return False
    done = start.hop + 1 if stage == PAUSE_STAGE else start.hop
    return any(hop.stage == "defer" for hop in route.hops[:done])


def discard(ctx: StageContext, router: Router, start: PendingStart, sweep: CancelSweep,
            reason: str, key: str | None, *, headers: Headers | None = None) -> None:
    """A queued start the sweep discards: `cancelled` with the reason (in the trace among
    its `headers`), and the holds it took on its way given back. No onFailure: a cancel is
    not a failure."""
    router.decide(ctx, start, Outcome.cancelled, key=key,
                  reason=f"{reason}: event {sweep.event!r} at {sweep.source} matched the "
                         "queued start", headers=headers)
    router.give_back(ctx, start, reason)


# -- sweeps kept by the stages: the adapter over a stage's store ------------------------

# cancelOn's tables in the store of every stage that keeps sweeps (`KEPT_TABLES`): a kept
# sweep (source -> CancelSweep) and how many there are (one row, so a stage with none,
# nearly always, knows it from one read); timer `_FORGET source`. Under a 0x00 byte: no
# stage row (a workflow name, a queue letter) starts with one.
KEPT = STATE_PREFIX + b"\x00cancelOn\x1f"
_FORGET = b"\x00cancelOn\x1f"
_SWEEPS = TableSpec("cancelOn.kept", KEPT, TEXT, Avro(CancelSweep))
_COUNT = TableSpec("cancelOn.count", STATE_PREFIX + b"\x00cancelOn#", RAW, Decimal(1))
KEPT_TABLES: tuple[TableSpec[Any, Any], ...] = (_SWEEPS, _COUNT)


def keep(ctx: StageContext, sweep: CancelSweep) -> None:
    """This stage took `sweep`: keep it for `SWEEP_GRACE_MS`, for what reaches the stage
    after it (a run row, a start in transit)."""
    sweeps = ctx.table(_SWEEPS.name)
    if sweep.source in sweeps:
        return
    sweeps.put(sweep.source, sweep)
    count = ctx.table(_COUNT.name)
    count.put(b"", (count.get(b"") or 0) + 1)
    ctx.timers.schedule(ctx.now_ms + SWEEP_GRACE_MS, _FORGET + sweep.source.encode())


def kept(ctx: StageContext) -> list[CancelSweep]:
    if b"" not in ctx.table(_COUNT.name):
        return []
    return [sweep for _, sweep in ctx.table(_SWEEPS.name).items()]


def forgets(key: bytes) -> bool:
    """Whether a timer is a kept sweep's end (every keeping stage's `fire` asks first)."""
    return key.startswith(_FORGET)


def forget(ctx: StageContext, key: bytes) -> bool:
    """Handle a fired timer if it ends a kept sweep's grace; False for any other timer."""
    if not forgets(key):
        return False
    sweeps, count = ctx.table(_SWEEPS.name), ctx.table(_COUNT.name)
    source = key[len(_FORGET):].decode()
    if source not in sweeps:
        return True
    sweeps.delete(source)
    left = (count.get(b"") or 1) - 1
    if left > 0:
        count.put(b"", left)
    else:
        count.delete(b"")
    return True


def discard_on_arrival(ctx: StageContext, app: App, router: Router, start: PendingStart,
                       key: str | None, *, headers: Headers | None = None,
                       payload: bytes | None = None) -> bool:
    """A start reaching a queue stage after sweeps it kept was in transit when they passed:
    judged against each now (`judge`), as if it had been queued here (whether this stage
    would park it or let it through). `headers`: the record's. True when one discards it."""
    wf = app.get(start.workflow)
    if wf is None or not wf.cancel_on:
        return False
    sweeps = kept(ctx)
    if not sweeps:
        return False
    group = Group.of(headers)
    for sweep in sweeps:
        reason = judge(app, router, ctx.stage, sweep, start, group, payload=payload)
        if reason is not None:
            discard(ctx, router, start, sweep, reason, key, headers=headers)
            return True
    return False


# -- what a sweep reads: the starts a stage parks, by workflow ----------------------------

# Derived rows (docs/decisions/cancelon-sweep-bounds.md): the workflow's name (length
# first) + where the stage parked the start (its own key for the row) -> b"". Beside them,
# logged, which workflows the rows are for (a digest of the names of those declaring
# cancelOn), so a store kept across a redeploy is indexed again.
_INDEX = STATE_PREFIX + b"\x00cancelOn@"
_INDEX_TABLE = TableSpec("cancelOn.index", _INDEX, RAW, RAW, derived=True)
_INDEXED = TableSpec("cancelOn.indexed", STATE_PREFIX + b"\x00cancelOn!", RAW, RAW)


def _indexed(workflow: str) -> bytes:
    raw = workflow.encode()
    return struct.pack(">H", len(raw)) + raw


class SweepIndex:
    """Where a stage parked each start of a workflow that declares cancelOn, so that a
    sweep reads the parked starts of the workflows it names and no others: flat in the
    starts of every other workflow. The rows are derived (a stage lists `DERIVED` among
    its `derived` and makes them in its `derive` with `rows`), kept up to date with the
    rows they follow from, and hold nothing for a workflow without cancelOn, which pays
    nothing for them."""

    DERIVED = (_INDEX,)
    TABLES: tuple[TableSpec[Any, Any], ...] = (_INDEX_TABLE, _INDEXED)

    def __init__(self, app: App) -> None:
        self.workflows = frozenset(wf.name for wf in app.workflows.values() if wf.cancel_on)
        self._digest = hashlib.sha256("\n".join(sorted(self.workflows)).encode()).digest()

    def add(self, ctx: StageContext, workflow: str, where: bytes) -> None:
        if workflow in self.workflows:
            ctx.table(_INDEX_TABLE.name).put(_indexed(workflow) + where, b"")

    def remove(self, ctx: StageContext, workflow: str, where: bytes) -> None:
        if workflow in self.workflows:
            ctx.table(_INDEX_TABLE.name).delete(_indexed(workflow) + where)

    @staticmethod
    def parked(ctx: StageContext, workflow: str) -> list[bytes]:
        """Where the stage parked each start of `workflow` (read whole: the caller
        removes rows as it goes)."""
        prefix = _indexed(workflow)
        return [key[len(prefix):] for key in ctx.table(_INDEX_TABLE.name).keys(prefix)]

    def rows(self, parked: Iterable[tuple[str, bytes]]) -> dict[bytes, bytes]:
        """The rows for (workflow, where) of every start parked: a stage's `derive`."""
        return dict(_INDEX_TABLE.row(_indexed(workflow) + where, b"")
                    for workflow, where in parked if workflow in self.workflows)

    def restored(self, ctx: StageContext,
                 parked: Callable[[], Iterable[tuple[str, bytes]]]) -> None:
        """At a restore: when the workflows declaring cancelOn changed since the rows were
        made (a store kept across a redeploy keeps its derived rows), make them again.
        Only then does it read every parked start (`parked`)."""
        indexed, index = ctx.table(_INDEXED.name), ctx.table(_INDEX_TABLE.name)
        seen = indexed.get(b"")
        if seen == self._digest or (seen is None and not self.workflows):
            return
        for key in list(index.keys()):
            index.delete(key)
        for key, value in self.rows(parked()).items():
            ctx.store.put(key, value)
        indexed.put(b"", self._digest)


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

# The stage's tables: a live run ((workflow, execution id) -> its row as sg.runs carries
# it, Avro, kept as read), a run already cancelled (execution id -> b""); and the sweeps
# kept for late run rows (`keep`).
_LIVE_KEY = Joined(TEXT, TEXT)
_LIVE = TableSpec("live", STATE_PREFIX + b"L", _LIVE_KEY, RAW)
_SENT = TableSpec("sent", STATE_PREFIX + b"C", TEXT, RAW)


class CancelOnStage(AdmissionStage):
    name = NAME
    tables = (_LIVE, _SENT, *KEPT_TABLES)

    def __init__(self, app: App) -> None:
        self.app = app
        self.events = sorted({entry.event for wf in app.workflows.values()
                              for entry in wf.cancel_on})
        self.declaring = {wf.name for wf in app.workflows.values() if wf.cancel_on}

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
            for _, raw in list(ctx.table("live").items(_LIVE_KEY.head(workflow))):
                self._judge(ctx, codec.decode(RunRow, raw), sweep, data)
        keep(ctx, sweep)

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
        ctx.table("live").delete((row.workflow, row.execution_id))
        ctx.table("sent").put(row.execution_id, b"")

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        forget(ctx, key)

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
        live, sent = ctx.table("live"), ctx.table("sent")
        where = (row.workflow, row.execution_id)
        if row.status not in LIVE:
            live.delete(where)
            sent.delete(row.execution_id)
            return
        if row.execution_id in sent or where in live:
            return  # already known (or already cancelled): its start time does not change
        for sweep in kept(ctx):
            if row.workflow in sweep.workflows and self._judge(
                    ctx, row, sweep, json.loads(sweep.body)):
                return
        live.put(where, record.value)
