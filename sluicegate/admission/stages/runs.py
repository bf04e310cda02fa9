"""Runs: each admitted run's lifecycle, the `sg.runs` table, and the releases of its holds.

Keyed by execution id, fed by the admitted starts (each stage that admits one hands it
over in its own worker when the run's partition is there, and sends it to this stage's
topic otherwise: docs/decisions/in-process-handover.md) and by `sg.run-events`. When
the engine reports that a run ended, every slot the run holds (a concurrency slot, a
singleton hold, an identity key with a ttl) is released on the partition that owns it;
when it reports `suspended`, concurrency slots are offered back (a steps-mode limit
frees them), and a `resumed` run in steps mode asks its concurrency hop to re-admit it.

Two backstops bound an admitted run (docs/decisions/run-backstops.md):

- `timeouts.finish`: a run that has not ended `finish` after admission is cancelled (an
  engine command), recorded failed, its slots released (`expired`), and its onFailure
  workflow started;
- the lease, when no `finish` is declared: a run holding concurrency slots that reports
  nothing (no heartbeat, no lifecycle event) for the limit's `lease` is lost: cancelled,
  recorded failed, every hold released (`expired`), a `lease_expired` ledger row, and its
  onFailure workflow started (docs/decisions/lost-runs.md).

An engine-reported failure starts the onFailure workflow too.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping

from sluicegate.admission.decisions import RUNS_STAGE, record_decision, reject
from sluicegate.admission.lease import LEASED_STAGE, lease_of
from sluicegate.admission.routing import Router
from sluicegate.admission.rows import Avro, text_fields
from sluicegate.admission.stage import AdmissionStage, StageContext
from sluicegate.declare import App, format_duration
from sluicegate.engine.stage import Headers, InputRecord, StoreReader
from sluicegate.engine.tables import RAW, TEXT, Decimal, Joined, TableSpec, derived_prefixes
from sluicegate.engine.timers import DERIVED_TIMER_PREFIX, STATE_PREFIX, timer_key
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    ENDED,
    LIVE,
    AdmittedKind,
    AdmittedStart,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    Release,
    ReleaseKind,
    RunEvent,
    RunEventKind,
    RunOperation,
    RunRow,
    RunStatus,
    StartRequest,
    changed,
    record,
)
from sluicegate.topology.keys import identity_store_key, key_text

log = logging.getLogger(__name__)

NAME = RUNS_STAGE
# execution id -> the run's row: the runs table, which the worker publishes to sg.runs
# (`admission.app.node`, docs/decisions/published-tables.md).
RUN_ROWS = STATE_PREFIX + b"R"
RUNS = TableSpec("runs", RUN_ROWS, TEXT, Avro(RunRow))
# (execution id, offset) -> an engine's report read before its run's admission: kept
# until the run's row exists. And execution id -> b"": there is one for the run.
_EARLY_KEY = Joined(TEXT, Decimal(20))
_EARLY = TableSpec("early", STATE_PREFIX + b"E", _EARLY_KEY, RAW)
_EARLY_MARK = TableSpec("early_mark", STATE_PREFIX + b"e", TEXT, RAW)
# execution id -> a cancel an operator sent, its reason, until the run ends.
_CANCELLING = TableSpec("cancelling", STATE_PREFIX + b"K", TEXT, TEXT)
# Timer keys, by kind, then the execution id.
_FINISH = b"F"
_LEASE = b"L"

# Which runs each bulk verb acts on (SPEC.md section 4; seed 000): the operation selects
# them by this, and the runs stage checks it again when it carries the operation out.
ELIGIBLE: dict[str, frozenset[RunStatus]] = {
    # An admitted run is one the engine has been handed: leaving it out would let it start
    # after the operator stopped "all" of them.
    "cancel": LIVE,
    "redrive": frozenset({RunStatus.failed}),
    "retry": frozenset({RunStatus.failed, RunStatus.cancelled}),
}
_OPERATED = {"cancel": Outcome.cancelled, "redrive": Outcome.redriven,
             "retry": Outcome.retried}
FINISH_REASON = "timeouts.finish"
# A run whose lease ran out is lost: the failure report's reason and the cancel's id.
LOST_REASON = "lease_expired"

_STATUS_OF = {
    RunEventKind.started: RunStatus.running,
    RunEventKind.suspended: RunStatus.suspended,
    RunEventKind.completed: RunStatus.completed,
    RunEventKind.failed: RunStatus.failed,
    RunEventKind.cancelled: RunStatus.cancelled,
}

# -- the pure core -------------------------------------------------------------------


def admitted_row(admitted: AdmittedStart) -> RunRow:
    # Positional: every admission builds one, and a keyword call costs twice as much
    # (records-built-in-python.md).
    slots = admitted.slots
    return RunRow(
        admitted.execution_id, admitted.workflow, RunStatus.admitted, admitted.payload,
        admitted.declaration_version, admitted.admitted_at_ms, admitted.admitted_at_ms,
        list(slots), {slot.stage: slot.key for slot in slots} if slots else {},
    )


def retry_id(execution_id: str) -> str:
    """The request id and explicit id of a retry's start: one retry per execution, however
    often the operation is repeated (identity answers `existing` to a repeat)."""
    return f"retry:{execution_id}"


def redriven(row: RunRow, event: RunEvent) -> bool:
    """Whether the report reopens an ended run: only a failed run comes back (a redrive
    resumes it from the failed step), when the engine reports it started or resumed after
    its end; a completed or cancelled run never does (docs/decisions/redrive.md)."""
    return (row.status is RunStatus.failed
            and event.kind in (RunEventKind.started, RunEventKind.resumed)
            and event.at_ms > (row.ended_at_ms or 0))


def apply_event(row: RunRow, event: RunEvent, cancel_reason: str | None = None) -> RunRow:
    """The run row after an engine report; an ended run does not change again, unless a
    failed run is redriven (it then holds nothing: its holds went back when it failed).

    `last_reason` is the report's reason (or error message); a report without one keeps
    the row's only while the status stays, so a run cancelled while suspended does not
    show why it was suspended. A `cancelled` report after an operator's cancel
    (`cancel_reason`) records the operator's reason (SPEC.md section 4)."""
    if row.status in ENDED:
        if not redriven(row, event):
            return row
        row = changed(row, slots=[])
    status = _STATUS_OF.get(event.kind, row.status)
    if event.kind is RunEventKind.resumed:
        status = RunStatus.running
    reason = event.reason or event.error_message or (
        row.last_reason if status is row.status else None)
    if status is RunStatus.cancelled and cancel_reason is not None:
        reason = cancel_reason
    return changed(
        row, status=status, updated_at_ms=event.at_ms,
        ended_at_ms=event.at_ms if status in ENDED else None,
        last_reason=reason,
        retries_spent=event.retries_spent if event.retries_spent is not None
        else row.retries_spent,
        run_id=event.run_id or row.run_id,
    )


@record
class Backstop:
    """The deadlines of one live run: `finish_at_ms` (timeouts.finish) never moves; the
    lease (`lease_until_ms`, `lease_ms` long) moves forward when its timer finds the run
    reported since (lease-moved-when-due.md)."""

    finish_at_ms: int | None = None
    lease_ms: int | None = None
    lease_until_ms: int | None = None

    @property
    def idle(self) -> bool:
        return self.finish_at_ms is None and self.lease_ms is None


# No deadline: one value, shared (a frozen dataclass costs a call per field to build, and
# every run with deadlines is disarmed to it when it ends).
NO_BACKSTOP = Backstop()

# execution id -> a live run's deadlines, derived from its row.
BACKSTOPS = TableSpec("backstops", STATE_PREFIX + b"B", TEXT, text_fields(Backstop),
                      derived=True, held=True)


def holds_lease(row: RunRow, steps_mode: bool) -> bool:
    """Whether the run holds a concurrency slot right now: a steps-mode run that is
    suspended gave its slots back (and is re-admitted before it resumes)."""
    if steps_mode and row.status is RunStatus.suspended:
        return False
    return any(slot.stage == LEASED_STAGE for slot in row.slots)


def backstop_for(admitted_at_ms: int, finish_ms: int | None, lease_ms: int,
                 holding: bool) -> Backstop:
    """A newly admitted run's deadlines. `finish` is the tighter backstop and replaces the
    lease (SPEC.md: freed after timeouts.finish, else after the lease); a run holding no
    concurrency slot has no lease to run out."""
    if finish_ms is not None:
        return Backstop(finish_at_ms=admitted_at_ms + finish_ms)
    if not holding:
        return NO_BACKSTOP
    return Backstop(lease_ms=lease_ms, lease_until_ms=admitted_at_ms + lease_ms)


def alive(backstop: Backstop, holding: bool, now_ms: int) -> Backstop:
    """The run reported in at `now_ms`: while it holds a concurrency slot its lease runs
    `lease_ms` from now (never shorter than before); the finish deadline never moves."""
    if backstop.lease_ms is None:
        return backstop
    if not holding:
        return changed(backstop, lease_until_ms=None)
    return changed(backstop, lease_until_ms=max(
        now_ms + backstop.lease_ms, backstop.lease_until_ms or 0))


def failed_by_backstop(row: RunRow, now_ms: int, reason: str) -> RunRow:
    """The run row once a backstop (timeouts.finish, or its lease running out: the run
    is lost) has ended it: failed, with why (an ended run stays as is)."""
    if row.status in ENDED:
        return row
    return changed(row, status=RunStatus.failed, updated_at_ms=now_ms,
                               ended_at_ms=now_ms, last_reason=reason)


def failure_reason(event: RunEvent) -> str:
    if event.retries_spent is not None:
        return f"retries exhausted ({event.retries_spent})"
    return "the engine reported the run failed"


# -- the stage -----------------------------------------------------------------------


class RunsStage(AdmissionStage):
    name = NAME
    # A live run's deadlines (its backstop row and their timers) follow from its row and
    # its workflow's declaration: kept, never logged, made again at restore (a lease then
    # runs from the restore, as it does for a run whose report was not heard).
    tables = (RUNS, _EARLY, _EARLY_MARK, _CANCELLING, BACKSTOPS)
    derived = (*derived_prefixes(*tables), DERIVED_TIMER_PREFIX)
    derived_timers = (_FINISH, _LEASE)

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router
        # What every admission asks of its workflow's declaration, answered once.
        self._finish_ms = {wf.name: wf.timeouts.finish_ms for wf in app.workflows.values()
                           if wf.timeouts is not None}
        # A backstop fires on the wall clock, and then counts the time this worker has
        # itself spent (its monotonic clock): a step of the wall clock is not time that
        # passed for the engines (docs/decisions/clock-steps.md). Per partition: when this
        # worker took it (wall, monotonic), and for each run with a backstop, when it last
        # heard from the run and when it admitted it (monotonic). Not logged: after a
        # restore the count starts at the taking.
        self._taken: dict[int, tuple[int, int]] = {}
        self._heard: defaultdict[int, dict[str, int]] = defaultdict(dict)
        self._armed: defaultdict[int, dict[str, int]] = defaultdict(dict)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.topic != ctx.topics.run_events:
            try:
                message = codec.decode_one_of((AdmittedStart, RunOperation), record.value)
            except codec.DecodeError as exc:
                reject(ctx, record, f"not an admitted start or a run operation: {exc}")
                return
            if isinstance(message, RunOperation):
                self.operate(ctx, message)
                return
            self._admitted(ctx, message, reports_may_precede=True, headers=record.headers)
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
            ctx.table("early").put((event.execution_id, record.offset), record.value or b"")
            ctx.table("early_mark").put(event.execution_id, b"")
            return
        self._event(ctx, row, event)

    def process_handed_over(self, ctx: StageContext, topic: str, key: bytes,
                            value: bytes | None, headers: Headers | None,
                            message: object | None) -> None:
        if isinstance(message, AdmittedStart):
            # Taken as it is, not decoded again. It commits with its run's row, and an
            # engine reads an admission once it commits, so no report of the run came
            # before the row.
            self._admitted(ctx, message, reports_may_precede=False, headers=headers)
            return
        super().process_handed_over(ctx, topic, key, value, headers, message)

    @staticmethod
    def load(ctx: StageContext, execution_id: str) -> RunRow | None:
        row: RunRow | None = ctx.table("runs").get(execution_id)
        return row

    def save(self, ctx: StageContext, row: RunRow) -> None:
        """The run's row, in the store and (at commit) in the runs table."""
        ctx.table("runs").put(row.execution_id, row)

    def _admitted(self, ctx: StageContext, admitted: AdmittedStart,
                  reports_may_precede: bool, headers: Headers | None = None) -> None:
        row = self.load(ctx, admitted.execution_id)
        if admitted.kind is AdmittedKind.resume:
            if row is None:
                return
            if row.status in ENDED:
                # It ended (timeouts.finish) while it waited to be re-admitted: the slots
                # taken for the resume go straight back.
                self.release(ctx, changed(row, slots=list(admitted.slots)),
                             ReleaseKind.ended, row.last_reason)
                return
            held = {(s.stage, s.key) for s in row.slots}
            slots = [*row.slots, *(s for s in admitted.slots if (s.stage, s.key) not in held)]
            resumed = changed(row, status=RunStatus.running, slots=slots,
                                          updated_at_ms=admitted.admitted_at_ms)
            self.save(ctx, resumed)
            # Re-admitted with fresh concurrency slots: their lease starts now.
            self._reported(ctx, resumed)
            return
        if row is not None:
            return
        row = admitted_row(admitted)
        self.save(ctx, row)
        self._arm(ctx, row)
        # A singleton `cancel` replacement evicts its incumbent only once it is admitted
        # (it may have waited behind throttle, concurrency or a pause); the cancel goes in
        # the replacement's trace (`headers`: the admitted start's).
        for slot in admitted.slots:
            if slot.stage == "singleton":
                ctx.send(ctx.topics.stage(slot.stage), slot.key.encode(), codec.encode(admitted),
                         None, headers)
        if not reports_may_precede:
            return
        # A point lookup first: a prefix scan per admitted start would cost a walk of the
        # whole cycle's write buffer.
        marks = ctx.table("early_mark")
        if admitted.execution_id not in marks:
            return
        marks.delete(admitted.execution_id)
        early = ctx.table("early")
        for key, value in list(early.items(_EARLY_KEY.head(admitted.execution_id))):
            early.delete(key)
            current = self.load(ctx, admitted.execution_id)
            assert current is not None
            self._event(ctx, current, codec.decode(RunEvent, value))

    def _event(self, ctx: StageContext, row: RunRow, event: RunEvent) -> None:
        if row.status in ENDED and not redriven(row, event):
            return
        if event.kind is RunEventKind.heartbeat:
            self.heartbeat(ctx, row, event)
            return
        cancel_reason = None
        if _STATUS_OF.get(event.kind) in ENDED:
            # A point lookup only when the run ends: an operator's cancel waits for it.
            cancelling = ctx.table("cancelling")
            cancel_reason = cancelling.get(row.execution_id)
            if cancel_reason is not None:
                cancelling.delete(row.execution_id)
        updated = apply_event(row, event, cancel_reason)
        # A redriven run was resumed by the engine on an operator's command: not re-admitted.
        if (event.kind is RunEventKind.resumed and row.status not in ENDED
                and self._needs_readmission(row)):
            self._ask_readmission(ctx, row)
            return
        self.save(ctx, updated)
        if updated.status in ENDED:
            self.release(ctx, updated, ReleaseKind.ended, updated.last_reason)
            self.ended(ctx, updated, event)
            return
        if updated.status is RunStatus.suspended:
            self.release(ctx, updated, ReleaseKind.suspended, event.reason,
                         stages={"concurrency"})
        self._reported(ctx, updated)

    # -- the lease, the finish timeout and onFailure ------------------------------------

    def heartbeat(self, ctx: StageContext, row: RunRow, event: RunEvent) -> None:
        """A live run says it is alive: its slot lease runs on from now."""
        self._reported(ctx, row)

    def ended(self, ctx: StageContext, row: RunRow, event: RunEvent | None) -> None:
        """The run ended: its deadlines go, and a failure reported by the engine starts the
        workflow's onFailure handler with the failure report."""
        self._disarm(ctx, row.execution_id)
        if event is None or event.kind is not RunEventKind.failed:
            return
        self._notify(ctx, row, failure_reason(event), "failed", error_tag=event.error_tag,
                     error_message=event.error_message)

    def restored(self, ctx: StageContext) -> None:
        self._taken[ctx.partition] = (ctx.now_ms, ctx.monotonic_ms)
        self._heard.pop(ctx.partition, None)
        self._armed.pop(ctx.partition, None)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        execution_id = key[1:].decode()
        row = self.load(ctx, execution_id)
        backstop = ctx.table("backstops").get(execution_id)
        if row is None or backstop is None or row.status in ENDED:
            return
        finish_at = backstop.finish_at_ms
        if key.startswith(_FINISH) and finish_at is not None and due_ms >= finish_at:
            # (Later than the deadline: fired again after a step of the wall clock.)
            left = self._finish_left(ctx, row, finish_at)
            if left > 0:
                ctx.timers.schedule(ctx.now_ms + left, key)
                return
            self._finish_expired(ctx, row, finish_at)
        elif key.startswith(_LEASE) and backstop.lease_until_ms == due_ms:
            assert backstop.lease_ms is not None
            left = backstop.lease_ms - self._quiet_ms(ctx, execution_id)
            if left > 0:
                self._store_backstop(ctx, execution_id, backstop,
                                     changed(backstop, lease_until_ms=ctx.now_ms + left))
                return
            self._lease_expired(ctx, row, backstop)

    def _taken_at(self, ctx: StageContext) -> tuple[int, int]:
        taken = self._taken.get(ctx.partition)
        if taken is None:
            taken = self._taken[ctx.partition] = (ctx.now_ms, ctx.monotonic_ms)
        return taken

    def _quiet_ms(self, ctx: StageContext, execution_id: str) -> int:
        """How long this worker has itself gone without a report of the run: since the
        last one it read, or since it took the partition."""
        taken = self._taken_at(ctx)[1]
        heard = self._heard[ctx.partition].get(execution_id, taken)
        return ctx.monotonic_ms - max(heard, taken)

    def _finish_left(self, ctx: StageContext, row: RunRow, finish_at_ms: int) -> int:
        """What is left of the run's finish timeout, counting the time since its admission
        on this worker's own clock (the wall clock's up to the taking of the partition, for
        a run admitted before it)."""
        armed = self._armed[ctx.partition].get(row.execution_id)
        if armed is None:
            taken_wall, taken_mono = self._taken_at(ctx)
            elapsed = taken_wall - row.admitted_at_ms + ctx.monotonic_ms - taken_mono
        else:
            elapsed = ctx.monotonic_ms - armed
        return finish_at_ms - row.admitted_at_ms - elapsed

    def _finish_expired(self, ctx: StageContext, row: RunRow, finish_at_ms: int) -> None:
        took = format_duration(finish_at_ms - row.admitted_at_ms)
        reason = f"{FINISH_REASON}: the run did not end within {took} of its admission"
        self._fail(ctx, row, reason, FINISH_REASON, Outcome.failed, "finish", "finish")

    def _lease_expired(self, ctx: StageContext, row: RunRow, backstop: Backstop) -> None:
        """Nothing was heard of the run for its lease: it is lost (the engine that held it
        died, or lost it). docs/decisions/lost-runs.md."""
        assert backstop.lease_ms is not None
        silent = format_duration(backstop.lease_ms)
        reason = (f"lost: no heartbeat or lifecycle report for {silent} (its lease); "
                  "recorded failed, its holds freed and its engine told to cancel it")
        self._fail(ctx, row, reason, LOST_REASON, Outcome.lease_expired, "lease",
                   f"lease:{backstop.lease_until_ms}")

    def _fail(self, ctx: StageContext, row: RunRow, reason: str, why: str, outcome: Outcome,
              backstop: str, what: str) -> None:
        """A backstop ends a live run: a cancel to any engine that may still hold it
        (command id `<why>:<execution id>`), the run recorded failed, every hold released
        (`expired`), a ledger row `run:<execution id>:<what>`, and its onFailure started
        (request id `failure:<workflow>:<backstop>:<execution id>`) with `why` as the
        report's reason and the detail as its error message."""
        failed = failed_by_backstop(row, ctx.now_ms, reason)
        ctx.table("cancelling").delete(row.execution_id)
        ctx.send(ctx.topics.commands, row.execution_id.encode(), codec.encode(EngineCommand(
            command_id=f"{why}:{row.execution_id}", execution_id=row.execution_id,
            workflow=row.workflow, kind=CommandKind.cancel, issued_at_ms=ctx.now_ms,
            reason=reason,
        )))
        self.save(ctx, failed)
        self.release(ctx, failed, ReleaseKind.expired, reason)
        self._ledger(ctx, failed, what, outcome, reason)
        self._disarm(ctx, row.execution_id)
        self._notify(ctx, failed, why, backstop, error_message=reason)

    # -- operators' bulk operations ------------------------------------------------------

    def operate(self, ctx: StageContext, op: RunOperation) -> None:
        """Carry out an operator's bulk operation on one run: the engine command (cancel,
        redrive) or the retry's start, the cancel's reason kept for the run's row, and a
        ledger row `run:<execution id>:bulk-<verb>:<operation>` with the operator's reason,
        all in one transaction. A run that changed since the operation selected it is left
        as it is, and the row says so (`skipped`). docs/decisions/bulk-operations.md."""
        row = self.load(ctx, op.execution_id)
        what = f"bulk-{op.verb}:{op.operation}"
        reason = op.reason or f"replay-many --mode {op.verb}"
        eligible = ELIGIBLE.get(op.verb)
        if row is None or eligible is None or row.status not in eligible:
            why = ("no such run" if row is None else f"no verb {op.verb!r}" if eligible is None
                   else f"the run is {row.status.value} now")
            skipped = f"{op.verb} not carried out, {why} ({reason})"
            if row is not None:
                self._ledger(ctx, row, what, Outcome.skipped, skipped)
                return
            now = ctx.now_ms
            record_decision(ctx, LedgerRecord(
                request_id=f"run:{op.execution_id}:{what}", workflow=op.workflow,
                outcome=Outcome.skipped, requested_at_ms=op.issued_at_ms, decided_at_ms=now,
                stage=self.name, reason=skipped, execution_id=op.execution_id), None)
            return
        if op.verb == "retry":
            ident = retry_id(row.execution_id)
            ctx.send(ctx.topics.starts, identity_store_key(row.workflow, ident), codec.encode(
                StartRequest(request_id=ident, workflow=row.workflow, payload=row.payload,
                             origin=Origin.direct, requested_at_ms=ctx.now_ms,
                             idempotency_id=ident, retry_of=row.execution_id)))
        else:
            kind = CommandKind.cancel if op.verb == "cancel" else CommandKind.redrive
            ctx.send(ctx.topics.commands, row.execution_id.encode(), codec.encode(EngineCommand(
                command_id=op.command_id, execution_id=row.execution_id,
                workflow=row.workflow, kind=kind, issued_at_ms=ctx.now_ms, reason=op.reason)))
            if kind is CommandKind.cancel:
                # The engine's `cancelled` report records it on the run (apply_event).
                ctx.table("cancelling").put(row.execution_id, reason)
        self._ledger(ctx, row, what, _OPERATED[op.verb], reason)

    def _ledger(self, ctx: StageContext, row: RunRow, what: str, outcome: Outcome,
                reason: str) -> None:
        """A ledger row about a run rather than a start request: its request id is
        `run:<execution id>:<what>`, so no request gets a second final outcome
        (docs/decisions/run-backstops.md). Its key and control are those of the run's
        concurrency slots (docs/decisions/ledger-keys.md)."""
        now = ctx.now_ms
        leased = [s for s in row.slots if s.stage == LEASED_STAGE]
        record_decision(ctx, LedgerRecord(
            request_id=f"run:{row.execution_id}:{what}", workflow=row.workflow,
            outcome=outcome, requested_at_ms=row.admitted_at_ms, decided_at_ms=now,
            waited_ms=max(0, now - row.admitted_at_ms), stage=self.name, reason=reason,
            execution_id=row.execution_id, declaration_version=row.declaration_version,
            key=", ".join(key_text(s.key) for s in leased) if leased else None,
            control=", ".join(self.router.control_of_slot(row.workflow, s) or LEASED_STAGE
                              for s in leased) if leased else None,
        ), None)

    def _notify(self, ctx: StageContext, row: RunRow, reason: str, what: str, *,
                error_tag: str | None = None, error_message: str | None = None) -> None:
        if self.router.is_failure_handler(row.workflow):
            # No onFailure for an onFailure: one line in the log is the floor.
            log.warning("failure handler %s failed (run %s, %s): %s; not reported again",
                        row.workflow, row.execution_id, reason, error_message)
            return
        wf = self.app.get(row.workflow)
        self.router.notify_failure(
            ctx, workflow=row.workflow, on_failure=wf.on_failure if wf is not None else None,
            payload=row.payload, reason=reason, execution_id=row.execution_id,
            run_id=row.run_id, error_tag=error_tag, error_message=error_message,
            tag=f"{what}:{row.execution_id}")

    # -- deadlines: a row and its timers ------------------------------------------------

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        """Every live run's backstop and its timers, as `_arm` made them, but for a run
        that gave its slot back (no lease): the lease runs from the run's admission, and
        its timer then finds the run quiet only since the restore, and moves on."""
        rows: dict[bytes, bytes] = {}
        for _, row in RUNS.read(store):
            if row.status in ENDED:
                continue
            backstop = self._backstop_of(row)
            if backstop is None or backstop.idle:
                continue
            ident = row.execution_id.encode()
            key, value = BACKSTOPS.row(row.execution_id, backstop)
            rows[key] = value
            for kind, due in ((_FINISH, backstop.finish_at_ms),
                              (_LEASE, backstop.lease_until_ms)):
                if due is not None:
                    rows[timer_key(due, kind + ident, DERIVED_TIMER_PREFIX)] = b""
        return rows

    def _backstop_of(self, row: RunRow) -> Backstop | None:
        """A live run's deadlines from its row: None for a run `_arm` gives none."""
        finish_ms = self._finish_ms.get(row.workflow)
        if finish_ms is None and not row.slots:
            return None
        leased = any(slot.stage == LEASED_STAGE for slot in row.slots)
        backstop = backstop_for(row.admitted_at_ms, finish_ms,
                                lease_of(self.app.get(row.workflow)), leased)
        if leased and not holds_lease(row, self._needs_readmission(row)):
            # Suspended in steps mode: its slot is given back, and no lease runs.
            backstop = alive(backstop, False, row.updated_at_ms)
        return backstop

    def _arm(self, ctx: StageContext, row: RunRow) -> None:
        finish_ms = self._finish_ms.get(row.workflow)
        if finish_ms is None and not row.slots:
            return  # no deadline and nothing to lease: most runs, and every passthrough
        wf = self.app.get(row.workflow)
        holding = holds_lease(row, self._needs_readmission(row))
        now = ctx.monotonic_ms
        self._armed[ctx.partition][row.execution_id] = now
        self._heard[ctx.partition][row.execution_id] = now
        self._store_backstop(ctx, row.execution_id, None,
                             backstop_for(row.admitted_at_ms, finish_ms, lease_of(wf), holding))

    def _reported(self, ctx: StageContext, row: RunRow) -> None:
        old = ctx.table("backstops").get(row.execution_id)
        if old is None:
            return
        self._heard[ctx.partition][row.execution_id] = ctx.monotonic_ms
        holding = holds_lease(row, self._needs_readmission(row))
        if holding and old.lease_until_ms is not None:
            # The lease runs on from this report, on this worker's own time: its timer,
            # once due, finds the run heard of since and moves itself on (`fire`), rather
            # than being moved at every report (docs/decisions/lease-moved-when-due.md).
            return
        self._store_backstop(ctx, row.execution_id, old, alive(old, holding, ctx.now_ms))

    def _store_backstop(self, ctx: StageContext, execution_id: str, old: Backstop | None,
                        new: Backstop) -> None:
        ident = execution_id.encode()
        old = old or NO_BACKSTOP
        for kind, before, after in ((_FINISH, old.finish_at_ms, new.finish_at_ms),
                                    (_LEASE, old.lease_until_ms, new.lease_until_ms)):
            if before == after:
                continue
            if before is not None:
                ctx.timers.cancel(before, kind + ident)
            if after is not None:
                ctx.timers.schedule(after, kind + ident)
        if not new.idle:
            ctx.table("backstops").put(execution_id, new)
        elif not old.idle:  # only a run with deadlines has a row (a fresh one has none)
            ctx.table("backstops").delete(execution_id)

    def _disarm(self, ctx: StageContext, execution_id: str) -> None:
        backstop = ctx.table("backstops").get(execution_id)
        for runs in (self._heard, self._armed):
            runs[ctx.partition].pop(execution_id, None)
        if backstop is not None:
            self._store_backstop(ctx, execution_id, backstop, NO_BACKSTOP)

    # -- releases ------------------------------------------------------------------------

    def release(self, ctx: StageContext, row: RunRow, kind: ReleaseKind, reason: str | None,
                stages: set[str] | None = None) -> None:
        for slot in row.slots:
            if stages is not None and slot.stage not in stages:
                continue
            release = Release(
                stage=slot.stage, key=slot.key, execution_id=row.execution_id,
                workflow=row.workflow, kind=kind, at_ms=ctx.now_ms, reason=reason)
            ctx.send(ctx.topics.stage(slot.stage), slot.key.encode(), codec.encode(release),
                     None, None, release)

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
            priority=(wf.priority.value(self.router.payloads.open(row.payload)) if wf.priority
                      else 0.0),
            slots=kept,
        )
        updated = changed(row, slots=kept, updated_at_ms=ctx.now_ms)
        self.save(ctx, updated)
        # Waiting for its slot again holds no lease (the resume record re-arms it).
        self._reported(ctx, updated)
        self.router.forward(ctx, resume)
