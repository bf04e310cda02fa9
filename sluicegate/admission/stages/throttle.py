"""throttle: starts per key spaced evenly, one each `period/limit`, with `burst` extra at
once after a quiet time; the excess waits its turn, none is lost (SPEC.md section 3,
step 5; seed 003 "Throttle"). A throttle `pool` is one pace shared by every workflow that
names it: their starts meet at the pool's key and wait in one queue. A workflow that
declares several throttles is paced by all of them at once (`throttles`).

The pace is GCRA (the generic cell rate algorithm, virtual scheduling form): a key keeps
the theoretical arrival time (TAT) of its next start; a start conforms at an instant
`t >= TAT - burst * interval`, and admitting it moves the TAT to `max(TAT, t) + interval`.
With burst 0 that never admits more than `limit` in any `period`.

Time runs in units of 1/limit ms, so the interval is exactly `period_ms` units and no
rounding drifts the rate (100,000 a second is a hundred a millisecond, not one). A start
seen at millisecond `m` takes the earliest instant of `m` at which it conforms.

Starts that do not conform wait in the key's priority-ordered pending queue and go, head
first, when the key's timer reaches the head's turn. `max_queued` caps a key's queue
(over it: `dropped`, queue-full); `timeouts.start` expires a start that waited too long;
a start of a workflow removed from the declarations fails (both into onFailure).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from sluicegate.admission import limits as key_limits
from sluicegate.admission import overrides, pending
from sluicegate.admission.decisions import reject
from sluicegate.admission.pending import COUNTED, Parked, PendingQueue, priority_mode
from sluicegate.admission.routing import REMOVED, Router
from sluicegate.admission.rows import legacy, optional_int
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.queueing import QueueStage
from sluicegate.declare import App, Throttle, Workflow, applies, format_duration
from sluicegate.engine.stage import Headers, InputRecord, StoreReader
from sluicegate.engine.tables import RAW, Fields, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.records import CancelSweep, Outcome, OverrideRow, PendingStart
from sluicegate.topology.keys import ControlKey, key_text
from sluicegate.topology.route import hop_key

NAME = "throttle"
# Timers, one of each per key: the head's turn (or forgetting an idle key), the
# timeouts.start sweep; and the two of a workflow with several throttles.
_TURN = b"T"
_SWEEP = b"X"
MANY_TURN = b"M"
MANY_SWEEP = b"Y"

# -- the pure core -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rate:
    """A throttle's GCRA parameters; times in units of 1/limit ms."""

    limit: int
    period_ms: int
    burst: int = 0

    @property
    def interval(self) -> int:
        return self.period_ms

    @property
    def tolerance(self) -> int:
        return self.burst * self.period_ms

    @classmethod
    def of(cls, option: Throttle) -> Rate:
        return cls(option.limit, option.period_ms, option.burst)


@dataclass(frozen=True, slots=True)
class Pace:
    """A key's TAT in units of 1/scale ms; None before its first start."""

    tat: int | None = None
    scale: int = 1

    def at(self, rate: Rate) -> int | None:
        """The TAT in `rate`'s units (a redeclared limit rescales it, rounding up)."""
        if self.tat is None or self.scale == rate.limit:
            return self.tat
        return -(-self.tat * rate.limit // self.scale)


def repaced(pace: Pace, rate: Rate, now_ms: int) -> Pace:
    """The pace of a key whose limit changed at `now_ms` (the limits table): the time it
    still owes for the starts it admitted is paid at the new rate, so a raised limit
    lets the next start go that much sooner, a lowered one later. Nothing is owed by a
    key whose TAT has passed."""
    if pace.tat is None or pace.scale == rate.limit:
        return pace
    # In either unit an admission owes `period_ms` units: what is owed keeps its number.
    owed = pace.tat - now_ms * pace.scale
    if owed <= 0:
        return Pace(pace.at(rate), rate.limit)
    return Pace(now_ms * rate.limit + owed, rate.limit)


def _first_instant(rate: Rate, ms: int) -> int:
    return (ms - 1) * rate.limit + 1


def take(pace: Pace, rate: Rate, now_ms: int) -> Pace | None:
    """The pace after admitting one start at `now_ms`, or None when none conforms yet."""
    tat = pace.at(rate)
    instant = _first_instant(rate, now_ms)
    if tat is not None:
        instant = max(instant, tat - rate.tolerance)
    if instant > now_ms * rate.limit:
        return None
    return Pace(max(instant, tat if tat is not None else instant) + rate.interval, rate.limit)


def due_ms(pace: Pace, rate: Rate, position: int = 0) -> int:
    """When the start at `position` of a waiting queue conforms (0: the head), if every
    turn is taken on time. Only for a key whose head waits, so one that has a TAT."""
    tat = pace.at(rate)
    if tat is None:
        raise ValueError("a key with no start admitted yet has nobody waiting")
    return -(-(tat + position * rate.interval - rate.tolerance) // rate.limit)


def record_queued(router: Router, ctx: StageContext, start: PendingStart, key: str,
                  position: int | None, due: Callable[[int], int], whose: str,
                  headers: Headers | None) -> None:
    """The `queued` ledger row of a start parked at `position` of a throttle queue: its
    place and its slot's time (`due(position)`), or, when a priority ranked it behind more
    than could be counted, a reason saying its slot comes after theirs
    (docs/decisions/queue-position-bound.md)."""
    if position is None:
        router.queued(ctx, start, deferral="throttle", key=key,
                      reason=f"throttle: more than {COUNTED} starts of {whose} wait ahead "
                             f"of it; its slot comes after theirs", headers=headers)
    else:
        router.queued(ctx, start, deferral="throttle", key=key, due_at_ms=due(position),
                      position=position, headers=headers)


def forget_ms(pace: Pace, rate: Rate) -> int | None:
    """From this millisecond on the pace is the same as a fresh key's (None: already)."""
    tat = pace.at(rate)
    if tat is None:
        return None
    # Every instant of ms `m` is >= TAT once (m - 1) * limit + 1 >= TAT.
    return -(-(tat - 1) // rate.limit) + 1


# -- the stage -----------------------------------------------------------------------


def several(wf: Workflow | None) -> bool:
    """Whether `wf` declares several throttles (paced together: `throttles`)."""
    return wf is not None and len(wf.throttle) > 1


@dataclass(frozen=True, slots=True)
class KeyRow:
    """A key's row: its workflow, its pace, and the due times of its two timers."""

    workflow: str
    pace: Pace = Pace()
    turn_ms: int | None = None
    sweep_ms: int | None = None

    # Built directly rather than with dataclasses.replace, which costs several times a
    # constructor's call on every start through the stage.
    def paced(self, pace: Pace) -> KeyRow:
        return KeyRow(self.workflow, pace, self.turn_ms, self.sweep_ms)

    def turning(self, turn_ms: int | None) -> KeyRow:
        return KeyRow(self.workflow, self.pace, turn_ms, self.sweep_ms)

    def sweeping(self, sweep_ms: int | None) -> KeyRow:
        return KeyRow(self.workflow, self.pace, self.turn_ms, sweep_ms)


# A key -> its row (KeyRow).
KEYS = TableSpec("keys", STATE_PREFIX + b"K", RAW, legacy(
    Fields(KeyRow, nested={"pace": Fields(Pace)}),
    lambda t: KeyRow(t[0], Pace(optional_int(t[1]), int(t[2])), optional_int(t[3]),
                     optional_int(t[4])),
    lambda row: (row.workflow, row.pace.tat, row.pace.scale, row.turn_ms, row.sweep_ms)))


class ThrottleStage(QueueStage):
    name = NAME
    # A key's queue holds the starts of every workflow of its pool: cancelOn's index by
    # workflow (where each waits: its row) follows from the queues' rows, like their
    # bookkeeping, and neither is logged.
    derived = (*cancelon.SweepIndex.DERIVED, *pending.DERIVED)

    def __init__(self, app: App, router: Router) -> None:
        super().__init__(app, router)
        # Imported here: the several-throttles half builds on this module's pure core.
        from sluicegate.admission.stages.throttles import Throttles

        self.many = Throttles(router)
        self.tables = (*QueueStage.tables, *cancelon.SweepIndex.TABLES, KEYS, *Throttles.TABLES)
        self.sweeps = cancelon.SweepIndex(app)
        # The budgets whose limits per key come from the limits table, by the rows' name.
        self.per_key: dict[str, set[str]] = {}
        for wf in app.workflows.values():
            name = wf.throttle[0].per_key if len(wf.throttle) == 1 else None
            if name is not None:
                self.per_key.setdefault(name, set()).add(
                    wf.throttle[0].shared_budget or wf.name)

    def table_changed(self, ctx: StageContext, table: str, row: object) -> None:
        """A key's limit changed in the limits table: its head's turn is judged again at
        the new pace (a raised limit lets whoever's turn has come go at once). An override
        of a throttle (a control row): this partition's keys of its budget go at the new
        pace now (a raised one lets go the heads whose turn has come under it, and every
        key's turn timer is aimed again)."""
        if isinstance(row, OverrideRow):
            if row.control == NAME:
                for key, keyed in list(ctx.table("keys").items()):
                    if ControlKey.parse(key).budget != row.budget:
                        continue
                    queue = PendingQueue(ctx.store, key)
                    self._settle(ctx, key, self._drain(ctx, key, keyed, queue), queue)
                # One of a workflow's several throttles (`<workflow>#<index>`).
                self.many.overridden(ctx, row.budget.partition("#")[0])
            return
        if table != key_limits.LIMITS_TABLE or not isinstance(row, key_limits.LimitChange):
            return
        for budget in sorted(self.per_key.get(row.name, ())):
            key = ControlKey(budget, row.key).encode()
            keyed = ctx.table("keys").get(key)
            if keyed is None or not key_limits.owns(key, ctx.partition,
                                                    ctx.topics.settings.partitions):
                continue
            queue = PendingQueue(ctx.store, key)
            wf = self.app.get(keyed.workflow)
            if wf is not None and len(wf.throttle) == 1:
                keyed = keyed.paced(repaced(keyed.pace, self._rate(wf, key),
                                            ctx.now_ms))
            self._settle(ctx, key, self._drain(ctx, key, keyed, queue), queue)

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        rows = super().derive(store)
        rows.update(self.sweeps.rows(self._parked(store)))
        return rows

    def _parked(self, store: StoreReader) -> Iterator[tuple[str, bytes]]:
        """(workflow, row) of every start waiting in a key's queue."""
        if not self.sweeps.workflows:
            return
        for key, _ in KEYS.read(store):
            for row, value in pending.queue_rows(store, key):
                yield codec.decode(PendingStart, value).workflow, row

    def _leave(self, ctx: StageContext, queue: PendingQueue, parked: Parked) -> None:
        """A start leaves a key's queue, whatever for."""
        queue.remove(parked)
        self.sweeps.remove(ctx, parked.start.workflow, parked.row)

    def on_start(self, ctx: StageContext, record: InputRecord, start: PendingStart) -> None:
        if record.key is None:
            reject(ctx, record, "a throttled start needs its throttle key")
            return
        wf = self.app.get(start.workflow)
        if wf is None:
            # Removed while it was on its way here: it would have waited here.
            self.router.fail(ctx, start, Outcome.failed, REMOVED, key=key_text(record.key),
                             headers=record.headers)
            return
        headers = record.headers
        if cancelon.discard_on_arrival(ctx, self.app, self.router, start,
                                       key_text(record.key), headers=headers):
            return
        if not wf.throttle or not applies("throttle", start.origin):
            self.router.forward(ctx, start, headers=headers)
            return
        key = record.key
        if several(wf):
            if key != self._several_key(wf):
                # Keyed for one throttle by a worker that had it declared so.
                self.router.rejudge(ctx, start, headers)
                return
            self.many.process(ctx, key, wf, start, headers)
            return
        row = ctx.table("keys").get(key) or KeyRow(wf.name)
        if row.workflow != wf.name and self.app.get(row.workflow) is None:
            # A pool's key, last paced for a member since removed: this one paces it now.
            row = replace(row, workflow=wf.name)
        queue = PendingQueue(ctx.store, key)
        # Whoever's turn has come goes before the newcomer, so the queue stays in order.
        row = self._drain(ctx, key, row, queue)
        row = self._arrive(ctx, key, row, queue, wf, wf.throttle[0], start, headers)
        self._settle(ctx, key, row, queue)

    def _rate(self, wf: Workflow, key: bytes) -> Rate:
        """The pace in force for `key` of `wf`'s one throttle: an operator's override's
        (limit and period) while one is set on its budget; else the declared one, at the
        limits table's limit for the key when the throttle declares per_key
        (admission/limits.py)."""
        option = wf.throttle[0]
        declared = Rate.of(option)
        control = self.router.control
        row = (control.override(NAME, option.shared_budget or wf.name)
               if control is not None and control.overrides else None)
        if row is not None:
            return Rate(overrides.effective(declared.limit, row),
                        overrides.effective_period(declared.period_ms, row), declared.burst)
        if option.per_key is None:
            return declared
        limit = key_limits.key_limit(self.router.limits, option.per_key, key_text(key),
                                     option.limit)
        return declared if limit == declared.limit else replace(declared, limit=limit)

    def _several_key(self, wf: Workflow) -> bytes:
        """The Kafka key every start of a workflow with several throttles comes under."""
        hop = next(h for h in self.router.routes[wf.name].hops if h.stage == NAME)
        return hop_key(wf, hop, None).encode()

    def _arrive(self, ctx: StageContext, key: bytes, row: KeyRow, queue: PendingQueue,
                wf: Workflow, option: Throttle, start: PendingStart,
                headers: Headers | None) -> KeyRow:
        now = ctx.now_ms
        rate = self._rate(wf, key)
        if len(queue) == 0:
            taken = take(row.pace, rate, now)
            if taken is not None:
                self.router.forward(ctx, start, headers=headers, key=key_text(key))
                return row.paced(taken)
        text = key_text(key)
        expires = expires_at(wf, start)
        if expires is not None and expires <= now:
            # It already waited its whole timeouts.start upstream (a debounce, say).
            self.router.fail(ctx, start, Outcome.expired, expired_reason(wf, start, text, now),
                             key=text, headers=headers)
            return row
        if option.max_queued is not None and len(queue) >= option.max_queued:
            retry_after = due_ms(row.pace, rate) - now
            self.router.decide(
                ctx, start, Outcome.dropped, key=text, retry_after_ms=retry_after,
                reason=(f"queue-full: the throttle queue of key {text!r} already holds "
                        f"{len(queue)} starts (max_queued {option.max_queued}); a place "
                        f"frees in {format_duration(retry_after)}"), headers=headers)
            return row
        parked, position = queue.park(start, priority_mode(wf), headers)
        self.sweeps.add(ctx, start.workflow, parked.row)
        record_queued(self.router, ctx, start, text, position,
                      lambda at: due_ms(row.pace, rate, at), f"key {text!r}", headers)
        if expires is not None and (row.sweep_ms is None or expires < row.sweep_ms):
            row = self._move_sweep(ctx, key, row, expires)
        return row

    # -- turns ---------------------------------------------------------------------

    def _drain(self, ctx: StageContext, key: bytes, row: KeyRow,
               queue: PendingQueue) -> KeyRow:
        """Let go every head whose turn has come; heads no declaration judges any more
        leave too (failed when their workflow is gone, passed on when it stopped
        throttling)."""
        now = ctx.now_ms
        while (head := queue.peek()) is not None:
            start = head.start
            wf = self.app.get(start.workflow)
            if wf is None or len(wf.throttle) != 1:
                self._leave(ctx, queue, head)
                self._unjudged(ctx, key, head, wf)
                continue
            taken = take(row.pace, self._rate(wf, key), now)
            if taken is None:
                break
            self._leave(ctx, queue, head)
            row = row.paced(taken)
            self.router.forward(ctx, start, headers=head.headers, key=key_text(key))
        return row

    def _unjudged(self, ctx: StageContext, key: bytes, parked: Parked,
                  wf: Workflow | None) -> None:
        if wf is None:
            self.router.fail(ctx, parked.start, Outcome.failed, REMOVED, key=key_text(key),
                             headers=parked.headers)
        elif several(wf):
            self.router.rejudge(ctx, parked.start, parked.headers)
        else:
            self.router.forward(ctx, parked.start, headers=parked.headers)

    def _settle(self, ctx: StageContext, key: bytes, row: KeyRow, queue: PendingQueue) -> None:
        """Point the key's turn timer at the head's turn (with nobody waiting: at the
        moment the key can be forgotten) and store the row, or drop the row once it says
        nothing a fresh key would not."""
        wf = self.app.get(row.workflow)
        rate = self._rate(wf, key) if wf is not None and len(wf.throttle) == 1 else None
        turn: int | None
        if len(queue) > 0:
            head = queue.peek() if rate is None else None
            member = self.app.get(head.start.workflow) if head is not None else None
            if member is not None and len(member.throttle) == 1:
                # A pool's key whose last pacer left the declarations: a member still
                # declared paces it (every member declares the same pace).
                rate = self._rate(member, key)
                row = replace(row, workflow=member.name)
            # No declaration judges the head any more: drain it at once.
            turn = due_ms(row.pace, rate) if rate is not None else ctx.now_ms
        else:
            # Nobody waits, so there is nothing to expire.
            row = self._move_sweep(ctx, key, row, None)
            forget = forget_ms(row.pace, rate) if rate is not None else None
            if forget is None or forget <= ctx.now_ms:
                if row.turn_ms is not None:
                    ctx.timers.cancel(row.turn_ms, _TURN + key)
                ctx.table("keys").delete(key)
                queue.forget()
                return
            # A timer already set fires soon enough and moves itself on, so admitting
            # with an empty queue writes no timer.
            turn = row.turn_ms if row.turn_ms is not None else forget
        if turn != row.turn_ms:
            if row.turn_ms is not None:
                ctx.timers.cancel(row.turn_ms, _TURN + key)
            ctx.timers.schedule(turn, _TURN + key)
            row = row.turning(turn)
        ctx.table("keys").put(key, row)

    def on_sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards this partition's waiting starts that match the event, read
        from the index by workflow: only the starts of the workflows it names, whatever
        else their keys' queues hold (a pool's other members)."""
        self.many.cancel_queued(ctx, sweep)
        touched: dict[bytes, PendingQueue] = {}
        for workflow in sweep.workflows:
            for row in self.sweeps.parked(ctx, workflow):
                key = pending.queue_of(row)
                queue = PendingQueue(ctx.store, key)
                parked = queue.at(row)
                if parked is None:
                    continue
                reason = cancelon.judge(self.app, self.router, ctx.stage, sweep,
                                        parked.start, cancelon.Group.of(parked.headers))
                if reason is not None:
                    self._leave(ctx, queue, parked)
                    cancelon.discard(ctx, self.router, parked.start, sweep, reason,
                                     key_text(key), headers=parked.headers)
                    touched[key] = queue
        for key, queue in touched.items():
            found = ctx.table("keys").get(key)
            if found is not None:
                self._settle(ctx, key, found, queue)

    # -- timeouts.start ----------------------------------------------------------------

    def _move_sweep(self, ctx: StageContext, key: bytes, row: KeyRow,
                    due: int | None) -> KeyRow:
        if due == row.sweep_ms:
            return row
        if row.sweep_ms is not None:
            ctx.timers.cancel(row.sweep_ms, _SWEEP + key)
        if due is not None:
            ctx.timers.schedule(due, _SWEEP + key)
        return row.sweeping(due)

    def _sweep(self, ctx: StageContext, key: bytes, row: KeyRow, queue: PendingQueue) -> KeyRow:
        """Expire every start that waited past its timeouts.start, let go those no
        declaration judges any more, and aim the sweep at the next expiry."""
        now = ctx.now_ms
        text = key_text(key)
        following: int | None = None
        for parked in list(queue):
            start = parked.start
            wf = self.app.get(start.workflow)
            if wf is None or len(wf.throttle) != 1:
                self._leave(ctx, queue, parked)
                self._unjudged(ctx, key, parked, wf)
                continue
            expires = expires_at(wf, start)
            if expires is None:
                continue
            if expires <= now:
                self._leave(ctx, queue, parked)
                self.router.fail(ctx, start, Outcome.expired, expired_reason(wf, start, text, now),
                                 key=text, headers=parked.headers)
            elif following is None or expires < following:
                following = expires
        return self._move_sweep(ctx, key, row, following)

    # -- timers and restore ---------------------------------------------------------

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if cancelon.forget(ctx, key):
            return
        kind, kafka_key = key[:1], key[1:]
        if kind in (MANY_TURN, MANY_SWEEP):
            self.many.fire(ctx, kind, kafka_key)
            return
        row = ctx.table("keys").get(kafka_key)
        if row is None:
            return
        queue = PendingQueue(ctx.store, kafka_key)
        # The runtime removed the fired timer already: the row must not cancel it again.
        if kind == _TURN:
            row = self._drain(ctx, kafka_key, row.turning(None), queue)
        elif kind == _SWEEP:
            row = self._sweep(ctx, kafka_key, row.sweeping(None), queue)
        else:
            return
        self._settle(ctx, kafka_key, row, queue)

    def restored(self, ctx: StageContext) -> None:
        """Keys whose workflow was removed (or stopped throttling) in the declarations
        this worker loaded get their sweep now, which fails (or passes on) their starts.
        It only schedules: the sweep decides in the cycle's timer pass, with the same
        code that writes the ledger rows and onFailure starts for any other sweep."""
        now = ctx.now_ms
        self.sweeps.restored(ctx, lambda: self._parked(ctx.store))
        self.many.restored(ctx)
        control = self.router.control
        paced = {r.budget for r in control.overrides.values()
                 if r.control == NAME} if control is not None else set()
        keys = ctx.table("keys")
        for key, row in list(keys.items()):
            wf = self.app.get(row.workflow)
            if wf is not None and len(wf.throttle) == 1:
                if ControlKey.parse(key).budget in paced and row.turn_ms is not None:
                    # Its pace may have been overridden while another worker had the
                    # partition: its turn is judged again now, at the pace in force.
                    ctx.timers.cancel(row.turn_ms, _TURN + key)
                    ctx.timers.schedule(now, _TURN + key)
                    keys.put(key, row.turning(now))
                continue
            keys.put(key, self._move_sweep(ctx, key, row, now))



def expires_at(wf: Workflow, start: PendingStart) -> int | None:
    timeout = wf.timeouts.start_ms if wf.timeouts is not None else None
    return None if timeout is None else start.arrived_at_ms + timeout


def expired_reason(wf: Workflow, start: PendingStart, key: str, now_ms: int) -> str:
    declared = wf.timeouts.start if wf.timeouts is not None else None
    return (f"timeouts.start: waited {format_duration(max(0, now_ms - start.arrived_at_ms))} "
            f"for a throttle turn on key {key!r}, longer than timeouts.start {declared}")
