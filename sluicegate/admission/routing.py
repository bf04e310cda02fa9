"""Moving a start along its workflow's route, and the decisions every stage writes.

A stage that lets a start through calls `forward`: the start goes to the next hop's
topic, keyed by that control's key, or is admitted when no hop is left. Admission
checks the pause table first: a paused workflow's starts detour to the pause stage,
which holds them until unpause. Every decision is a ledger row (and a reply to a caller
that waits) written in the same transaction as its effect.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from sluicegate import tracing
from sluicegate.admission.control import ControlTable
from sluicegate.admission.decisions import admit, dead_letter, record_decision, reject
from sluicegate.admission.lease import Leases
from sluicegate.admission.limits import KeyLimits
from sluicegate.admission.stage import AdmissionStage, StageContext
from sluicegate.declare import App, ExpressionError, FailureReport, Workflow
from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.engine.tables import RAW, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import Payloads
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    IdentityAlias,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    Release,
    ReleaseKind,
    Slot,
    StartRequest,
    changed,
)
from sluicegate.topology.keys import ControlKey, identity_store_key, key_text
from sluicegate.topology.landing import Landings
from sluicegate.topology.route import (
    Hop,
    Route,
    control_name,
    hop_key,
    route_for,
    wraps_payload,
)

PAUSE_STAGE = "pause"
REMOVED = "workflow removed from the declarations"
# Stages that hand out a budget (a throttle turn, a slot): a paused start waits before them.
_BUDGET_STAGES = {"throttle", "concurrency"}


# Where a stage keeps the digest of the workflows it last checked its state against (a
# state row no idempotency key, queue or group can have: those never start with \x00).
DECLARED_ROW = STATE_PREFIX + b"\x00declared"


def declared_table(prefix: bytes = DECLARED_ROW) -> TableSpec[bytes, bytes]:
    """A stage's table of one row (key b""): the digest of the declarations it last checked
    its state against (`declared_digest`), under `prefix`."""
    return TableSpec("declared", prefix, RAW, RAW)


def checked_under(ctx: StageContext, digest: bytes) -> bool:
    """Whether the stage's state was last checked under the declarations of `digest`."""
    return bool(ctx.table("declared").get(b"") == digest)


def mark_checked(ctx: StageContext, digest: bytes) -> None:
    ctx.table("declared").put(b"", digest)


def declared_digest(app: App) -> bytes:
    """The workflows declared, as a digest: a stage whose state outlives a workflow
    (parked, queued, delayed starts) checks it again at restore only when this changed."""
    return hashlib.sha256("\n".join(sorted(app.workflows)).encode()).digest()


class Router:
    def __init__(self, app: App, deployment_cap: int, control: ControlTable | None,
                 limits: KeyLimits | None = None) -> None:
        self.app = app
        self.control = control
        # Per-key limits (admission/limits.py): None when no limit declares per_key.
        self.limits = limits
        self.payloads = Payloads.of(app.settings)
        self.leases = Leases(app)
        self.routes: dict[str, Route] = {
            wf.name: route_for(wf, deployment_cap) for wf in app.workflows.values()
        }
        # Where a start the worker asks for itself is produced (topology/landing.py).
        self.landings = Landings(app, deployment_cap)
        # Per workflow, the control of each hop as the ledger names it.
        self.controls: dict[str, tuple[str, ...]] = {
            wf.name: tuple(control_name(wf, hop) for hop in self.routes[wf.name].hops)
            for wf in app.workflows.values()
        }

    def workflow(self, name: str) -> Workflow | None:
        return self.app.workflows.get(name)

    def hop(self, start: PendingStart) -> Hop | None:
        """The hop a start is addressed to (None when its workflow is gone or the route
        has fewer hops than when it left: it is then admitted)."""
        route = self.routes.get(start.workflow)
        if route is None or start.hop >= len(route.hops):
            return None
        return route.hops[start.hop]

    def control_of(self, start: PendingStart) -> str | None:
        """The control of the hop `start` is at, as the ledger names it (None when its
        workflow is gone, or at identity for a start without an idempotency key)."""
        names = self.controls.get(start.workflow)
        if names is None or start.hop >= len(names):
            return None
        if start.hop == 0 and start.identity_key is None:
            return None
        return names[start.hop]

    def control_of_slot(self, workflow: str, slot: Slot) -> str | None:
        """The control a run's slot was taken by, as the ledger names it."""
        route, names = self.routes.get(workflow), self.controls.get(workflow)
        if route is None or names is None:
            return None
        budget = ControlKey.parse(slot.key).budget
        for hop, name in zip(route.hops, names, strict=True):
            if hop.stage == slot.stage and hop.budget == budget:
                return name
        return None

    def paused(self, workflow: str) -> bool:
        return self.control is not None and self.control.paused(workflow)

    # -- moving on -------------------------------------------------------------------

    def forward(self, ctx: StageContext, start: PendingStart, payload: Any = None,
                headers: Headers | None = None, key: str | None = None) -> None:
        """The current hop is done with `start`: on to the next hop that applies to its
        origin (seed 003's matrix), or admitted when none is left. `headers` (what a
        group defer let go carries, its trace context: docs/decisions/record-headers.md)
        go on with it to the next stage; at admission only its trace context goes on.
        `key`: the current hop's key text, which the admitted row shows when no hop is
        left (a hop holding a slot needs none)."""
        route = self.routes.get(start.workflow)
        wf = self.app.workflows.get(start.workflow)
        if route is None or wf is None:
            self.fail(ctx, start, Outcome.failed, REMOVED, headers=headers)
            return
        nxt = self.next_hop(route, start)
        for skipped in route.hops[start.hop + 1:nxt] if nxt > start.hop + 1 else ():
            control = skipped.control
            if wraps_payload(wf, skipped):
                # A start that batching (or a debounce handing over every event) does not
                # apply to runs as a batch of one, so the run's payload still has the
                # workflow's own shape.
                field = "items" if control == "batch" else "events"
                payload = {field: [self.payloads.open(start.payload) if payload is None
                                   else payload]}
                start = dataclasses.replace(start, payload=self.payloads.seal(wf, payload))
        last = nxt >= len(route.hops)
        if self.paused(start.workflow) and ctx.stage != PAUSE_STAGE and (
                last or route.hops[nxt].stage in _BUDGET_STAGES):
            # Paused: wait before taking a throttle turn or a slot (a paused member of a
            # pool must not sit on the pool's slots), or before admission.
            self.park_paused(ctx, start, headers)
            return
        if last:
            self.admit(ctx, start, key, headers)
            return
        hop = route.hops[nxt]
        if payload is None:
            payload = self.payloads.open(start.payload)
        moved = changed(start, hop=nxt)
        topic, next_key = ctx.topics.stage(hop.stage), self.key_for(wf, hop, payload).encode()
        # With the record itself, which the next stage takes as it is when it is handed
        # over in this process (docs/decisions/in-process-handover.md).
        ctx.send(topic, next_key, codec.encode(moved), None, headers, moved)

    @staticmethod
    def next_hop(route: Route, start: PendingStart) -> int:
        """The index of the next hop after `start`'s that applies to its origin (seed
        003's matrix); the route's length when none does."""
        nxt = start.hop + 1
        while nxt < len(route.hops) and not route.hops[nxt].applies_to(start.origin):
            nxt += 1
        return nxt

    def admits_next(self, start: PendingStart) -> bool:
        """Whether `forward` admits `start` now, in the task that forwards it: no hop
        after its own applies to it, and its workflow is not paused."""
        route = self.routes.get(start.workflow)
        return (route is not None and self.next_hop(route, start) >= len(route.hops)
                and not self.paused(start.workflow))

    def rejudge(self, ctx: StageContext, start: PendingStart,
                headers: Headers | None = None) -> None:
        """Send `start` back to this stage's hop, keyed as the declarations now say: a
        control redeclared so that its waiting starts belong under other keys (one
        throttle that became several, or several that became one) judges them again."""
        route = self.routes.get(start.workflow)
        wf = self.app.get(start.workflow)
        if route is None or wf is None:
            self.fail(ctx, start, Outcome.failed, REMOVED, headers=headers)
            return
        at = next((i for i, hop in enumerate(route.hops) if hop.stage == ctx.stage), None)
        if at is None:
            self.forward(ctx, start, headers=headers)
            return
        hop = route.hops[at]
        moved = changed(start, hop=at)
        key = self.key_for(wf, hop, self.payloads.open(start.payload)).encode()
        ctx.send(ctx.topics.stage(hop.stage), key, codec.encode(moved), None, headers, moved)

    @staticmethod
    def key_for(wf: Workflow, hop: Hop, payload: Any) -> str:
        try:
            return hop_key(wf, hop, payload)
        except ExpressionError:
            # A key that cannot be evaluated is the text null (seed 003), not a lost start.
            return str(ControlKey(hop.budget, "null"))

    def park_paused(self, ctx: StageContext, start: PendingStart,
                    headers: Headers | None = None) -> None:
        """Send `start` to the pause stage, which forwards it from where it is on unpause."""
        ctx.send(ctx.topics.stage(PAUSE_STAGE), start.workflow.encode(), codec.encode(start),
                 None, headers)
        self.queued(ctx, start, deferral="pause", key=start.workflow, control=PAUSE_STAGE,
                    headers=headers)

    def admit(self, ctx: StageContext, start: PendingStart, key: str | None = None,
              headers: Headers | None = None) -> None:
        """Admit now (`forward` has already checked the pause table). The ledger row shows
        the key of the last control the start passed: `key`, else the slot it took there,
        else its idempotency key. The admitted start and the row carry the trace context
        among `headers`."""
        now = ctx.now_ms
        trace = tracing.trace_of(headers) if headers else None
        lease = self.leases.for_run(start.workflow, start.slots)
        # Positional, as the ledger row below.
        admit(ctx, AdmittedStart(
            start.execution_id, start.workflow, start.payload, start.declaration_version,
            start.origin, start.kind, list(start.slots), list(start.request_ids),
            start.requested_at_ms, now, start.retry_of, lease[0] if lease else None,
            lease[1] if lease else None,
        ), trace)
        if start.kind is AdmittedKind.start:
            self.decide(ctx, start, Outcome.admitted, execution_id=start.execution_id,
                        folded=len(start.request_ids) - 1,
                        key=key if key is not None else self._passed_key(start),
                        headers=trace)

    def _passed_key(self, start: PendingStart) -> str | None:
        route = self.routes.get(start.workflow)
        if route is None or start.hop >= len(route.hops):
            return None
        stage = route.hops[start.hop].stage
        if start.hop == 0:
            return start.identity_key
        for slot in reversed(start.slots):
            if slot.stage == stage:
                return key_text(slot.key)
        return None

    # -- decisions -------------------------------------------------------------------

    def queued(self, ctx: StageContext, start: PendingStart, *, deferral: str,
               key: str | None, due_at_ms: int | None = None,
               position: int | None = None, control: str | None = None,
               reason: str | None = None, headers: Headers | None = None) -> None:
        """A start parked by a control: not final, its final outcome comes later."""
        self.decide(ctx, start, Outcome.queued, key=key, deferral=deferral,
                    due_at_ms=due_at_ms, position=position, control=control, reason=reason,
                    headers=headers)

    def decide(self, ctx: StageContext, start: PendingStart, outcome: Outcome, *,
               key: str | None = None, reason: str | None = None,
               execution_id: str | None = None, folded: int = 0,
               retry_after_ms: int | None = None, deferral: str | None = None,
               due_at_ms: int | None = None, position: int | None = None,
               request_id: str | None = None, control: str | None = None,
               headers: Headers | None = None) -> None:
        """A ledger row (and a reply to a waiting caller) about `start`'s open request,
        or about `request_id` when a folded request is decided on its own. `control`:
        what `key` belongs to, when it is not the control of the hop the start is at.
        `headers`: the start's, whose trace context the row carries."""
        now = ctx.now_ms
        own = request_id is None or request_id == start.request_id
        # Positional: every gated start writes two of these, and a keyword call costs
        # twice as much (records-built-in-python.md).
        record_decision(ctx, LedgerRecord(
            start.request_id if own else str(request_id), start.workflow, outcome,
            start.requested_at_ms, now, max(0, now - start.arrived_at_ms), folded, key,
            ctx.stage, reason, execution_id, retry_after_ms, deferral, due_at_ms, position,
            start.declaration_version, None,
            control if control is not None else self.control_of(start),
        ), start.reply_partition if own else None,
            tracing.trace_of(headers) if headers else None)


    # -- failure -------------------------------------------------------------------------

    def fail(self, ctx: StageContext, start: PendingStart, outcome: Outcome, reason: str, *,
             key: str | None = None, headers: Headers | None = None) -> None:
        """A queued start that will never run (timeouts.start, its workflow removed): the
        ledger says why, and its onFailure workflow is started with the failure report,
        both in the trace among the start's `headers`."""
        self.decide(ctx, start, outcome, key=key, reason=reason, headers=headers)
        self.give_back(ctx, start, reason)
        self.notify_failure(ctx, workflow=start.workflow, on_failure=start.on_failure,
                            payload=start.payload, reason=reason, execution_id=None,
                            tag=f"{outcome.value}:{start.request_id}",
                            trace=tracing.trace_of(headers) if headers else None)

    def give_up(self, ctx: StageContext, record: InputRecord, reason: str) -> None:
        """`record` will not be processed (`Stage.unprocessable`): a dead letter with the
        reason, and the decision its request is owed: a start request is `rejected`, a
        start between controls `failed` (with its onFailure notified)."""
        try:
            message = codec.decode_one_of((StartRequest, PendingStart), record.value)
        except codec.DecodeError:
            dead_letter(ctx, record, reason)
            return
        if isinstance(message, StartRequest):
            reject(ctx, record, reason, message)
            return
        dead_letter(ctx, record, reason)
        self.fail(ctx, message, Outcome.failed, reason, headers=record.headers)

    @staticmethod
    def alias(ctx: StageContext, start: PendingStart, execution_id: str) -> None:
        """`start` will not run as itself but as `execution_id` (folded into another run, or
        skipped for the singleton holder): a repeat of its idempotency key must answer with
        that run (SPEC.md section 3, step 1), so tell the identity stage."""
        if start.identity_key is None or start.execution_id == execution_id:
            return
        skey = identity_store_key(start.workflow, start.identity_key)
        ctx.send(ctx.topics.stage("identity"), skey, codec.encode(IdentityAlias(
            key=skey.decode(), execution_id=execution_id, request_id=start.request_id)))

    @staticmethod
    def give_back(ctx: StageContext, start: PendingStart, reason: str) -> None:
        """A start that will never run gives back the holds it took on its way (an earlier
        limit's slot, a singleton hold, an identity key with a ttl)."""
        release_slots(ctx, start.execution_id, start.workflow, start.slots,
                      ReleaseKind.ended, reason)

    def notify_failure(self, ctx: StageContext, *, workflow: str, on_failure: str | None,
                       payload: bytes, reason: str, execution_id: str | None,
                       tag: str, run_id: str | None = None, error_tag: str | None = None,
                       error_message: str | None = None, trace: Headers | None = None) -> None:
        """Start `on_failure` with a FailureReport (SPEC.md: onFailure), in the trace of what
        failed (`trace`). A handler's own failure is not reported again: there is no
        onFailure for an onFailure."""
        if on_failure is None or self.is_failure_handler(workflow):
            return
        handler = self.app.get(on_failure)
        if handler is None:
            return
        now = ctx.now_ms
        report = FailureReport(
            workflow=workflow, payload=self.payloads.for_report(payload, handler),
            error_tag=error_tag,
            error_message=error_message, run_id=run_id, execution_id=execution_id,
            reason=reason, failed_at=now,
        )
        # Named after what failed, so a replayed cycle asks for the same start again.
        request_id = f"failure:{workflow}:{tag}"
        data = report.model_dump(mode="json")
        request = StartRequest(
            request_id=request_id, workflow=on_failure,
            payload=self.payloads.seal(handler, data), origin=Origin.event,
            requested_at_ms=now,
        )
        # Keyed as the SDK keys a start: where the handler's first control decides it.
        ctx.send(ctx.topics.starts, self.landings.key(request, data), codec.encode(request),
                 None, trace)

    def is_failure_handler(self, workflow: str) -> bool:
        return any(wf.on_failure == workflow for wf in self.app.workflows.values())


class ControlStage(AdmissionStage):
    """A stage fed by its own topic (`sg.stage.<name>`) that moves starts on through the
    router: what every control stage shares."""

    def __init__(self, app: App, router: Router) -> None:
        self.app = app
        self.router = router

    def unprocessable(self, ctx: StageContext, record: InputRecord, reason: str) -> None:
        self.router.give_up(ctx, record, reason)


def release_slots(ctx: StageContext, execution_id: str, workflow: str, slots: list[Slot],
                  kind: ReleaseKind, reason: str | None, stages: set[str] | None = None) -> None:
    """Send a Release for each of `slots` (or those on `stages`) to the stage that owns it."""
    for slot in slots:
        if stages is not None and slot.stage not in stages:
            continue
        ctx.send(ctx.topics.stage(slot.stage), slot.key.encode(), codec.encode(Release(
            stage=slot.stage, key=slot.key, execution_id=execution_id, workflow=workflow,
            kind=kind, at_ms=ctx.now_ms, reason=reason,
        )))


def with_slot(start: PendingStart, stage: str, key: str) -> PendingStart:
    """`start`, now holding a slot on `stage`'s `key` until its run ends."""
    return changed(start, slots=[*start.slots, Slot(stage, key)])
