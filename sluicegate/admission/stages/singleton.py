"""Singleton: one active run per key (SPEC.md section 3, step 4).

A start that passes this stage holds its singleton key until the engine reports its run
ended (completed, failed, cancelled); a sleeping or suspended run still holds it. The
hold is a slot on the start (`routing.with_slot`), so the runs stage sends the release.

- `skip`: a newcomer that finds the key held stands down: `skipped`, with the holder's
  execution id (a waiting caller gets SingletonHeld).
- `cancel`: the newcomer evicts the holder, but only once it is admitted itself. A
  replacement that a later control (throttle, concurrency, a pause) queues waits as a
  *claim* on the key, and the holder keeps running until the claim's admission is
  reported; among several claims the latest to arrive here wins, whatever order their
  admissions are reported in (docs/decisions/singleton-cancel-timing.md).
- `queue`: a newcomer that finds the key held waits, one per key, a later one replacing
  it; the waiting start is admitted when the holder's run ends (`singleton_queue.py`,
  docs/decisions/singleton-queue-mode.md).

The state is one `Hold` row per key (the hop key: workflow and key text); `holder` reads
it for operators, with no lag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, Protocol

from sluicegate import tracing
from sluicegate.admission.decisions import reject
from sluicegate.admission.routing import Router, with_slot
from sluicegate.admission.rows import hold_fields
from sluicegate.admission.stage import AdmissionStage, StageContext
from sluicegate.admission.stages import cancelon, singleton_queue
from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.engine.tables import TEXT, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedStart,
    CancelSweep,
    CommandKind,
    EngineCommand,
    Outcome,
    PendingStart,
    Release,
    ReleaseKind,
)
from sluicegate.topology.keys import ControlKey, key_text

NAME = "singleton"
_HOLD = STATE_PREFIX + b"H"

Mode = Literal["skip", "cancel", "queue"]

# -- the pure core -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claim:
    execution_id: str
    # Arrival order at this key: between two replacements, the later one wins.
    seq: int


@dataclass(frozen=True, slots=True)
class Hold:
    """Who holds one key, and (cancel mode) the replacements not admitted yet."""

    holder: Claim | None = None
    claims: tuple[Claim, ...] = ()
    next_seq: int = 0

    @property
    def empty(self) -> bool:
        return self.holder is None and not self.claims


# A singleton key -> its hold (docs/decisions/singleton-hold-row.md).
HOLDS = TableSpec("holds", _HOLD, TEXT, hold_fields(Hold, Claim))


@dataclass(frozen=True, slots=True)
class Skip:
    """The newcomer stands down; `holder` is the run that has the key."""

    holder: str


@dataclass(frozen=True, slots=True)
class Wait:
    """(`queue` mode) The newcomer waits for `holder`'s run to end."""

    holder: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Ask the engine to cancel `execution_id`: `replaced_by` now has the key."""

    execution_id: str
    replaced_by: str


def arrive(hold: Hold, execution_id: str, mode: Mode,
           admitted_now: bool) -> tuple[Hold, Skip | Wait | Cancel | None]:
    """A start reaches the key. Anything but Skip and Wait lets it through; `admitted_now` says
    no later control can hold it back, so it starts in this very decision."""
    # Rows built directly, not with dataclasses.replace (several times a constructor's
    # cost): this runs for every start through the stage.
    claim = Claim(execution_id, hold.next_seq)
    if mode != "cancel":
        if hold.holder is not None:
            held_by = hold.holder.execution_id
            return hold, Skip(held_by) if mode == "skip" else Wait(held_by)
        return Hold(claim, hold.claims, hold.next_seq + 1), None
    claimed = Hold(hold.holder, (*hold.claims, claim), hold.next_seq + 1)
    if not admitted_now:
        return claimed, None
    return admitted(claimed, execution_id)


def admitted(hold: Hold, execution_id: str) -> tuple[Hold, Cancel | None]:
    """A run carrying this key's slot was admitted. Only a waiting claim reacts: it
    evicts the holder, or, when a later claim already holds the key, is itself cancelled."""
    claim = next((c for c in hold.claims if c.execution_id == execution_id), None)
    if claim is None:
        return hold, None
    rest = tuple(c for c in hold.claims if c is not claim)
    incumbent = hold.holder
    if incumbent is None:
        return dataclasses.replace(hold, holder=claim, claims=rest), None
    if incumbent.seq > claim.seq:
        return (dataclasses.replace(hold, claims=rest),
                Cancel(claim.execution_id, incumbent.execution_id))
    return (dataclasses.replace(hold, holder=claim, claims=rest),
            Cancel(incumbent.execution_id, claim.execution_id))


def released(hold: Hold, execution_id: str) -> Hold:
    """A run gave the key back. A release of a run that holds nothing changes nothing."""
    holder = hold.holder
    if holder is not None and holder.execution_id == execution_id:
        holder = None
    claims = tuple(c for c in hold.claims if c.execution_id != execution_id)
    return Hold(holder, claims, hold.next_seq)


# -- reading the state (ops: "which run holds this key") -----------------------------


class Readable(Protocol):
    def get(self, key: bytes) -> bytes | None: ...


def hold_key(workflow: str, key: str) -> str:
    """The stage's key for a workflow's singleton key text: its hop key (the singleton's
    budget is always its own workflow), which is also the slot key its runs hold."""
    return str(ControlKey(workflow, key))


def partition_of(workflow: str, key: str, partitions: int) -> int:
    """The partition whose singleton store keeps this key."""
    return partition_for(hold_key(workflow, key).encode(), partitions)


def holder(store: Readable, workflow: str, key: str) -> str | None:
    """The execution id of the run holding `workflow`'s singleton `key`, read from the
    store of the partition that owns it (a StoreTransaction or a PartitionStore)."""
    raw = store.get(_HOLD + hold_key(workflow, key).encode())
    if raw is None:
        return None
    current = HOLDS.value.decode(raw).holder
    return current.execution_id if current is not None else None


# -- the stage -----------------------------------------------------------------------


class SingletonStage(AdmissionStage):
    name = NAME
    tables = (HOLDS, *singleton_queue.TABLES, *cancelon.KEPT_TABLES)

    def __init__(self, router: Router) -> None:
        self.router = router
        # Whether a start may wait here (`queue` mode): only then does a holder's end look
        # for one, so the other modes' releases cost no extra read.
        self.queues = any(wf.singleton is not None and wf.singleton.mode == "queue"
                          for wf in router.app.workflows.values())

    def restored(self, ctx: StageContext) -> None:
        if not self.queues and singleton_queue.any_waiting(ctx.store):
            # Declared `queue` before a redeploy that dropped it: what waits still goes.
            self.queues = True

    def unprocessable(self, ctx: StageContext, record: InputRecord, reason: str) -> None:
        self.router.give_up(ctx, record, reason)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        try:
            key = codec.decode_key(record.key)
            message = codec.decode_one_of((PendingStart, Release, AdmittedStart, CancelSweep),
                                          record.value)
        except codec.DecodeError as exc:
            reject(ctx, record,
                   f"not a singleton start, release, admission or cancelOn sweep: {exc}")
            return
        if isinstance(message, PendingStart):
            self._arrive(ctx, key, message, record.headers)
        elif isinstance(message, AdmittedStart):
            self._admitted(ctx, key, message, record.headers)
        elif isinstance(message, CancelSweep):
            # `queue` mode's waiting starts (every other start only passes through here).
            cancelon.keep(ctx, message)
            singleton_queue.sweep(ctx, self.router.app, self.router, message)
        elif message.kind is not ReleaseKind.suspended:
            # A suspended run is still active: it keeps the key.
            hold = self._load(ctx, key)
            after = released(hold, message.execution_id)
            if self.queues and after.holder is None and hold.holder is not None:
                after = self._admit_waiting(ctx, key, after)
            if after != hold:
                self._save(ctx, key, after)

    def _admit_waiting(self, ctx: StageContext, key: str, hold: Hold) -> Hold:
        """(`queue` mode) The holder ended: the start waiting for the key takes it and
        goes on, in this same transaction."""
        found = singleton_queue.take(ctx, self.router, key)
        if found is None:
            return hold
        start, headers = found
        # The key is free: it takes it as any start that finds it free does.
        hold, _ = arrive(hold, start.execution_id, "queue", admitted_now=True)
        self.router.forward(ctx, with_slot(start, self.name, key), headers=headers)
        return hold

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if not cancelon.forget(ctx, key):
            singleton_queue.fire(ctx, self.router, due_ms, key)

    def _arrive(self, ctx: StageContext, key: str, start: PendingStart,
                headers: Headers | None) -> None:
        wf = self.router.workflow(start.workflow)
        hop = self.router.hop(start)
        if wf is None or wf.singleton is None or wf.singleton.mode is None \
                or hop is None or hop.stage != self.name:
            # Its declaration changed on the way here and has no singleton now.
            self.router.forward(ctx, start, headers=headers)
            return
        route = self.router.routes[wf.name]
        # Every hop after this one applies to any origin that reaches it (singleton skips
        # only `invoke`), so with none left the start is admitted by this very forward.
        admitted_now = start.hop + 1 >= len(route.hops) and not self.router.paused(wf.name)
        hold, decision = arrive(self._load(ctx, key), start.execution_id, wf.singleton.mode,
                                admitted_now)
        text = key_text(key)
        if isinstance(decision, Skip):
            reason = f"singleton key {text!r} is held by run {decision.holder}"
            self.router.decide(ctx, start, Outcome.skipped, key=text,
                               execution_id=decision.holder, reason=reason, headers=headers)
            # The skipped start never runs: its key answers with the holder from now on,
            # and whatever it held on its way is given back.
            self.router.alias(ctx, start, decision.holder)
            self.router.give_back(ctx, start, reason)
            return
        if isinstance(decision, Wait):
            singleton_queue.wait(ctx, self.router.app, self.router, wf, key, start,
                                 decision.holder, headers)
            return
        self._save(ctx, key, hold)
        if decision is not None:
            self._cancel(ctx, wf.name, text, decision,
                         tracing.trace_of(headers) if headers else None)
        # Headers (a group defer let go) go on with it to the next stage.
        self.router.forward(ctx, with_slot(start, self.name, key), headers=headers)

    def _admitted(self, ctx: StageContext, key: str, start: AdmittedStart,
                  headers: Headers | None) -> None:
        before = self._load(ctx, key)
        hold, cancel = admitted(before, start.execution_id)
        if hold != before:
            self._save(ctx, key, hold)
        if cancel is not None:
            self._cancel(ctx, start.workflow, key_text(key), cancel,
                         tracing.trace_of(headers) if headers else None)

    def _cancel(self, ctx: StageContext, workflow: str, text: str, cancel: Cancel,
                trace: Headers | None = None) -> None:
        """Cancel the run a replacement evicts, in the trace of the replacement (`trace`)."""
        command = EngineCommand(
            # Named by the pair, so a replayed decision sends the same command.
            command_id=f"singleton:{cancel.execution_id}:{cancel.replaced_by}",
            execution_id=cancel.execution_id, workflow=workflow, kind=CommandKind.cancel,
            issued_at_ms=ctx.now_ms,
            reason=f"singleton key {text!r}: replaced by run {cancel.replaced_by}",
        )
        ctx.send(ctx.topics.commands, cancel.execution_id.encode(), codec.encode(command), None,
                 trace)

    @staticmethod
    def _load(ctx: StageContext, key: str) -> Hold:
        hold: Hold | None = ctx.table("holds").get(key)
        return hold or Hold()

    @staticmethod
    def _save(ctx: StageContext, key: str, hold: Hold) -> None:
        if hold.empty:
            ctx.table("holds").delete(key)
        else:
            ctx.table("holds").put(key, hold)
