"""Several throttles on one workflow: a start goes when every one of them has room
(docs/decisions/several-throttles.md).

All of the workflow's throttled starts meet under one Kafka key (the workflow's), so every
pace is judged in one place and none can be broken by another's wait. There each throttle
keeps a GCRA pace per key value (the pure core of `throttle`), and the starts wait in
lanes, one per combination of key values, FIFO (priority-ordered) within a lane.

A throttle whose key is constant (a global one) gates every lane alike. The others decide
when a lane's head could go: its *ready* time, the latest of its keys' turns. Lanes are
indexed two ways, so finding the next start never walks the lanes:

- `_WAIT`: lanes whose head waits for one of its own keys, by ready time;
- `_READY`: lanes whose head waits only for the gates, by the head's rank (priority, then
  arrival), so the gate's next turn goes to the best start among them.

A lane's ready time can only grow (paces move forward), so an index entry is a lower
bound: a lane that comes up is checked again and moves back to `_WAIT` when a key it
shares with another lane was paced meanwhile. Each key's pace row also counts the starts
waiting on it (its `max_queued`) and, once nobody waits on it, the moment it can be
forgotten, indexed in `_IDLE` so an idle key is dropped by the stage's timer, not a scan.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from sluicegate.admission import overrides
from sluicegate.admission.pending import Parked, PendingQueue, priority_mode, rank_key
from sluicegate.admission.routing import REMOVED, Router
from sluicegate.admission.rows import legacy, optional_int
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.throttle import (
    MANY_SWEEP,
    MANY_TURN,
    Pace,
    Rate,
    due_ms,
    expired_reason,
    expires_at,
    forget_ms,
    record_queued,
    several,
    take,
)
from sluicegate.declare import ExpressionError, Workflow, format_duration
from sluicegate.engine.stage import Headers
from sluicegate.engine.tables import RAW, Fields, Floors, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart
from sluicegate.topology.keys import ControlKey

_ROW = STATE_PREFIX + b"tW"     # + key -> the workflow's row (Row)
_PACE = STATE_PREFIX + b"tA"    # + key + throttle index + key text -> PaceRow
_LANE = STATE_PREFIX + b"tE"    # + key + lane -> the lane's index row
_READY = STATE_PREFIX + b"tY"   # + key + head rank + arrival + lane
_WAIT = STATE_PREFIX + b"tV"    # + key + ready ms + lane
_IDLE = STATE_PREFIX + b"tI"    # + key + forget ms + throttle index + key text
# The owner of the indexes' floors in the transaction's cache.
_INDEXES = "several throttles"
# Timers: the next turn (a lane due, the gates' turn, an idle key to forget); the sweep.
TURN = MANY_TURN
SWEEP = MANY_SWEEP
_MS = struct.Struct(">q")
_FRESH = Pace()


def _named(key: bytes) -> bytes:
    return struct.pack(">H", len(key)) + key


def shape(wf: Workflow) -> str:
    """What the lanes and paces are made of: each throttle's key. Starts that waited
    under another shape are judged again."""
    keys = json.dumps([t.key for t in wf.throttle])
    return hashlib.sha256(keys.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Row:
    """The workflow's row: its shape, how many wait, and its two timers' due times."""

    workflow: str
    shape: str
    waiting: int = 0
    turn_ms: int | None = None
    sweep_ms: int | None = None



@dataclass(frozen=True, slots=True)
class PaceRow:
    """One throttle's pace for one key value, how many wait on it, and (nobody waiting)
    the millisecond from which it is a fresh key's and can be dropped."""

    pace: Pace = _FRESH
    waiting: int = 0
    idle_at: int | None = None



# key -> the workflow's row; (key, throttle index, key text) -> a key value's pace.
ROWS = TableSpec("several", _ROW, RAW, legacy(
    Fields(Row),
    lambda t: Row(t[0], t[1], int(t[2]), optional_int(t[3]), optional_int(t[4])),
    lambda row: (row.workflow, row.shape, row.waiting, row.turn_ms, row.sweep_ms)))
PACES = TableSpec("paces", _PACE, RAW, legacy(
    Fields(PaceRow, nested={"pace": Fields(Pace)}),
    lambda t: PaceRow(Pace(optional_int(t[0]), int(t[1])), int(t[2]), optional_int(t[3])),
    lambda row: (row.pace.tat, row.pace.scale, row.waiting, row.idle_at)))


class Throttles:
    """The several-throttles half of the throttle stage, for one partition's store."""

    # Its tables: the rows and paces above, and the indexes of lanes (see the module's
    # doc) under a key, their keys binary (ranks, due times), their values the rows
    # they index.
    TABLES: tuple[TableSpec[Any, Any], ...] = (
        ROWS, PACES, *(TableSpec(name, prefix, RAW, RAW) for name, prefix in (
            ("lanes", _LANE), ("ready", _READY), ("waiting", _WAIT), ("idle", _IDLE))))

    def __init__(self, router: Router) -> None:
        self.router = router

    def _rate(self, wf: Workflow, index: int) -> Rate:
        """The pace in force for `wf`'s throttle `index`: an operator's override of that
        throttle (`workflows limit NAME --throttle L/P --nth N`, budget `<workflow>` for
        the first, `<workflow>#<index>` for the others) while one is set, else the
        declared one (docs/decisions/limit-overrides.md)."""
        declared = Rate.of(wf.throttle[index])
        control = self.router.control
        if control is None or not control.overrides:
            return declared
        row = control.override("throttle", overrides.nth_budget(wf.name, index))
        if row is None:
            return declared
        return Rate(overrides.effective(declared.limit, row),
                    overrides.effective_period(declared.period_ms, row), declared.burst)

    def overridden(self, ctx: StageContext, workflow: str) -> None:
        """An override of one of `workflow`'s throttles was set or cleared: its starts
        waiting on this partition are judged again at the paces now in force."""
        for key, row in list(ctx.table("several").items()):
            wf = self.router.workflow(row.workflow)
            if row.workflow != workflow or not several(wf) or wf is None or (
                    row.shape != shape(wf)):
                continue
            self._settle(ctx, key, wf, self._drain(ctx, key, wf, row))

    # -- keys --------------------------------------------------------------------------

    def _texts(self, wf: Workflow, start: PendingStart) -> list[str]:
        payload: Any = None
        texts = []
        for throttle in wf.throttle:
            expr = throttle.key_expr
            if expr.is_constant:
                texts.append("")
                continue
            if payload is None:
                payload = self.router.payloads.open(start.payload)
            try:
                texts.append(expr.text(payload))
            except ExpressionError:
                # As the router keys a hop: a key that cannot be evaluated is `null`.
                texts.append("null")
        return texts

    @staticmethod
    def ledger_key(wf: Workflow, texts: list[str]) -> str:
        """The key the ledger shows: the keyed throttles' key values, in declaration order
        (`acme`, or `acme, eu` under two keyed throttles)."""
        return ", ".join(t for t, th in zip(texts, wf.throttle, strict=True)
                         if not th.key_expr.is_constant)

    # -- paces ---------------------------------------------------------------------------

    def _pace_key(self, key: bytes, index: int, text: str) -> bytes:
        return _named(key) + bytes([index]) + text.encode()

    def _pace(self, ctx: StageContext, key: bytes, index: int, text: str) -> PaceRow:
        return ctx.table("paces").get(self._pace_key(key, index, text)) or PaceRow()

    def _put_pace(self, ctx: StageContext, key: bytes, index: int, text: str,
                  old: PaceRow, new: PaceRow, rate: Rate) -> None:
        """Store a key's pace row, keeping its entry in the idle index true."""
        store = ctx.store
        # Built directly, not with dataclasses.replace (several times a constructor's cost):
        # every pace of every start comes here.
        if new.waiting == 0:
            new = PaceRow(new.pace, 0, forget_ms(new.pace, rate) or ctx.now_ms)
        else:
            new = PaceRow(new.pace, new.waiting, None)
        if old.idle_at != new.idle_at:
            tail = bytes([index]) + text.encode()
            prefix = _IDLE + _named(key)
            if old.idle_at is not None:
                store.delete(prefix + _MS.pack(old.idle_at) + tail)
            if new.idle_at is not None:
                self._put_index(ctx, prefix, prefix + _MS.pack(new.idle_at) + tail)
        ctx.table("paces").put(self._pace_key(key, index, text), new)

    def _count(self, ctx: StageContext, key: bytes, wf: Workflow, texts: list[str],
               step: int) -> None:
        for index, text in enumerate(texts):
            old = self._pace(ctx, key, index, text)
            new = PaceRow(old.pace, old.waiting + step, old.idle_at)
            self._put_pace(ctx, key, index, text, old, new, self._rate(wf, index))

    def _ready(self, ctx: StageContext, key: bytes, wf: Workflow, texts: list[str],
               *, gates: bool) -> int:
        """When a start with these keys conforms to every keyed throttle (`gates`: to the
        constant-keyed ones instead), if each turn is taken on time; 0 when it already
        could have."""
        ready = 0
        for index, (throttle, text) in enumerate(zip(wf.throttle, texts, strict=True)):
            if throttle.key_expr.is_constant != gates:
                continue
            pace = self._pace(ctx, key, index, text).pace
            if pace.tat is not None:
                ready = max(ready, due_ms(pace, self._rate(wf, index)))
        return ready

    def _take(self, ctx: StageContext, key: bytes, wf: Workflow, texts: list[str],
              waited: bool) -> bool:
        """Admit one start on every pace if all conform now (`waited`: it was counted as
        waiting, and no longer is)."""
        now = ctx.now_ms
        taken: list[tuple[int, str, PaceRow, PaceRow, Rate]] = []
        for index, text in enumerate(texts):
            rate = self._rate(wf, index)
            old = self._pace(ctx, key, index, text)
            pace = take(old.pace, rate, now)
            if pace is None:
                return False
            waiting = old.waiting - 1 if waited else old.waiting
            taken.append((index, text, old, PaceRow(pace, waiting), rate))
        for index, text, old, new, rate in taken:
            self._put_pace(ctx, key, index, text, old, new, rate)
        return True

    # -- lanes -----------------------------------------------------------------------

    def _lane_queue(self, ctx: StageContext, key: bytes, lane: bytes) -> PendingQueue:
        # A name no single throttle's queue has: those are named by their Kafka key.
        return PendingQueue(ctx.store, b"\x00" + key + b"\x1f" + lane)

    def _index(self, ctx: StageContext, key: bytes, wf: Workflow, lane: bytes,
               head: Parked | None) -> None:
        """File a lane under its head's ready time, or among the ready by the head's rank
        (None: the lane is empty and leaves the indexes)."""
        store = ctx.store
        marker = _LANE + _named(key) + lane
        old = store.get(marker)
        if old is not None:
            store.delete(old)
        if head is None:
            store.delete(marker)
            self._lane_queue(ctx, key, lane).forget()
            return
        ready = self._ready(ctx, key, wf, json.loads(lane), gates=False)
        if ready > ctx.now_ms:
            prefix = _WAIT + _named(key)
            row = prefix + _MS.pack(ready) + lane
        else:
            start = head.start
            prefix = _READY + _named(key)
            row = prefix + rank_key(start, priority_mode(wf)) + _MS.pack(start.arrived_at_ms) + lane
        self._put_index(ctx, prefix, row)
        store.put(marker, row)

    @staticmethod
    def _put_index(ctx: StageContext, prefix: bytes, row: bytes) -> None:
        """Put an index row, lowering the index's floor to it when it goes below: the
        index's rows are deleted from the front, and an ordered read starts at its floor,
        not at the rows deleted before (docs/decisions/store-buffer-index.md)."""
        Floors(ctx.store, _INDEXES).put(prefix, row, b"")

    @staticmethod
    def _first(ctx: StageContext, prefix: bytes) -> bytes | None:
        """An index's first row, read from its floor (which it raises to that row)."""
        return Floors(ctx.store, _INDEXES).first(prefix)

    def _lanes(self, ctx: StageContext, key: bytes) -> Iterator[bytes]:
        prefix = _LANE + _named(key)
        for marker, _ in ctx.store.items(prefix):
            yield marker[len(prefix):]

    # -- arrival ---------------------------------------------------------------------

    def process(self, ctx: StageContext, key: bytes, wf: Workflow, start: PendingStart,
                headers: Headers | None) -> None:
        row = self._row(ctx, key, wf)
        if row.shape != shape(wf):
            # Starts waiting under throttles declared otherwise (their sweep, set at
            # restore, has not fired yet): judged again first, then this one is.
            self._sweep(ctx, key, row)
            row = Row(wf.name, shape(wf))
        row = self._drain(ctx, key, wf, row)
        row = self._arrive(ctx, key, wf, row, start, headers)
        self._settle(ctx, key, wf, row)

    def _row(self, ctx: StageContext, key: bytes, wf: Workflow) -> Row:
        return ctx.table("several").get(key) or Row(wf.name, shape(wf))

    def _arrive(self, ctx: StageContext, key: bytes, wf: Workflow, row: Row,
                start: PendingStart, headers: Headers | None) -> Row:
        now = ctx.now_ms
        texts = self._texts(wf, start)
        shown = self.ledger_key(wf, texts)
        lane = json.dumps(texts).encode()
        queue = self._lane_queue(ctx, key, lane)
        if len(queue) == 0 and self._take(ctx, key, wf, texts, waited=False):
            # After the drain, a start waiting only for the gates means the gates are
            # shut, so one that conforms everywhere jumps nobody.
            self.router.forward(ctx, start, headers=headers, key=shown)
            return row
        expires = expires_at(wf, start)
        if expires is not None and expires <= now:
            self.router.fail(ctx, start, Outcome.expired,
                             expired_reason(wf, start, shown, now), key=shown, headers=headers)
            return row
        for index, (throttle, text) in enumerate(zip(wf.throttle, texts, strict=True)):
            cap = throttle.max_queued
            waiting = self._pace(ctx, key, index, text).waiting
            if cap is not None and waiting >= cap:
                pace = self._pace(ctx, key, index, text).pace
                retry_after = max(0, due_ms(pace, self._rate(wf, index)) - now) if (
                    pace.tat is not None) else 0
                which = f"key {text!r}" if text or not throttle.key_expr.is_constant else (
                    "the workflow")
                self.router.decide(
                    ctx, start, Outcome.dropped, key=shown, retry_after_ms=retry_after,
                    reason=(f"queue-full: throttle[{index}]'s queue of {which} already "
                            f"holds {waiting} starts (max_queued {cap}); a place frees in "
                            f"{format_duration(retry_after)}"), headers=headers)
                return row
        position = queue.push(start, priority_mode(wf), headers)
        self._count(ctx, key, wf, texts, +1)
        if position == 0:
            self._index(ctx, key, wf, lane, queue.peek())
        record_queued(self.router, ctx, start, shown, position,
                      lambda at: self._due(ctx, key, wf, texts, at, row.waiting), "its lane",
                      headers)
        row = replace(row, waiting=row.waiting + 1)
        if expires is not None and (row.sweep_ms is None or expires < row.sweep_ms):
            row = self._move_sweep(ctx, key, row, expires)
        return row

    def _due(self, ctx: StageContext, key: bytes, wf: Workflow, texts: list[str],
             position: int, ahead: int) -> int:
        """When a start `position` deep in its lane, `ahead` behind the gates, goes if
        every turn is taken on time."""
        due = ctx.now_ms
        for index, (throttle, text) in enumerate(zip(wf.throttle, texts, strict=True)):
            pace = self._pace(ctx, key, index, text).pace
            if pace.tat is not None:
                deep = ahead if throttle.key_expr.is_constant else position
                due = max(due, due_ms(pace, self._rate(wf, index), deep))
        return due

    # -- turns ---------------------------------------------------------------------

    def _drain(self, ctx: StageContext, key: bytes, wf: Workflow, row: Row) -> Row:
        """Let go, best first, every head whose turn has come on all its throttles."""
        now = ctx.now_ms
        wait, ready = _WAIT + _named(key), _READY + _named(key)
        while row.waiting:
            # The lanes whose own keys' turn came are ready now (or wait again, later).
            first = self._first(ctx, wait)
            if first is not None and _MS.unpack_from(first, len(wait))[0] <= now:
                lane = first[len(wait) + _MS.size:]
                self._index(ctx, key, wf, lane, self._lane_queue(ctx, key, lane).peek())
                continue
            if self._ready(ctx, key, wf, [""] * len(wf.throttle), gates=True) > now:
                break
            first = self._first(ctx, ready)
            if first is None:
                break
            lane = first[len(ready) + 8 + _MS.size:]
            queue = self._lane_queue(ctx, key, lane)
            head = queue.peek()
            if head is None:
                self._index(ctx, key, wf, lane, None)
                continue
            texts = json.loads(lane)
            if not self._take(ctx, key, wf, texts, waited=True):
                # A key it shares with a lane let go meanwhile was paced: wait again.
                self._index(ctx, key, wf, lane, head)
                continue
            queue.remove(head)
            self._index(ctx, key, wf, lane, queue.peek())
            row = replace(row, waiting=row.waiting - 1)
            self.router.forward(ctx, head.start, headers=head.headers,
                                key=self.ledger_key(wf, texts))
        return row

    def _forget_idle(self, ctx: StageContext, key: bytes) -> int | None:
        """Drop the keys whose idle time has come; returns the next one's (None: none)."""
        prefix = _IDLE + _named(key)
        done = []
        following = None
        floors = Floors(ctx.store, _INDEXES)
        floor = floors.floor(prefix)
        for row, _ in ctx.store.items(prefix, floor):
            at = _MS.unpack_from(row, len(prefix))[0]
            if at > ctx.now_ms:
                following = at
                # The index's first row from now on: its next read starts there.
                if row != floor:
                    floors.set_floor(prefix, row)
                break
            done.append(row)
        if done and following is None:
            floors.set_floor(prefix, done[-1] + b"\x00")
        for row in done:
            tail = row[len(prefix) + _MS.size:]
            ctx.store.delete(row)
            ctx.table("paces").delete(_named(key) + tail)
        return following

    def _settle(self, ctx: StageContext, key: bytes, wf: Workflow, row: Row) -> None:
        """Aim the turn timer at the next moment something can change (a lane's own turn,
        the gates' turn while lanes are ready, an idle key to forget), or drop the row
        when nothing is left."""
        now = ctx.now_ms
        forget = self._forget_idle(ctx, key)
        due: list[int] = []
        # A lane is in the indexes while its queue holds a start: with nobody waiting,
        # both are empty and not read (the drain stops on the same count).
        if row.waiting:
            first = self._first(ctx, _WAIT + _named(key))
            if first is not None:
                due.append(_MS.unpack_from(first, len(_WAIT) + len(_named(key)))[0])
            if self._first(ctx, _READY + _named(key)) is not None:
                due.append(max(now, self._ready(ctx, key, wf, [""] * len(wf.throttle),
                                                gates=True)))
        if forget is not None:
            # No hurry to forget: a timer already set sooner fires and moves itself on,
            # so admitting with nobody waiting writes no timer.
            keep = row.turn_ms is not None and row.turn_ms <= forget
            due.append(row.turn_ms if keep and row.turn_ms is not None else forget)
        if not due and row.waiting == 0:
            if row.turn_ms is not None:
                ctx.timers.cancel(row.turn_ms, TURN + key)
            row = self._move_sweep(ctx, key, row, None)
            ctx.table("several").delete(key)
            return
        turn = min(due) if due else None
        if turn != row.turn_ms:
            if row.turn_ms is not None:
                ctx.timers.cancel(row.turn_ms, TURN + key)
            if turn is not None:
                ctx.timers.schedule(turn, TURN + key)
            row = replace(row, turn_ms=turn)
        ctx.table("several").put(key, row)

    # -- timers, sweeps, restore ---------------------------------------------------------

    def fire(self, ctx: StageContext, kind: bytes, key: bytes) -> None:
        row = ctx.table("several").get(key)
        if row is None:
            return
        # The runtime removed the fired timer already: the row must not cancel it again.
        if kind == TURN:
            row = replace(row, turn_ms=None)
        elif kind == SWEEP:
            row = replace(row, sweep_ms=None)
        else:
            return
        wf = self.router.workflow(row.workflow)
        if kind == SWEEP or not several(wf) or wf is None or row.shape != shape(wf):
            swept = self._sweep(ctx, key, row)
            if swept is None:
                return
            wf, row = swept
        row = self._drain(ctx, key, wf, row)
        self._settle(ctx, key, wf, row)

    def _move_sweep(self, ctx: StageContext, key: bytes, row: Row, due: int | None) -> Row:
        if row.sweep_ms is not None:
            ctx.timers.cancel(row.sweep_ms, SWEEP + key)
        if due is not None:
            ctx.timers.schedule(due, SWEEP + key)
        return replace(row, sweep_ms=due)

    def _parked(self, ctx: StageContext, key: bytes) -> list[tuple[bytes, PendingQueue, Parked]]:
        out = []
        for lane in list(self._lanes(ctx, key)):
            queue = self._lane_queue(ctx, key, lane)
            out += [(lane, queue, parked) for parked in queue]
        return out

    def _sweep(self, ctx: StageContext, key: bytes,
               row: Row) -> tuple[Workflow, Row] | None:
        """Expire every start that waited past its timeouts.start; when the workflow is
        gone, or its throttles were redeclared, its starts fail (or are judged again)
        and the state goes (None). Aims the sweep at the next expiry."""
        wf = self.router.workflow(row.workflow)
        now = ctx.now_ms
        if not several(wf) or wf is None or row.shape != shape(wf):
            for lane, queue, parked in self._parked(ctx, key):
                queue.remove(parked)
                if wf is None:
                    self.router.fail(ctx, parked.start, Outcome.failed, REMOVED,
                                     key=self._shown(lane), headers=parked.headers)
                else:
                    self.router.rejudge(ctx, parked.start, parked.headers)
            self._clear(ctx, key, row)
            return None
        following: int | None = None
        for lane, queue, parked in self._parked(ctx, key):
            expires = expires_at(wf, parked.start)
            if expires is None:
                continue
            if expires <= now:
                self._leave(ctx, key, wf, lane, queue, parked)
                row = replace(row, waiting=row.waiting - 1)
                shown = self.ledger_key(wf, json.loads(lane))
                self.router.fail(ctx, parked.start, Outcome.expired,
                                 expired_reason(wf, parked.start, shown, now), key=shown,
                                 headers=parked.headers)
            elif following is None or expires < following:
                following = expires
        return wf, self._move_sweep(ctx, key, row, following)

    @staticmethod
    def _shown(lane: bytes) -> str:
        # The workflow is gone, so which key was a throttle's is not known: all of them.
        return ", ".join(t for t in json.loads(lane) if t)

    def _leave(self, ctx: StageContext, key: bytes, wf: Workflow, lane: bytes,
               queue: PendingQueue, parked: Parked) -> None:
        """A start leaves its lane without a turn (expired, cancelled)."""
        was_head = queue.peek()
        queue.remove(parked)
        self._count(ctx, key, wf, json.loads(lane), -1)
        if was_head is not None and was_head.row == parked.row:
            self._index(ctx, key, wf, lane, queue.peek())

    def _clear(self, ctx: StageContext, key: bytes, row: Row) -> None:
        for spec in self.TABLES[1:]:
            table = ctx.table(spec.name)
            for k in list(table.keys(_named(key))):
                table.delete(k)
        if row.turn_ms is not None:
            ctx.timers.cancel(row.turn_ms, TURN + key)
        if row.sweep_ms is not None:
            ctx.timers.cancel(row.sweep_ms, SWEEP + key)
        ctx.table("several").delete(key)

    def cancel_queued(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards the waiting starts that match the event. All of a workflow's
        starts wait under its one key (`(one key)`, its name as budget): the sweep reads
        the rows of the workflows it names, and no others."""
        for workflow in sweep.workflows:
            key = ControlKey(workflow).encode()
            row = ctx.table("several").get(key)
            if row is None:
                continue
            wf = self.router.workflow(row.workflow)
            if not several(wf) or wf is None or row.shape != shape(wf):
                continue  # the sweep set at restore deals with these
            discarded = 0
            for lane, queue, parked in self._parked(ctx, key):
                reason = cancelon.judge(self.router.app, self.router, ctx.stage, sweep,
                                        parked.start, cancelon.Group.of(parked.headers))
                if reason is not None:
                    self._leave(ctx, key, wf, lane, queue, parked)
                    discarded += 1
                    cancelon.discard(ctx, self.router, parked.start, sweep, reason,
                                     self.ledger_key(wf, json.loads(lane)),
                                     headers=parked.headers)
            if discarded:
                self._settle(ctx, key, wf, replace(row, waiting=row.waiting - discarded))

    def restored(self, ctx: StageContext) -> None:
        """Workflows removed, or whose throttles were redeclared, in the declarations this
        worker loaded get their sweep now (it decides in the cycle's timer pass)."""
        rows = ctx.table("several")
        control = self.router.control
        paced = {r.budget.partition("#")[0] for r in control.overrides.values()
                 if r.control == "throttle"} if control is not None else set()
        for key, row in list(rows.items()):
            wf = self.router.workflow(row.workflow)
            if several(wf) and wf is not None and row.shape == shape(wf):
                if row.workflow in paced and row.waiting:
                    # A pace may have been overridden while another worker had the
                    # partition: its lanes are judged again now, at the paces in force.
                    if row.turn_ms is not None:
                        ctx.timers.cancel(row.turn_ms, TURN + key)
                    ctx.timers.schedule(ctx.now_ms, TURN + key)
                    rows.put(key, replace(row, turn_ms=ctx.now_ms))
                continue
            rows.put(key, self._move_sweep(ctx, key, row, ctx.now_ms))
