"""Defer: debounce and batch, the controls that hold starts to make one run of many.

Step 3 of SPEC.md section 3. One stage, on one topic, serves both (a workflow declares at
most one of them): this module takes each start and timer to the control it belongs to,
`debounce.py` (starts sharing a key collapse into one, the latest payload runs) or
`batch.py` (each start is an item of one run; also a debounce's window of every event).
What both share, a group's verdict and its timer keys, is in `groups.py`.

Both: `timeouts.start` expires a group still pending that long after its first arrival,
and a group whose workflow left the declarations fails at restore. A flushed group goes
on down its route, so singleton, throttle and concurrency still judge the run.
docs/decisions/debounce-and-batch.md records the choices the spec leaves open.
"""

from __future__ import annotations

from sluicegate.admission.routing import (
    REMOVED,
    Router,
    checked_under,
    declared_digest,
    declared_table,
    mark_checked,
)
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.batch import HEADERS, Batches, batch_rule
from sluicegate.admission.stages.debounce import BURSTS, Debounces, debounce_rule
from sluicegate.admission.stages.groups import BATCHED, DEBOUNCE, RANK
from sluicegate.admission.stages.queueing import QueueStage
from sluicegate.declare import App
from sluicegate.engine.stage import InputRecord
from sluicegate.engine.timers import STATE_PREFIX, TIMER_PREFIX, parse_timer_key
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart
from sluicegate.topology.keys import ControlKey, key_text

NAME = "defer"
# The workflows declared when the partition's groups were last checked at a restore.
_CHECKED = declared_table(STATE_PREFIX + b"V")


class DeferStage(QueueStage):
    name = NAME
    tables = (*QueueStage.tables, BURSTS, HEADERS, _CHECKED)

    def __init__(self, app: App, router: Router, max_payload_bytes: int) -> None:
        super().__init__(app, router)
        self.max_payload_bytes = max_payload_bytes
        self._declared = declared_digest(app)
        self.debounces = Debounces(app, router)
        self.batches = Batches(app, router, max_payload_bytes)

    def on_start(self, ctx: StageContext, record: InputRecord, start: PendingStart) -> None:
        wf = self.app.get(start.workflow)
        if wf is None:
            self.router.fail(ctx, start, Outcome.failed, REMOVED)
            return
        hop = self.router.hop(start)
        key = record.key or b""
        debounce, batch = debounce_rule(wf), batch_rule(wf, self.max_payload_bytes)
        here = hop is not None and hop.stage == NAME
        # An item is judged as the batch of one it would be alone, as when it waits here.
        alone = (self.batches.payload_bytes([start], batch.field) if here and debounce is None
                 and batch and wf.cancel_on else None)
        if cancelon.discard_on_arrival(ctx, self.app, self.router, start, key_text(key),
                                       payload=alone):
            return
        if here and debounce is not None:
            self.debounces.arrive(ctx, wf, debounce, key, start)
        elif here and batch is not None:
            self.batches.arrive(ctx, wf, batch, key, start)
        else:
            # The declaration changed under it: this hop no longer holds anything.
            self.router.forward(ctx, start)

    def on_sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards this partition's debounced starts and batch items that match
        the event (seed 000: a queued duplicate must not start against the row just
        deleted)."""
        self.debounces.cancel_queued(ctx, sweep)
        self.batches.cancel_queued(ctx, sweep)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if cancelon.forget(ctx, key):
            return
        kind, group = key[RANK:RANK + 1], key[RANK + 1:]
        wf = self.app.get(ControlKey.parse(group).budget)
        if kind == DEBOUNCE:
            self.debounces.fire(ctx, wf, group)
        elif kind == BATCHED:
            self.batches.fire(ctx, wf, group)

    def restored(self, ctx: StageContext) -> None:
        """Groups of a workflow no longer declared fail now, not when their timer comes
        (up to a week for a debounce): their timers move to now, and `fire` fails them in
        the cycle's timer pass, with the same code as any other expiry. This reads every
        timer of the partition (seconds at a million parked keys), so it is done only when
        the workflows declared changed since the last time."""
        if checked_under(ctx, self._declared):
            return
        mark_checked(ctx, self._declared)
        now = ctx.now_ms
        for raw, _ in list(ctx.store.items(TIMER_PREFIX)):
            due_ms, key = parse_timer_key(raw)
            if cancelon.forgets(key):
                continue  # a kept sweep's, not a group's
            workflow = ControlKey.parse(key[RANK + 1:]).budget
            if due_ms > now and self.app.get(workflow) is None:
                ctx.timers.cancel(due_ms, key)
                ctx.timers.schedule(now, key)

