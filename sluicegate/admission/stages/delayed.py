"""Delayed starts (`at`): a start asked for later waits until then (SPEC.md section 2).

The identity stage parks them, after identity and before every other control, so that at
`at` they arrive at the controls as ordinary starts judged as of that moment. Each is a
timer of its own whose value is the parked start; at equal due times priority orders them.
A delayed start of a workflow removed from the declarations fails at the restore, not at
its `at`; cancelOn discards the ones that match its event. A start that carries a trace
context keeps it in a row beside its timer, which goes when the timer does.
"""

from __future__ import annotations

from sluicegate.admission.pending import HeadersCodec, priority_mode, rank_key
from sluicegate.admission.routing import REMOVED, Router
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.declare import App, Workflow
from sluicegate.engine.stage import Headers, StoreReader
from sluicegate.engine.tables import RAW, TableSpec
from sluicegate.engine.timers import STATE_PREFIX, TIMER_PREFIX, parse_timer_key, timer_key
from sluicegate.schemas import codec
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart, changed

# Timer keys of delayed starts: this, the start's rank, its request id.
_DELAYED = b"D"


# A delayed start's timer key -> its trace context (a row no idempotency key has: those
# never start with \x00).
TRACES = TableSpec("delayed.traces", STATE_PREFIX + b"\x00trace\x1f", RAW, HeadersCodec())


def is_delayed(timer: bytes) -> bool:
    return timer.startswith(_DELAYED)


class DelayedStarts:
    """The identity stage's delayed starts, one timer each."""

    TABLES = (TRACES, *cancelon.SweepIndex.TABLES)

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router
        # Where each delayed start of a workflow declaring cancelOn waits (its timer's
        # row), so a sweep reads the timers of the workflows it names and no others.
        self.sweeps = cancelon.SweepIndex(app)

    def park(self, ctx: StageContext, pending: PendingStart, at_ms: int,
             wf: Workflow, trace: Headers | None = None) -> None:
        if cancelon.discard_on_arrival(ctx, self.app, self.router, pending,
                                       pending.identity_key, headers=trace):
            return
        timer = _DELAYED + rank_key(pending, priority_mode(wf)) + pending.request_id.encode()
        ctx.timers.schedule(at_ms, timer, codec.encode(pending))
        self.sweeps.add(ctx, pending.workflow, timer_key(at_ms, timer))
        if trace is not None:
            ctx.table(TRACES.name).put(timer, trace)
        self.router.queued(ctx, pending, deferral="delayed", key=pending.identity_key,
                           due_at_ms=at_ms, headers=trace)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        """Its `at` came: an ordinary arrival, which the controls judge as of now."""
        pending = codec.decode(PendingStart, value)
        self.sweeps.remove(ctx, pending.workflow, timer_key(due_ms, key))
        self.router.forward(ctx, changed(pending, arrived_at_ms=ctx.now_ms),
                            headers=self._trace(ctx, key))

    @staticmethod
    def _trace(ctx: StageContext, timer: bytes) -> Headers | None:
        """The trace context a delayed start came with, taken from the store."""
        traces = ctx.table(TRACES.name)
        trace: Headers | None = traces.get(timer)
        if trace is not None:
            traces.delete(timer)
        return trace

    @staticmethod
    def _parked(store: StoreReader) -> list[tuple[int, bytes, PendingStart]]:
        """Every delayed start: this reads every timer of the partition (the idempotency
        keys' expiries too)."""
        out = []
        for raw, value in list(store.items(TIMER_PREFIX)):
            due_ms, key = parse_timer_key(raw)
            if is_delayed(key):
                out.append((due_ms, key, codec.decode(PendingStart, value)))
        return out

    def indexed(self, store: StoreReader) -> list[tuple[str, bytes]]:
        """(workflow, timer row) of every delayed start, for the index (none read when
        no workflow declares cancelOn)."""
        if not self.sweeps.workflows:
            return []
        return [(pending.workflow, timer_key(due_ms, key))
                for due_ms, key, pending in self._parked(store)]

    def fail_removed(self, ctx: StageContext) -> None:
        """Delayed starts of a workflow no longer declared fail now. This reads every
        timer of the partition (the idempotency keys' expiries too): the identity stage
        calls it only when the declarations changed."""
        for due_ms, key, pending in self._parked(ctx.store):
            if self.app.get(pending.workflow) is None:
                ctx.timers.cancel(due_ms, key)
                self.router.fail(ctx, pending, Outcome.failed, REMOVED,
                                 headers=self._trace(ctx, key))

    def restored(self, ctx: StageContext) -> None:
        """The index made again if the workflows declaring cancelOn changed."""
        self.sweeps.restored(ctx, lambda: self.indexed(ctx.store))

    def cancel_queued(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards the delayed starts that match the event, read from the index
        by workflow: the timers of the workflows it names, and no others."""
        for workflow in sweep.workflows:
            for row in self.sweeps.parked(ctx, workflow):
                value = ctx.store.get(row)
                if value is None:
                    continue
                pending = codec.decode(PendingStart, value)
                reason = cancelon.reason_for(self.app, sweep, pending)
                if reason is not None:
                    due_ms, key = parse_timer_key(row)
                    ctx.timers.cancel(due_ms, key)
                    self.sweeps.remove(ctx, workflow, row)
                    cancelon.discard(ctx, self.router, pending, sweep, reason,
                                     pending.identity_key, headers=self._trace(ctx, key))
