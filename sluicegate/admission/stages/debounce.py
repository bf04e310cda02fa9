"""debounce: starts sharing a key collapse into one pending start (SPEC.md section 3, step 3;
the defer stage applies it).

Every arrival resets the quiet timer (`period`); the latest payload wins; `timeout` caps
the wait from the first start of the burst. The group's execution id is fixed at its first
arrival, so each start a later one supersedes is `collapsed` at once, naming the run that
will absorb it; the latest start carries the group and is `admitted` with the count
folded. A debounce declared with `events` hands the run every event instead, kept as a
batch is (`batch.py`; docs/decisions/debounce-every-event.md). `timeouts.start` expires a
burst still pending that long after its first arrival (the starvation guard of an
uncapped debounce). docs/decisions/debounce-and-batch.md records the choices the spec
leaves open.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sluicegate.admission.pending import priority_mode, rank_key
from sluicegate.admission.routing import REMOVED, Router
from sluicegate.admission.rows import burst_fields
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.groups import (
    DEBOUNCE,
    Verdict,
    merged_slots,
    timer_key,
    verdict,
    wake,
)
from sluicegate.declare import App, Workflow, format_duration
from sluicegate.engine.tables import RAW, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart, changed
from sluicegate.topology.keys import ControlKey, key_text

# -- the pure core -------------------------------------------------------------------


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
        return verdict(self.due_ms(rule), self.expires_ms(rule), now)

    def wake_ms(self, rule: DebounceRule) -> int:
        """When its timer is due: the run, or its expiry if that comes first."""
        return wake(self.due_ms(rule), self.expires_ms(rule))


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


def debounce_rule(wf: Workflow) -> DebounceRule | None:
    """A debounce where the latest payload runs (None: none, or one handing over every
    event, which `batch_rule` describes)."""
    if wf.debounce is None or wf.debounce.events is not None:
        return None
    expire = wf.timeouts.start_ms if wf.timeouts is not None else None
    return DebounceRule(wf.debounce.period_ms, wf.debounce.timeout_ms, expire)


# -- the stage's half ------------------------------------------------------------------

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



# A debounce key -> its burst (last arrival, timer, the carrier start).
BURSTS = TableSpec("bursts", STATE_PREFIX + b"d", RAW, burst_fields(_Held))


class Debounces:
    """The defer stage's debounce groups, one burst per key."""

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router

    def arrive(self, ctx: StageContext, wf: Workflow, rule: DebounceRule, key: bytes,
               start: PendingStart) -> None:
        """A start joins its key's burst (one already due runs alone first)."""
        now = ctx.now_ms
        text = key_text(key)
        bursts = ctx.table("bursts")
        held = bursts.get(key)
        if held is not None:
            verdict = held.burst().settle(rule, now)
            if verdict is not None:
                # Due before this start came (its timer has not fired yet): it runs alone.
                ctx.timers.cancel(held.wake_ms, timer_key(held.rank, DEBOUNCE, key))
                bursts.delete(key)
                self._settle(ctx, wf, rule, text, held, verdict)
                held = None
        arrival = arrive(held.burst() if held else None, start.execution_id, start.request_id,
                         start.arrived_at_ms, now)
        carrier = start
        if held is not None:
            old = held.carrier
            carrier = changed(
                start, execution_id=old.execution_id, arrived_at_ms=old.arrived_at_ms,
                request_ids=[*old.request_ids, *start.request_ids],
                slots=merged_slots(old.slots, start.slots))
            ctx.timers.cancel(held.wake_ms, timer_key(held.rank, DEBOUNCE, key))
            self.router.decide(
                ctx, old, Outcome.collapsed, key=text, execution_id=old.execution_id,
                reason=f"superseded by a later start with debounce key {text!r}; the latest "
                       f"payload runs as {old.execution_id}")
            self.router.alias(ctx, start, old.execution_id)
        burst = arrival.burst
        rank = rank_key(carrier, priority_mode(wf))
        stored = _Held(now, burst.wake_ms(rule), rank, carrier)
        bursts.put(key, stored)
        ctx.timers.schedule(stored.wake_ms, timer_key(rank, DEBOUNCE, key))
        self.router.queued(ctx, carrier, deferral="debounce", key=text,
                           due_at_ms=burst.due_ms(rule))

    def _settle(self, ctx: StageContext, wf: Workflow, rule: DebounceRule, text: str,
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

    def cancel_queued(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards the bursts whose latest start matches the event. A burst's
        row is under its key, whose budget is always its workflow (a debounce has no
        pool): the sweep reads the rows of the workflows it names, and no others."""
        bursts = ctx.table("bursts")
        for key, held in [row for workflow in sweep.workflows
                          for row in bursts.items(ControlKey(workflow).encode())]:
            c = held.carrier
            # The latest arrival is the one whose payload would run.
            reason = cancelon.group_reason(self.app, sweep, c,
                                           cancelon.Group.debounced(held.last_ms))
            if reason is None:
                continue
            ctx.timers.cancel(held.wake_ms, timer_key(held.rank, DEBOUNCE, key))
            bursts.delete(key)
            cancelon.discard(ctx, self.router, c, sweep, reason, key_text(key))

    def fire(self, ctx: StageContext, wf: Workflow | None, key: bytes) -> None:
        """Its timer: the burst runs or expires (or, its timer moved, waits again)."""
        bursts = ctx.table("bursts")
        held = bursts.get(key)
        if held is None:
            return
        rule = debounce_rule(wf) if wf is not None else None
        verdict = held.burst().settle(rule, ctx.now_ms) if rule is not None else None
        if rule is not None and verdict is None:
            # Not owed anything yet (its timer was moved): wait for its own time again.
            held = dataclasses.replace(held, wake_ms=held.burst().wake_ms(rule))
            bursts.put(key, held)
            ctx.timers.schedule(held.wake_ms, timer_key(held.rank, DEBOUNCE, key))
            return
        bursts.delete(key)
        if wf is None:
            self.router.fail(ctx, held.carrier, Outcome.failed, REMOVED, key=key_text(key))
        elif rule is None:
            self.router.forward(ctx, held.carrier)
        else:
            assert verdict is not None
            self._settle(ctx, wf, rule, key_text(key), held, verdict)
