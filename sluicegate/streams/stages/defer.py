"""Defer: debounce and batch, the controls that hold starts to make one run of many.

Step 3 of SPEC.md section 3. One stage serves both (a workflow declares at most one of
them); a hop's `control` says which.

- **debounce**: starts sharing a key collapse into one pending row. Every arrival resets
  the quiet timer (`period`); the latest payload wins; `timeout` caps the wait from the
  first start of the burst. The group's execution id is fixed at its first arrival, so
  each start a later one supersedes is `collapsed` at once, naming the run that will
  absorb it; the latest start carries the group and is `admitted` with the count folded.
  A debounce declared with `events` hands the run every event instead: its window is
  kept as a batch is (`{"events": [...]}`, `max_events`, `max_bytes`) whose deadline
  moves to `period` after each arrival (docs/decisions/debounce-every-event.md).
- **batch**: each start is one item. The batch runs with `{"items": [...]}` when it holds
  `max_size` items, when one more item would take that payload past `max_bytes`, or
  `timeout` after its oldest item (a deadline, never reset). An item failing `if` runs
  alone at once. The oldest item's request carries the batch (its execution id is the
  run's); the others are `collapsed` into it when it runs.

Both: `timeouts.start` expires a group still pending that long after its first arrival
(the starvation guard of an uncapped debounce), and a group whose workflow left the
declarations fails at restore. A flushed group goes on down its route, so singleton,
throttle and concurrency still judge the run. docs/decisions/debounce-and-batch.md
records the choices the spec leaves open.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from sluicegate.declare import App, Workflow, format_duration
from sluicegate.schemas import codec
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart, Slot
from sluicegate.streams.decisions import describe_invalid, reject
from sluicegate.streams.payloads import is_sealed, validate
from sluicegate.streams.pending import PendingQueue, priority_mode, rank_key
from sluicegate.streams.routing import REMOVED, ControlStage, Router, declared_digest
from sluicegate.streams.stage import InputRecord, StageContext
from sluicegate.streams.stages import cancelon
from sluicegate.streams.timers import STATE_PREFIX, TIMER_PREFIX, parse_timer_key
from sluicegate.topology.keys import ControlKey, key_text

NAME = "defer"

# -- the pure core -------------------------------------------------------------------

# What a pending group is owed at a given moment: to run now, or to expire (timeouts.start).
Verdict = Literal["run", "expire"]


def _verdict(run_at: int, expire_at: int | None, now: int) -> Verdict | None:
    # At the same instant running wins: the start left the queue within its bound.
    if expire_at is not None and expire_at < run_at:
        return "expire" if now >= expire_at else None
    return "run" if now >= run_at else None


def _wake(run_at: int, expire_at: int | None) -> int:
    return run_at if expire_at is None else min(run_at, expire_at)


@dataclass(frozen=True, slots=True)
class DebounceRule:
    period_ms: int
    # The cap from the first start of the burst; None: uncapped.
    timeout_ms: int | None = None
    # timeouts.start, from the first arrival; None: a burst may wait forever.
    expire_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Burst:
    """One key's open debounce group."""

    execution_id: str  # fixed at the first arrival: every collapsed row names it
    carrier: str  # request id of the latest start, whose payload runs
    first_ms: int
    last_ms: int
    count: int

    def due_ms(self, rule: DebounceRule) -> int:
        quiet = self.last_ms + rule.period_ms
        return quiet if rule.timeout_ms is None else min(quiet, self.first_ms + rule.timeout_ms)

    def expires_ms(self, rule: DebounceRule) -> int | None:
        return None if rule.expire_ms is None else self.first_ms + rule.expire_ms

    def settle(self, rule: DebounceRule, now: int) -> Verdict | None:
        return _verdict(self.due_ms(rule), self.expires_ms(rule), now)

    def wake_ms(self, rule: DebounceRule) -> int:
        """When its timer is due: the run, or its expiry if that comes first."""
        return _wake(self.due_ms(rule), self.expires_ms(rule))


@dataclass(frozen=True, slots=True)
class Arrival:
    burst: Burst
    superseded: str | None  # the carrier the newcomer replaces (collapsed), if any


def arrive(burst: Burst | None, execution_id: str, request_id: str, first_ms: int,
           now: int) -> Arrival:
    """A start joins its key's burst (or opens one). The caller settles a burst that is
    already due (`Burst.settle`) before anything joins it."""
    if burst is None:
        return Arrival(Burst(execution_id, request_id, first_ms, now, 1), None)
    joined = Burst(burst.execution_id, request_id, burst.first_ms, now, burst.count + 1)
    return Arrival(joined, burst.carrier)


@dataclass(frozen=True, slots=True)
class BatchRule:
    """A batch's bounds; also a debounce's that hands over every event (a window of
    events is a batch whose deadline moves to `quiet_ms` after its latest arrival)."""

    max_size: int
    max_bytes: int
    # From the oldest item; None: uncapped (a debounce declaring no timeout).
    timeout_ms: int | None
    expire_ms: int | None = None
    quiet_ms: int | None = None
    # The field of the run's payload that holds the items.
    field: bytes = b"items"

    @property
    def empty_bytes(self) -> int:
        return len(batch_payload([], self.field))


def batch_payload(items: list[bytes], field: bytes = b"items") -> bytes:
    """The run's payload: the items' compact JSON, as written by their callers, under
    `field` (`{"items": [...]}`, or `{"events": [...]}` for a debounce)."""
    return b'{"' + field + b'":[' + b",".join(items) + b"]}"


EMPTY_BATCH_BYTES = len(batch_payload([]))


@dataclass(frozen=True, slots=True)
class OpenBatch:
    """One key's batch still collecting items."""

    execution_id: str  # the oldest item's: the run's id
    first_ms: int
    count: int
    size: int  # bytes of batch_payload(items so far)
    last_ms: int = 0  # the latest item's arrival (what a debounce's quiet time runs from)

    def due_ms(self, rule: BatchRule) -> int:
        deadline = None if rule.timeout_ms is None else self.first_ms + rule.timeout_ms
        if rule.quiet_ms is None:
            assert deadline is not None, "a batch always has a timeout"
            return deadline
        quiet = self.last_ms + rule.quiet_ms
        return quiet if deadline is None else min(quiet, deadline)

    def expires_ms(self, rule: BatchRule) -> int | None:
        return None if rule.expire_ms is None else self.first_ms + rule.expire_ms

    def settle(self, rule: BatchRule, now: int) -> Verdict | None:
        return _verdict(self.due_ms(rule), self.expires_ms(rule), now)

    def wake_ms(self, rule: BatchRule) -> int:
        return _wake(self.due_ms(rule), self.expires_ms(rule))


@dataclass(frozen=True, slots=True)
class Added:
    # The open batch runs first: this item would take its payload past max_bytes.
    flush_open: bool
    batch: OpenBatch  # the batch the item is now in
    # That batch runs now: max_size items, or no room left for another item.
    full: bool


def add_item(batch: OpenBatch | None, rule: BatchRule, execution_id: str, item_bytes: int,
             first_ms: int) -> Added:
    """An item joins its key's batch (or opens one). The caller settles a batch that is
    already due (`OpenBatch.settle`) before anything joins it."""
    flush_open = batch is not None and batch.size + 1 + item_bytes > rule.max_bytes
    if batch is None or flush_open:
        joined = OpenBatch(execution_id, first_ms, 1, rule.empty_bytes + item_bytes, first_ms)
    else:
        joined = OpenBatch(batch.execution_id, batch.first_ms, batch.count + 1,
                           batch.size + 1 + item_bytes, first_ms)
    full = joined.count >= rule.max_size or joined.size >= rule.max_bytes
    return Added(flush_open, joined, full)


def debounce_rule(wf: Workflow) -> DebounceRule | None:
    """A debounce where the latest payload runs (None: none, or one handing over every
    event, which `batch_rule` describes)."""
    if wf.debounce is None or wf.debounce.events is not None:
        return None
    expire = wf.timeouts.start_ms if wf.timeouts is not None else None
    return DebounceRule(wf.debounce.period_ms, wf.debounce.timeout_ms, expire)


def batch_rule(wf: Workflow, max_payload_bytes: int) -> BatchRule | None:
    """`max_payload_bytes`: the largest payload a run can be admitted with. A batch flushes
    before it would grow past it, whatever its declared `max_bytes`; a sealed payload
    takes a third more than its items (base64), plus the token's framing
    (docs/decisions/record-size-limit.md)."""
    expire = wf.timeouts.start_ms if wf.timeouts is not None else None
    cap = max_payload_bytes * 3 // 4 - 1024 if wf.encrypt_payloads else max_payload_bytes
    if wf.batch is not None:
        return BatchRule(wf.batch.max_size, min(wf.batch.max_bytes, cap),
                         wf.batch.timeout_ms, expire)
    debounce = wf.debounce
    if debounce is not None and debounce.events is not None:
        return BatchRule(debounce.max_events, min(debounce.max_bytes, cap),
                         debounce.timeout_ms, expire, debounce.period_ms, b"events")
    return None


def merged_slots(*lists: list[Slot]) -> list[Slot]:
    """Every hold the folded starts took (an identity key with a ttl each), once."""
    return list(dict.fromkeys(slot for slots in lists for slot in slots))


# -- the stage -----------------------------------------------------------------------

# Store rows. A debounce key: its burst (last arrival, timer, the carrier start). A batch
# key: its header, and its items in a PendingQueue named after the key.
_BURST = STATE_PREFIX + b"d"
_BATCH = STATE_PREFIX + b"b"
# The workflows declared when the partition's groups were last checked at a restore.
_CHECKED = STATE_PREFIX + b"V"
# Timer keys: rank (8 bytes) + kind + the group's Kafka key, so groups due at the same
# instant fire in priority order.
_DEBOUNCE, _BATCHED = b"d", b"b"
_RANK = 8


@dataclass(frozen=True, slots=True)
class _Held:
    """A debounce key's stored burst."""

    last_ms: int
    wake_ms: int
    rank: bytes
    carrier: PendingStart

    def burst(self) -> Burst:
        c = self.carrier
        return Burst(c.execution_id, c.request_id, c.arrived_at_ms, self.last_ms,
                     len(c.request_ids))

    def encode(self) -> bytes:
        return (f"{self.last_ms}\x1f{self.wake_ms}\x1f{self.rank.hex()}\x1f".encode()
                + codec.encode(self.carrier))

    @classmethod
    def decode(cls, raw: bytes) -> _Held:
        last, wake, rank, carrier = raw.split(b"\x1f", 3)
        return cls(int(last), int(wake), bytes.fromhex(rank.decode()),
                   codec.decode(PendingStart, carrier))


@dataclass(frozen=True, slots=True)
class _Header:
    """A batch key's open batch, and where its timer is."""

    batch: OpenBatch
    wake_ms: int
    rank: bytes
    field: bytes = b"items"  # the run payload's field (`events`: a debounce's window)

    def encode(self) -> bytes:
        b = self.batch
        return (f"{b.execution_id}\x1f{b.first_ms}\x1f{b.count}\x1f{b.size}\x1f"
                f"{self.wake_ms}\x1f{self.rank.hex()}\x1f{b.last_ms}\x1f"
                f"{self.field.decode()}").encode()

    @classmethod
    def decode(cls, raw: bytes) -> _Header:
        execution_id, first, count, size, wake, rank, *more = raw.decode().split("\x1f")
        # A header written before windows of events: a batch's, its last arrival unknown.
        last, field = (int(more[0]), more[1].encode()) if more else (int(first), b"items")
        return cls(OpenBatch(execution_id, int(first), int(count), int(size), last),
                   int(wake), bytes.fromhex(rank), field)



def _members(key: bytes) -> bytes:
    return b"batch\x1f" + key


class DeferStage(ControlStage):
    name = NAME

    def __init__(self, app: App, router: Router, max_payload_bytes: int) -> None:
        super().__init__(app, router)
        self.max_payload_bytes = max_payload_bytes
        self._declared = declared_digest(app)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        try:
            start = codec.decode_one_of((PendingStart, CancelSweep), record.value)
        except codec.DecodeError as exc:
            reject(ctx, record, f"not a pending start: {exc}")
            return
        if isinstance(start, CancelSweep):
            self._cancel_queued(ctx, start)
            return
        wf = self.app.get(start.workflow)
        if wf is None:
            self.router.fail(ctx, start, Outcome.failed, REMOVED)
            return
        hop = self.router.hop(start)
        key = record.key or b""
        debounce, batch = debounce_rule(wf), batch_rule(wf, self.max_payload_bytes)
        here = hop is not None and hop.stage == NAME
        # An item is judged as the batch of one it would be alone, as when it waits here.
        alone = (self._batch_bytes([start], batch.field) if here and debounce is None
                 and batch and wf.cancel_on else None)
        if cancelon.discard_on_arrival(ctx, self.app, self.router, start, key_text(key),
                                       payload=alone):
            return
        if here and debounce is not None:
            self._debounce(ctx, wf, debounce, key, start)
        elif here and batch is not None:
            self._batch(ctx, wf, batch, key, start)
        else:
            # The declaration changed under it: this hop no longer holds anything.
            self.router.forward(ctx, start)

    # -- debounce ------------------------------------------------------------------------

    def _debounce(self, ctx: StageContext, wf: Workflow, rule: DebounceRule, key: bytes,
                  start: PendingStart) -> None:
        now = ctx.now_ms
        text = key_text(key)
        raw = ctx.store.get(_BURST + key)
        held = _Held.decode(raw) if raw is not None else None
        if held is not None:
            verdict = held.burst().settle(rule, now)
            if verdict is not None:
                # Due before this start came (its timer has not fired yet): it runs alone.
                ctx.timers.cancel(held.wake_ms, self._timer(held.rank, _DEBOUNCE, key))
                ctx.store.delete(_BURST + key)
                self._settle_burst(ctx, wf, rule, text, held, verdict)
                held = None
        arrival = arrive(held.burst() if held else None, start.execution_id, start.request_id,
                         start.arrived_at_ms, now)
        carrier = start
        if held is not None:
            old = held.carrier
            carrier = dataclasses.replace(
                start, execution_id=old.execution_id, arrived_at_ms=old.arrived_at_ms,
                request_ids=[*old.request_ids, *start.request_ids],
                slots=merged_slots(old.slots, start.slots))
            ctx.timers.cancel(held.wake_ms, self._timer(held.rank, _DEBOUNCE, key))
            self.router.decide(
                ctx, old, Outcome.collapsed, key=text, execution_id=old.execution_id,
                reason=f"superseded by a later start with debounce key {text!r}; the latest "
                       f"payload runs as {old.execution_id}")
            self.router.alias(ctx, start, old.execution_id)
        burst = arrival.burst
        rank = rank_key(carrier, priority_mode(wf))
        stored = _Held(now, burst.wake_ms(rule), rank, carrier)
        ctx.store.put(_BURST + key, stored.encode())
        ctx.timers.schedule(stored.wake_ms, self._timer(rank, _DEBOUNCE, key))
        self.router.queued(ctx, carrier, deferral="debounce", key=text,
                           due_at_ms=burst.due_ms(rule))

    def _settle_burst(self, ctx: StageContext, wf: Workflow, rule: DebounceRule, text: str,
                      held: _Held, verdict: Verdict) -> None:
        carrier = held.carrier
        if verdict == "run":
            # The header lets a later stage judge the group by its latest arrival.
            self.router.forward(ctx, carrier, headers=cancelon.group_headers(
                wf, cancelon.Group.debounced(held.last_ms)), key=text)
            return
        assert rule.expire_ms is not None
        self.router.fail(
            ctx, carrier, Outcome.expired,
            f"timeouts.start ({format_duration(rule.expire_ms)}) passed while debounce "
            f"{text!r} waited for a quiet period of {format_duration(rule.period_ms)} "
            f"({len(carrier.request_ids)} starts folded)", key=text)

    # -- batch ---------------------------------------------------------------------------

    def _batch(self, ctx: StageContext, wf: Workflow, rule: BatchRule, key: bytes,
               start: PendingStart) -> None:
        now = ctx.now_ms
        text = key_text(key)
        condition = wf.batch.if_expr if wf.batch is not None else None
        if condition is not None and not condition.matches(
                self.router.payloads.open(start.payload)):
            self._run_batch(ctx, wf, text, [start], rule.field)
            return
        raw = ctx.store.get(_BATCH + key)
        header = _Header.decode(raw) if raw is not None else None
        if header is not None:
            verdict = header.batch.settle(rule, now)
            if verdict is not None:
                # Due before this item came (its timer has not fired yet).
                ctx.timers.cancel(header.wake_ms, self._timer(header.rank, _BATCHED, key))
                self._settle_batch(ctx, wf, rule, key, verdict)
                header = None
        added = add_item(header.batch if header else None, rule, start.execution_id,
                         len(start.payload), start.arrived_at_ms)
        if added.flush_open and header is not None:
            ctx.timers.cancel(header.wake_ms, self._timer(header.rank, _BATCHED, key))
            self._settle_batch(ctx, wf, rule, key, "run")
            header = None
        # An item's own priority means nothing (priority reads the run's payload, worked
        # out when the batch runs): zeroed, the queue keeps the items in arrival order.
        item = dataclasses.replace(start, priority=0.0)
        PendingQueue(ctx.store, _members(key)).push(item)
        self.router.alias(ctx, start, added.batch.execution_id)
        if added.full:
            if header is not None:
                ctx.timers.cancel(header.wake_ms, self._timer(header.rank, _BATCHED, key))
            self._settle_batch(ctx, wf, rule, key, "run")
            return
        if header is None:
            rank = rank_key(item, priority_mode(wf))
            header = _Header(added.batch, added.batch.wake_ms(rule), rank, rule.field)
            ctx.timers.schedule(header.wake_ms, self._timer(rank, _BATCHED, key))
        elif rule.quiet_ms is not None:
            # A window of events: its quiet time starts again from this arrival.
            ctx.timers.cancel(header.wake_ms, self._timer(header.rank, _BATCHED, key))
            header = dataclasses.replace(header, batch=added.batch,
                                         wake_ms=added.batch.wake_ms(rule))
            ctx.timers.schedule(header.wake_ms, self._timer(header.rank, _BATCHED, key))
        else:
            header = dataclasses.replace(header, batch=added.batch)
        ctx.store.put(_BATCH + key, header.encode())
        self.router.queued(ctx, start, deferral="batch" if wf.batch is not None else "debounce",
                           key=text, due_at_ms=added.batch.due_ms(rule))

    def _take_batch(self, ctx: StageContext, key: bytes) -> list[PendingStart]:
        """The items of `key`'s open batch in arrival order, taken (the header too)."""
        queue = PendingQueue(ctx.store, _members(key))
        members = [parked.start for parked in queue]
        queue.clear()
        ctx.store.delete(_BATCH + key)
        return members

    def _settle_batch(self, ctx: StageContext, wf: Workflow, rule: BatchRule, key: bytes,
                      verdict: Verdict) -> None:
        members = self._take_batch(ctx, key)
        if not members:
            return
        text = key_text(key)
        if verdict == "run":
            self._run_batch(ctx, wf, text, members, rule.field)
            return
        assert rule.expire_ms is not None
        what = (f"batch {text!r} ran ({len(members)} items waiting)" if wf.batch is not None
                else f"debounce {text!r} ran ({len(members)} events waiting)")
        self._fail_batch(ctx, members, Outcome.expired,
                         f"timeouts.start ({format_duration(rule.expire_ms)}) passed before "
                         f"{what}", text, rule.field)

    def _run_batch(self, ctx: StageContext, wf: Workflow, text: str,
                   members: list[PendingStart], field: bytes) -> None:
        first = members[0]
        payload = self._batch_bytes(members, field)
        what = (f"batch of {len(members)} items" if wf.batch is not None
                else f"window of {len(members)} events")
        try:
            validate(wf.payload, payload)
            data = json.loads(payload)
        except ValidationError as exc:
            self._fail_batch(
                ctx, members, Outcome.failed,
                f"workflow {wf.name}: the {what} does not validate against the workflow's "
                f"payload: {describe_invalid(exc)}", text, field)
            return
        run = dataclasses.replace(
            first, payload=self.router.payloads.seal_bytes(wf, payload),
            request_ids=[rid for m in members for rid in m.request_ids],
            slots=merged_slots(*(m.slots for m in members)),
            priority=wf.priority.value(data) if wf.priority is not None else 0.0)
        for member in members[1:]:
            self.router.decide(
                ctx, member, Outcome.collapsed, key=text, execution_id=run.execution_id,
                reason=(f"batched by key {text!r} into run {run.execution_id} "
                        f"with {len(members)} items") if wf.batch is not None else (
                        f"debounced by key {text!r} into run {run.execution_id}, which "
                        f"gets all {len(members)} events"))
        # The header lets a later stage judge the run item by item.
        self.router.forward(ctx, run, data, headers=cancelon.group_headers(
            wf, cancelon.Group.batched(m.arrived_at_ms for m in members)), key=text)

    def _batch_bytes(self, members: list[PendingStart], field: bytes) -> bytes:
        """The run's payload JSON, from its items opened."""
        return batch_payload([self.router.payloads.open_bytes(m.payload) for m in members],
                             field)

    def _fail_batch(self, ctx: StageContext, members: list[PendingStart], outcome: Outcome,
                    reason: str, text: str, field: bytes) -> None:
        """The batch will never run: one failure report for the would-be run (under the
        oldest item's request), and the same outcome for every item."""
        run = dataclasses.replace(members[0], payload=self.router.payloads.seal_bytes(
            is_sealed(members[0].payload), self._batch_bytes(members, field)))
        self.router.fail(ctx, run, outcome, reason, key=text)
        for member in members[1:]:
            self.router.decide(ctx, member, outcome, key=text, reason=reason)

    def _cancel_queued(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards this partition's debounced starts and batch items that match
        the event (seed 000: a queued duplicate must not start against the row just
        deleted)."""
        cancelon.keep(ctx, sweep)
        for skey, raw in list(ctx.store.items(_BURST)):
            held = _Held.decode(raw)
            c = held.carrier
            # The latest arrival is the one whose payload would run.
            reason = cancelon.group_reason(self.app, sweep, c,
                                           cancelon.Group.debounced(held.last_ms))
            if reason is None:
                continue
            key = skey[len(_BURST):]
            ctx.timers.cancel(held.wake_ms, self._timer(held.rank, _DEBOUNCE, key))
            ctx.store.delete(skey)
            cancelon.discard(ctx, self.router, c, sweep, reason, key_text(key))
        for hkey, raw in list(ctx.store.items(_BATCH)):
            self._cancel_batched(ctx, sweep, hkey[len(_BATCH):], _Header.decode(raw))

    def _cancel_batched(self, ctx: StageContext, sweep: CancelSweep, key: bytes,
                        header: _Header) -> None:
        """Discard the matching items of one pending batch (each judged as the batch of
        one it would be alone); the others still run as one batch, whose id and deadline
        are then its oldest remaining item's."""
        queue = PendingQueue(ctx.store, _members(key))
        kept: list[PendingStart] = []
        members = list(queue)
        for parked in members:
            item = parked.start
            # `match` reads the run's payload: an item is judged as a batch of one.
            reason = cancelon.group_reason(self.app, sweep, item,
                                           cancelon.Group.batched([item.arrived_at_ms]),
                                           payload=self._batch_bytes([item], header.field))
            if reason is None:
                kept.append(item)
                continue
            queue.remove(parked)
            cancelon.discard(ctx, self.router, item, sweep, reason, key_text(key))
        if len(kept) == len(members):
            return
        old_timer = self._timer(header.rank, _BATCHED, key)
        if not kept:
            ctx.timers.cancel(header.wake_ms, old_timer)
            ctx.store.delete(_BATCH + key)
            return
        wf = self.app.get(kept[0].workflow)
        rule = batch_rule(wf, self.max_payload_bytes) if wf is not None else None
        if wf is None or rule is None:
            # Its timer still comes and settles the rest (fails or passes them on).
            return
        ctx.timers.cancel(header.wake_ms, old_timer)
        first = kept[0]
        batch = OpenBatch(first.execution_id, first.arrived_at_ms, len(kept),
                          len(batch_payload([m.payload for m in kept], rule.field)),
                          kept[-1].arrived_at_ms)
        rest = _Header(batch, batch.wake_ms(rule), rank_key(first, priority_mode(wf)),
                       rule.field)
        ctx.store.put(_BATCH + key, rest.encode())
        ctx.timers.schedule(rest.wake_ms, self._timer(rest.rank, _BATCHED, key))
        if first.execution_id != header.batch.execution_id:
            # The run is now the oldest remaining item's: a repeat of another item's key
            # must name it.
            for item in kept[1:]:
                self.router.alias(ctx, item, first.execution_id)

    # -- both ----------------------------------------------------------------------------

    @staticmethod
    def _timer(rank: bytes, kind: bytes, key: bytes) -> bytes:
        return rank + kind + key

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if cancelon.forget(ctx, key):
            return
        kind, group = key[_RANK:_RANK + 1], key[_RANK + 1:]
        workflow = ControlKey.parse(group).budget
        wf = self.app.get(workflow)
        if kind == _DEBOUNCE:
            self._fire_debounce(ctx, wf, group)
        elif kind == _BATCHED:
            self._fire_batch(ctx, wf, group)

    def _fire_debounce(self, ctx: StageContext, wf: Workflow | None, key: bytes) -> None:
        raw = ctx.store.get(_BURST + key)
        if raw is None:
            return
        held = _Held.decode(raw)
        rule = debounce_rule(wf) if wf is not None else None
        verdict = held.burst().settle(rule, ctx.now_ms) if rule is not None else None
        if rule is not None and verdict is None:
            # Not owed anything yet (its timer was moved): wait for its own time again.
            held = dataclasses.replace(held, wake_ms=held.burst().wake_ms(rule))
            ctx.store.put(_BURST + key, held.encode())
            ctx.timers.schedule(held.wake_ms, self._timer(held.rank, _DEBOUNCE, key))
            return
        ctx.store.delete(_BURST + key)
        if wf is None:
            self.router.fail(ctx, held.carrier, Outcome.failed, REMOVED, key=key_text(key))
        elif rule is None:
            self.router.forward(ctx, held.carrier)
        else:
            assert verdict is not None
            self._settle_burst(ctx, wf, rule, key_text(key), held, verdict)

    def _fire_batch(self, ctx: StageContext, wf: Workflow | None, key: bytes) -> None:
        raw = ctx.store.get(_BATCH + key)
        if raw is None:
            return
        header = _Header.decode(raw)
        rule = batch_rule(wf, self.max_payload_bytes) if wf is not None else None
        verdict = header.batch.settle(rule, ctx.now_ms) if rule is not None else None
        if wf is None:
            members = self._take_batch(ctx, key)
            if members:
                self._fail_batch(ctx, members, Outcome.failed, REMOVED, key_text(key),
                                 header.field)
        elif rule is None:
            for member in self._take_batch(ctx, key):
                self.router.forward(ctx, member)
        elif verdict is None:
            header = dataclasses.replace(header, wake_ms=header.batch.wake_ms(rule))
            ctx.store.put(_BATCH + key, header.encode())
            ctx.timers.schedule(header.wake_ms, self._timer(header.rank, _BATCHED, key))
        else:
            self._settle_batch(ctx, wf, rule, key, verdict)

    def restored(self, ctx: StageContext) -> None:
        """Groups of a workflow no longer declared fail now, not when their timer comes
        (up to a week for a debounce): their timers move to now, and `fire` fails them in
        the cycle's timer pass, with the same code as any other expiry. This reads every
        timer of the partition (seconds at a million parked keys), so it is done only when
        the workflows declared changed since the last time."""
        if ctx.store.get(_CHECKED) == self._declared:
            return
        ctx.store.put(_CHECKED, self._declared)
        now = ctx.now_ms
        for raw, _ in list(ctx.store.items(TIMER_PREFIX)):
            due_ms, key = parse_timer_key(raw)
            if cancelon.forgets(key):
                continue  # a kept sweep's, not a group's
            workflow = ControlKey.parse(key[_RANK + 1:]).budget
            if due_ms > now and self.app.get(workflow) is None:
                ctx.timers.cancel(due_ms, key)
                ctx.timers.schedule(now, key)

