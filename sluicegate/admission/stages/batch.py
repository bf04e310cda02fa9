"""batch: each start is one item; the run gets `{"items": [...]}` (SPEC.md section 3,
step 3; the defer stage applies it).

The batch runs when it holds `max_size` items, when one more item would take that payload
past `max_bytes`, or `timeout` after its oldest item (a deadline, never reset). An item
failing `if` runs alone at once. The oldest item's request carries the batch (its
execution id is the run's); the others are `collapsed` into it when it runs. A debounce
that hands over every event keeps its window here too: a batch under `events` whose
deadline moves to `period` after each arrival (docs/decisions/debounce-every-event.md).
`timeouts.start` expires a batch still pending that long after its oldest item.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from pydantic import ValidationError

from sluicegate.admission.decisions import describe_invalid
from sluicegate.admission.pending import PendingQueue, priority_mode, rank_key
from sluicegate.admission.routing import REMOVED, Router
from sluicegate.admission.rows import batch_header_fields
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.groups import (
    BATCHED,
    Verdict,
    merged_slots,
    timer_key,
    verdict,
    wake,
)
from sluicegate.declare import App, Workflow, format_duration
from sluicegate.engine.tables import RAW, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas.payloads import is_sealed, validate
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart, changed
from sluicegate.topology.keys import ControlKey, key_text

# -- the pure core -------------------------------------------------------------------


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
        return verdict(self.due_ms(rule), self.expires_ms(rule), now)

    def wake_ms(self, rule: BatchRule) -> int:
        return wake(self.due_ms(rule), self.expires_ms(rule))


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


# -- the stage's half ------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Header:
    """A batch key's open batch, and where its timer is."""

    batch: OpenBatch
    wake_ms: int
    rank: bytes
    field: bytes = b"items"  # the run payload's field (`events`: a debounce's window)



# A batch key's rows: its header (batch key -> _Header), and its items in a PendingQueue
# named after the key.
HEADERS = TableSpec("batches", STATE_PREFIX + b"b", RAW, batch_header_fields(_Header, OpenBatch))



def _members(key: bytes) -> bytes:
    return b"batch\x1f" + key


class Batches:
    """The defer stage's batches (and debounce windows of events), one per key."""

    def __init__(self, app: App, router: Router, max_payload_bytes: int) -> None:
        self.app = app
        self.router = router
        self.max_payload_bytes = max_payload_bytes

    def arrive(self, ctx: StageContext, wf: Workflow, rule: BatchRule, key: bytes,
               start: PendingStart) -> None:
        """An item joins its key's batch (one already due runs first; a full one now)."""
        now = ctx.now_ms
        text = key_text(key)
        condition = wf.batch.if_expr if wf.batch is not None else None
        if condition is not None and not condition.matches(
                self.router.payloads.open(start.payload)):
            self._run(ctx, wf, text, [start], rule.field)
            return
        header = ctx.table("batches").get(key)
        if header is not None:
            verdict = header.batch.settle(rule, now)
            if verdict is not None:
                # Due before this item came (its timer has not fired yet).
                ctx.timers.cancel(header.wake_ms, timer_key(header.rank, BATCHED, key))
                self._settle(ctx, wf, rule, key, verdict)
                header = None
        added = add_item(header.batch if header else None, rule, start.execution_id,
                         len(start.payload), start.arrived_at_ms)
        if added.flush_open and header is not None:
            ctx.timers.cancel(header.wake_ms, timer_key(header.rank, BATCHED, key))
            self._settle(ctx, wf, rule, key, "run")
            header = None
        # An item's own priority means nothing (priority reads the run's payload, worked
        # out when the batch runs): zeroed, the queue keeps the items in arrival order.
        item = changed(start, priority=0.0)
        PendingQueue(ctx.store, _members(key)).push(item)
        self.router.alias(ctx, start, added.batch.execution_id)
        if added.full:
            if header is not None:
                ctx.timers.cancel(header.wake_ms, timer_key(header.rank, BATCHED, key))
            self._settle(ctx, wf, rule, key, "run")
            return
        if header is None:
            rank = rank_key(item, priority_mode(wf))
            header = _Header(added.batch, added.batch.wake_ms(rule), rank, rule.field)
            ctx.timers.schedule(header.wake_ms, timer_key(rank, BATCHED, key))
        elif rule.quiet_ms is not None:
            # A window of events: its quiet time starts again from this arrival.
            ctx.timers.cancel(header.wake_ms, timer_key(header.rank, BATCHED, key))
            header = dataclasses.replace(header, batch=added.batch,
                                         wake_ms=added.batch.wake_ms(rule))
            ctx.timers.schedule(header.wake_ms, timer_key(header.rank, BATCHED, key))
        else:
            header = dataclasses.replace(header, batch=added.batch)
        ctx.table("batches").put(key, header)
        self.router.queued(ctx, start, deferral="batch" if wf.batch is not None else "debounce",
                           key=text, due_at_ms=added.batch.due_ms(rule))

    def _take(self, ctx: StageContext, key: bytes) -> list[PendingStart]:
        """The items of `key`'s open batch in arrival order, taken (the header too)."""
        queue = PendingQueue(ctx.store, _members(key))
        members = [parked.start for parked in queue]
        queue.clear()
        ctx.table("batches").delete(key)
        return members

    def _settle(self, ctx: StageContext, wf: Workflow, rule: BatchRule, key: bytes,
                verdict: Verdict) -> None:
        members = self._take(ctx, key)
        if not members:
            return
        text = key_text(key)
        if verdict == "run":
            self._run(ctx, wf, text, members, rule.field)
            return
        assert rule.expire_ms is not None
        what = (f"batch {text!r} ran ({len(members)} items waiting)" if wf.batch is not None
                else f"debounce {text!r} ran ({len(members)} events waiting)")
        self._fail(ctx, members, Outcome.expired,
                         f"timeouts.start ({format_duration(rule.expire_ms)}) passed before "
                         f"{what}", text, rule.field)

    def _run(self, ctx: StageContext, wf: Workflow, text: str,
             members: list[PendingStart], field: bytes) -> None:
        first = members[0]
        payload = self.payload_bytes(members, field)
        what = (f"batch of {len(members)} items" if wf.batch is not None
                else f"window of {len(members)} events")
        try:
            validate(wf.payload, payload)
            data = json.loads(payload)
        except ValidationError as exc:
            self._fail(
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

    def payload_bytes(self, members: list[PendingStart], field: bytes) -> bytes:
        """The run's payload JSON, from its items opened."""
        return batch_payload([self.router.payloads.open_bytes(m.payload) for m in members],
                             field)

    def _fail(self, ctx: StageContext, members: list[PendingStart], outcome: Outcome,
              reason: str, text: str, field: bytes) -> None:
        """The batch will never run: one failure report for the would-be run (under the
        oldest item's request), and the same outcome for every item."""
        run = dataclasses.replace(members[0], payload=self.router.payloads.seal_bytes(
            is_sealed(members[0].payload), self.payload_bytes(members, field)))
        self.router.fail(ctx, run, outcome, reason, key=text)
        for member in members[1:]:
            self.router.decide(ctx, member, outcome, key=text, reason=reason)

    def cancel_queued(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards the batch items that match the event, each judged as the
        batch of one it would be alone. A batch's header is under its key, whose budget is
        always its workflow (a batch has no pool): the sweep reads the batches of the
        workflows it names, and no others."""
        batches = ctx.table("batches")
        for key, header in [row for workflow in sweep.workflows
                            for row in batches.items(ControlKey(workflow).encode())]:
            self._cancel_batched(ctx, sweep, key, header)

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
                                           payload=self.payload_bytes([item], header.field))
            if reason is None:
                kept.append(item)
                continue
            queue.remove(parked)
            cancelon.discard(ctx, self.router, item, sweep, reason, key_text(key))
        if len(kept) == len(members):
            return
        old_timer = timer_key(header.rank, BATCHED, key)
        if not kept:
            ctx.timers.cancel(header.wake_ms, old_timer)
            ctx.table("batches").delete(key)
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
        ctx.table("batches").put(key, rest)
        ctx.timers.schedule(rest.wake_ms, timer_key(rest.rank, BATCHED, key))
        if first.execution_id != header.batch.execution_id:
            # The run is now the oldest remaining item's: a repeat of another item's key
            # must name it.
            for item in kept[1:]:
                self.router.alias(ctx, item, first.execution_id)

    def fire(self, ctx: StageContext, wf: Workflow | None, key: bytes) -> None:
        """Its timer: the batch runs or expires (or, its timer moved, waits again)."""
        header = ctx.table("batches").get(key)
        if header is None:
            return
        rule = batch_rule(wf, self.max_payload_bytes) if wf is not None else None
        verdict = header.batch.settle(rule, ctx.now_ms) if rule is not None else None
        if wf is None:
            members = self._take(ctx, key)
            if members:
                self._fail(ctx, members, Outcome.failed, REMOVED, key_text(key),
                                 header.field)
        elif rule is None:
            for member in self._take(ctx, key):
                self.router.forward(ctx, member)
        elif verdict is None:
            header = dataclasses.replace(header, wake_ms=header.batch.wake_ms(rule))
            ctx.table("batches").put(key, header)
            ctx.timers.schedule(header.wake_ms, timer_key(header.rank, BATCHED, key))
        else:
            self._settle(ctx, wf, rule, key, verdict)
