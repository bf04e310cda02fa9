"""Concurrency: at most `limit` runs in flight per key, across every worker (SPEC.md
section 3, steps 6 and 7).

Each hop of a workflow's route that is a concurrency limit (its own, a pool, a shared key
expression, or the deployment-wide cap) arrives here keyed by `budget \\x1f key text`, so
one task owns one budget key and its count of slots held is exact whatever the number of
workers. A start that finds a free slot takes it (a `Slot` on the start, released by the
runs stage when the run ends) and goes on; the excess waits in the key's queue and is
admitted as slots free. The queue is a FairQueue: by priority, then round-robin across the
lanes that share the key (in age mode by waiting time with the boost, across lanes too;
docs/decisions/fairness-across-keys.md).

A `steps`-mode slot is also given back while the run is suspended; the run must then be
re-admitted here (a `resume` start) before it resumes. Over `max_queued` a start is
dropped (`queue-full`); one waiting longer than `timeouts.start` expires; one whose
workflow left the declarations while it waited fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from sluicegate.admission import floors, overrides, pending
from sluicegate.admission import limits as key_limits
from sluicegate.admission.decisions import RUNS_STAGE
from sluicegate.admission.pending import COUNTED, FairQueue, Parked, priority_mode
from sluicegate.admission.routing import (
    REMOVED,
    Router,
    checked_under,
    declared_table,
    mark_checked,
    with_slot,
)
from sluicegate.admission.rows import legacy
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.queueing import QueueStage
from sluicegate.admission.stages.runs import RUNS
from sluicegate.declare import App, ExpressionError, Workflow, format_duration
from sluicegate.engine.stage import Headers, InputRecord, StoreReader
from sluicegate.engine.tables import (
    SIZED,
    SIZED_TEXT,
    Decimal,
    Fields,
    TableSpec,
    derived_prefixes,
)
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    LIVE,
    AdmittedKind,
    CancelSweep,
    Outcome,
    OverrideRow,
    PendingStart,
    Release,
    ReleaseKind,
    RunStatus,
    record,
)
from sluicegate.topology.keys import ControlKey, key_text
from sluicegate.topology.route import DEPLOYMENT_BUDGET, Hop, Route

NAME = "concurrency"



@record
class Holder:
    """A run holding a slot of a key: its workflow, and which of its limits it is."""

    workflow: str
    index: int


# Tables of this stage (the FairQueue's are admission/pending.py's): (key, execution id)
# -> a holder of one of its slots, logged; the same for a holder whose run this task
# admitted and whose row this task's runs stage wrote in the same transaction, derived
# from that row (docs/decisions/holders-from-run-rows.md); key -> the number of slots
# held (derived from the holders); (key, execution id) -> where a start waits (derived
# from the queues: its lane and queue row, the lane preceded by its length).
_HOLDER = STATE_PREFIX + b"H"
_RUN_HOLDER = STATE_PREFIX + b"h"
_WAITING = STATE_PREFIX + b"W"
HOLDERS = TableSpec("holders", _HOLDER, SIZED, legacy(
    Fields(Holder), lambda t: Holder(t[0], int(t[1])), lambda h: (h.workflow, h.index)))
RUN_HOLDERS = TableSpec("run_holders", _RUN_HOLDER, SIZED, Fields(Holder), derived=True,
                        held=True)
HELD = TableSpec("held", STATE_PREFIX + b"C", SIZED_TEXT, Decimal(1), derived=True)


def _held_row(key: str) -> bytes:
    """The store row of the slots `key` holds (a HELD row)."""
    return HELD.prefix + SIZED_TEXT.encode(key)


class Where:
    """A waiting start's place, (lane, queue row): the waiting index's value. Kept as the
    queue row alone, the very bytes object the queue's table keys the start by, so a
    million waiting starts hold no second copy of their rows; the lane is in the row's
    queue name, after the key and 0x1f (`lane`). The layout before, the lane (its length
    first) then the row, is read too (a store kept from it, a changelog that logged it),
    and written while a deployment rolls from a release that reads only it
    (SLUICEGATE_LOG_DERIVED: `legacy_encode`). The two cannot be confused: a queue row
    begins with the queue table's prefix, 0x00 'S' 'Q', which as a length would be a lane
    of 5 MB (docs/decisions/compact-waiting-index.md)."""

    def encode(self, value: tuple[str | None, bytes]) -> bytes:
        return value[1]

    def legacy_encode(self, value: tuple[str | None, bytes]) -> bytes:
        lane, row = value
        assert lane is not None
        return SIZED.head(lane) + row

    def decode(self, raw: bytes) -> tuple[str | None, bytes]:
        """(lane, row); the lane None when the row alone was kept."""
        if pending.is_row(raw):
            return None, raw
        return _unprefix(raw)

    @staticmethod
    def lane(key: str, row: bytes) -> str:
        """The lane of the queue row `row` of `key`'s fair queue."""
        return pending.queue_of(row)[len(key.encode()) + 1:].decode()


WAITING = TableSpec("waiting", _WAITING, SIZED, Where(), derived=True)
# Timers.
_EXPIRE = b"X"                  # + key + execution id: its timeouts.start
_SWEEP = b"R"                   # after a restore: removed workflows, raised limits
_OVERRIDDEN = b"O"              # after a restore: room an operator's override may have made
# The declarations (every workflow's version) the partition's last sweep ran under.
_SWEPT = declared_table(STATE_PREFIX + b"V")

# -- the pure core -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limit:
    """What one hop enforces: its limit, its mode, and how many may wait per key."""

    limit: int
    mode: str = "runs"
    max_queued: int | None = None


@record
class Occupancy:
    """One key of one budget: slots held and starts waiting."""

    held: int
    waiting: int


class Verdict(StrEnum):
    take = "take"      # a slot is free and nobody waits before it: take it, go on
    keep = "keep"      # it holds this key's slot already (a resume of a runs-mode hold)
    wait = "wait"      # queue it, in its lane
    full = "full"      # the key's queue is at max_queued: dropped
    repeat = "repeat"  # it waits here already (a resume asked for twice): nothing to do


def arrive(occupancy: Occupancy, limit: Limit, *, holding: bool, queued: bool,
           resume: bool) -> Verdict:
    """What becomes of a start arriving at a key."""
    if holding:
        return Verdict.keep
    if queued:
        return Verdict.repeat
    if occupancy.waiting == 0 and occupancy.held < limit.limit:
        return Verdict.take
    # A resume belongs to a run that exists: it always waits, never dropped.
    if not resume and limit.max_queued is not None and occupancy.waiting >= limit.max_queued:
        return Verdict.full
    return Verdict.wait


def frees(kind: ReleaseKind, mode: str) -> bool:
    """Whether a release gives the slot back: an end or a lapsed lease always; a
    suspension only in `steps` mode (`runs` mode keeps the slot while the run sleeps)."""
    return kind is not ReleaseKind.suspended or mode == "steps"


def has_room(occupancy: Occupancy, limit: Limit) -> bool:
    return occupancy.held < limit.limit


def expires_at(start: PendingStart, start_timeout_ms: int | None) -> int | None:
    """When a waiting start expires (timeouts.start from its group's first arrival); a
    resume never does, its run already exists."""
    if start_timeout_ms is None or start.kind is AdmittedKind.resume:
        return None
    return start.arrived_at_ms + start_timeout_ms


def lane_hop(route: Route, position: int) -> Hop | None:
    """The hop whose key is a start's lane at hop `position`: the narrower concurrency
    limit before it, else its throttle, else its singleton (None: the workflow's name)."""
    earlier = route.hops[1:position]
    for hop in reversed(earlier):
        if hop.stage == NAME:
            return hop
    for control in ("throttle", "singleton"):
        for hop in earlier:
            if hop.control == control:
                return hop
    return None


# -- the stage -----------------------------------------------------------------------


# Length-prefixed, so one key is never a prefix of another's rows.
_prefixed = SIZED.head
# Keys' queues a transaction's cache keeps at most (`ConcurrencyStage.queue`): a queue
# forgotten is only made again.
_MAX_QUEUES = 16_384
_STAGES_MADE = itertools.count()


def _unprefix(raw: bytes) -> tuple[str, bytes]:
    (size,) = struct.unpack_from(">I", raw)
    return raw[4:4 + size].decode(), raw[4 + size:]


def waiter(value: bytes, header: bytes) -> tuple[bytes, str]:
    """(execution id as bytes, workflow) of a queued start's Avro record. A record in this
    release's layout (it begins with `header`, its type's current one) has them as its
    first two fields, read in place; any other is decoded whole. A restore reads every
    waiting start for them: a whole decode is most of its time at a million."""
    if value.startswith(header):
        at = len(header)
        first, at = _length(value, at)
        execution_id = value[at:at + first]
        second, at = _length(value, at + first)
        if 0 <= first == len(execution_id) and second >= 0 and at + second <= len(value):
            try:
                return execution_id, value[at:at + second].decode()
            except UnicodeDecodeError:
                pass
    start = codec.decode(PendingStart, value)
    return start.execution_id.encode(), start.workflow


def _length(data: bytes, at: int) -> tuple[int, int]:
    """An Avro long (zigzag, base 128) at `at`, and where it ends; -1 when cut short."""
    shift = n = 0
    while at < len(data) and shift < 64:
        byte = data[at]
        at += 1
        n |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (n >> 1) ^ -(n & 1), at
        shift += 7
    return -1, at


class ConcurrencyStage(QueueStage):
    name = NAME
    carries = (PendingStart, Release, CancelSweep)
    expects = "a pending start or a release"
    # Slots held per key follow from the holders, the waiting index and cancelOn's index by
    # workflow from the queues, and the queues' bookkeeping from their rows: none is logged.
    tables = (*QueueStage.tables, *cancelon.SweepIndex.TABLES, HOLDERS, RUN_HOLDERS, HELD,
              WAITING, _SWEPT, *floors.TABLES)
    derived = derived_prefixes(*tables)
    derives_from = (RUNS_STAGE,)

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        rows = super().derive(store)
        held: dict[str, int] = {}
        holding: set[bytes] = set()
        logged = {where for where, _ in HOLDERS.read(store)}
        runs = (beside or {}).get(RUNS_STAGE)
        found = {} if runs is None else self._run_holders(runs, logged)
        rows.update(RUN_HOLDERS.row(where, holder) for where, holder in found.items())
        for key, execution_id in (*logged, *found):
            held[key] = held.get(key, 0) + 1
            if self.floors:
                holding.add(SIZED.encode((key, execution_id)))
        rows.update(HELD.row(key, n) for key, n in held.items())
        if self.floors:
            rows.update(floors.derive(store, holding))
        # Only the starts of workflows that declare cancelOn are listed for its index:
        # a million waiting starts make no million (workflow, where) pairs besides.
        rows.update(self.sweeps.rows(self._parked(store, rows, self.sweeps.workflows)))
        return rows

    @staticmethod
    def _parked(store: StoreReader, rows: dict[bytes, bytes] | None = None,
                workflows: frozenset[str] | None = None) -> Iterator[tuple[str, bytes]]:
        """(workflow, key + execution id) of every start waiting (of `workflows` only,
        when given), and the waiting index of every one into `rows` when given."""
        header = codec.default().header_of(PendingStart)
        join = b"".join
        for budget in pending.fair_budgets(store):
            key = _prefixed(budget.decode())
            for _lane, row, value in pending.lane_rows(store, budget):
                execution_id, workflow = waiter(value, header)
                if rows is not None:
                    # WAITING's row (Where: the queue row alone), its key made at once.
                    rows[join((_WAITING, key, execution_id))] = row
                if workflows is None or workflow in workflows:
                    yield workflow, key + execution_id

    def __init__(self, app: App, router: Router, deployment_cap: int,
                 partitions: int) -> None:
        super().__init__(app, router)
        self.deployment_cap = deployment_cap
        self.partitions = partitions
        self.sweeps = cancelon.SweepIndex(app)
        # The owner of this stage's queues in a transaction's cache (`queue`): its own, so
        # a stage made again for a new declaration never finds queues made by the old one.
        self._queues = f"concurrency queues {next(_STAGES_MADE)}"
        self._limits: dict[tuple[str, int], Limit] = {}
        self._declared = hashlib.sha256("\n".join(sorted(
            f"{wf.name}\x1f{wf.version}" for wf in app.workflows.values())).encode()
            + f"\x1f{deployment_cap}".encode()).digest()
        # One priority mode per budget: `age` only when every member ranks by age, since
        # one queue cannot mix the two scales (docs/decisions/fairness-across-keys.md).
        modes: dict[str, set[str]] = {}
        for route in router.routes.values():
            wf = app.workflows[route.workflow]
            mode = priority_mode(wf)
            for hop in route.hops:
                if hop.stage == NAME:
                    modes.setdefault(hop.budget, set()).add(mode)
        self.modes = {budget: "age" if found == {"age"} else "strict"
                      for budget, found in modes.items()}
        # Budgets whose limit guarantees each fairness value a floor of its slots (every
        # member alike: checked at load; admission/floors.py).
        self.floors = {hop.budget: floor for route in router.routes.values()
                       for hop in route.hops if hop.stage == NAME and hop.index >= 0
                       and (floor := app.workflows[route.workflow]
                            .concurrency[hop.index].floor) is not None}
        # Budgets whose limit declares a fairness key (every member alike: checked at load).
        self.fair = {hop.budget for route in router.routes.values() for hop in route.hops
                     if hop.stage == NAME and hop.index >= 0
                     and app.workflows[route.workflow].concurrency[hop.index].fair_by
                     is not None}
        # Per budget, the widest limit any route gives it: a key holding that many slots
        # has no room for any start waiting there, whatever its workflow.
        self.widest: dict[str, int] = {}
        # The budgets whose limits per key come from the limits table, by the rows' name
        # (every member of a pool alike: checked at load). Their widest is per key.
        self.per_key: dict[str, set[str]] = {}
        for route in router.routes.values():
            wf = app.workflows[route.workflow]
            for hop in route.hops:
                if hop.stage == NAME:
                    self.widest[hop.budget] = max(self.widest.get(hop.budget, 0),
                                                  self.limit(wf, hop).limit)
                    name = wf.concurrency[hop.index].per_key if hop.index >= 0 else None
                    if name is not None:
                        self.per_key.setdefault(name, set()).add(hop.budget)
        for budgets in self.per_key.values():
            for budget in budgets:
                self.widest.pop(budget, None)

    # -- declarations --------------------------------------------------------------------

    def limit(self, wf: Workflow, hop: Hop) -> Limit:
        # Asked at every arrival and every admission from a queue: made once per hop.
        made = self._limits.get((wf.name, hop.index))
        if made is None:
            if hop.index < 0:
                # The deployment cap counts runs: a suspended run keeps its slot.
                made = Limit(self.deployment_cap)
            else:
                option = wf.concurrency[hop.index]
                made = Limit(option.limit, option.mode, option.max_queued)
            self._limits[(wf.name, hop.index)] = made
        row = self._override(hop.budget)
        return made if row is None else dataclasses.replace(
            made, limit=overrides.effective(made.limit, row))

    def _override(self, budget: str) -> OverrideRow | None:
        """The operator's override of `budget`'s limit, if one is set (none: no lookup)."""
        control = self.router.control
        if control is None or not control.overrides:
            return None
        return control.override(NAME, budget)

    def _widest(self, budget: str) -> int | None:
        """The widest limit in force at `budget`: an override's applies to every member."""
        declared = self.widest.get(budget)
        return None if declared is None else overrides.effective(declared,
                                                                 self._override(budget))

    def limit_at(self, wf: Workflow, hop: Hop, key: str) -> Limit:
        """The limit of `key` at `hop`: the declared one, or the limits table's for the key
        when the limit declares per_key (admission/limits.py)."""
        made = self.limit(wf, hop)
        per_key = wf.concurrency[hop.index].per_key if hop.index >= 0 else None
        if per_key is None or self._override(hop.budget) is not None:
            # An operator's override is the limit of every key of its budget, whatever
            # the table gives a key (docs/decisions/limit-overrides.md).
            return made
        found = key_limits.key_limit(self.router.limits, per_key, key_text(key), made.limit)
        return made if found == made.limit else replace(made, limit=found)

    def _whence(self, wf: Workflow, hop: Hop, limit: Limit) -> str:
        """Where a key's limit comes from when it is not the declared one, as a queued
        row says it (`ledger ask why`): an operator's override, or the limits table."""
        if hop.index < 0:
            return ""
        declared = wf.concurrency[hop.index].limit
        if self._override(hop.budget) is not None:
            return f" (an operator's override; declared {declared})"
        if limit.limit != declared:
            return f" (the key's, from the limits table; declared {declared})"
        return ""

    def table_changed(self, ctx: StageContext, table: str, row: object) -> None:
        """A row of the limits table: a key whose limit rose admits its waiting starts at
        once (a lowered one admits none until it drains below it; no run is cancelled);
        a record that is no limit is dead-lettered by the task owning its key. An
        override of a limit of this stage (a control row): a raised one admits the starts
        waiting in its budget's keys at once (in their fair order, as a freed slot
        would); a lowered one cancels nothing, and its keys admit again once they hold
        less."""
        if isinstance(row, OverrideRow):
            self._overridden(ctx, row)
            return
        if table != key_limits.LIMITS_TABLE:
            return
        partitions = ctx.topics.settings.partitions
        if isinstance(row, key_limits.BadLimitRow):
            if key_limits.owns(row.record.key, ctx.partition, partitions):
                ctx.dead_letter(row.record, row.reason)
            return
        if not isinstance(row, key_limits.LimitChange):
            return
        for budget in sorted(self.per_key.get(row.name, ())):
            key = str(ControlKey(budget, row.key))
            if key_limits.owns(key.encode(), ctx.partition, partitions):
                self._drain(ctx, key)

    def _mode_of_holder(self, workflow: str, index: int) -> str:
        wf = self.app.get(workflow)
        if wf is None or not 0 <= index < len(wf.concurrency):
            return "runs"
        return wf.concurrency[index].mode

    def queue(self, ctx: StageContext, key: str) -> FairQueue:
        """`key`'s queue, made once a transaction's view (a start's arrival and its
        release each ask for it) and kept in its cache under this stage's own name, since
        the mode and fairness it is made with are this stage's declarations."""
        queues = ctx.store.cache(self._queues)
        queue: FairQueue | None = queues.get(key)
        if queue is None:
            if len(queues) >= _MAX_QUEUES:
                queues.clear()
            budget = ControlKey.parse(key).budget
            queue = queues[key] = FairQueue(ctx.store, key.encode(),
                                            self.modes.get(budget, "strict"),
                                            budget in self.fair)
        return queue

    # -- rows ------------------------------------------------------------------------------

    # The slots a key holds: a counter of the transaction, written to its HELD row once a
    # cycle (HELD's codec is the counters' decimal text).

    @staticmethod
    def held(ctx: StageContext, key: str) -> int:
        return ctx.store.count(_held_row(key)) or 0

    @staticmethod
    def _set_held(ctx: StageContext, key: str, n: int) -> None:
        ctx.store.set_count(_held_row(key), n or None)

    @staticmethod
    def holders(ctx: StageContext, key: str) -> list[str]:
        """The execution ids holding `key`'s slots."""
        return [execution_id for table in ("run_holders", "holders")
                for (_, execution_id) in ctx.table(table).keys(SIZED.head(key))]

    @staticmethod
    def _holder(ctx: StageContext, where: bytes) -> tuple[Holder | None, str]:
        """The holder of one of a key's slots that an execution is (`where`: the two, as
        the holders' tables encode them), and its table."""
        holder: Holder | None = ctx.table("run_holders").get_encoded(where)
        if holder is not None:
            return holder, "run_holders"
        return ctx.table("holders").get_encoded(where), "holders"

    def _holder_table(self, ctx: StageContext, start: PendingStart) -> str:
        """Where the slot `start` takes is kept: derived from its run's row when that row
        is written in this task, in this transaction (a fresh start admitted from this
        hop, its execution id on this partition, its task running the runs stage, no
        rolling upgrade that needs the row logged); logged otherwise."""
        if (start.kind is AdmittedKind.start and not ctx.logs_derived
                and RUNS_STAGE in ctx.beside and self.router.admits_next(start)
                and partition_for(start.execution_id.encode(), self.partitions)
                == ctx.partition):
            return "run_holders"
        return "holders"

    def _run_holders(self, runs: StoreReader, logged: set[tuple[str, str]]
                     ) -> dict[tuple[str, str], Holder]:
        """The holders made from the live runs' rows (`_holder_table`): each slot of this
        stage a run holds under a key on its own partition and that no logged holder
        names, except a suspended run's in `steps` mode (it gave its slot back)."""
        found: dict[tuple[str, str], Holder] = {}
        for execution_id, row in RUNS.read(runs):
            if row.status not in LIVE:
                continue
            partition = partition_for(execution_id.encode(), self.partitions)
            for slot in row.slots:
                where = (slot.key, execution_id)
                if (slot.stage != NAME or where in logged
                        or partition_for(slot.key.encode(), self.partitions) != partition):
                    continue
                index = self._index_of(row.workflow, slot.key)
                if row.status is RunStatus.suspended and frees(
                        ReleaseKind.suspended, self._mode_of_holder(row.workflow, index)):
                    continue
                found[where] = Holder(row.workflow, index)
        return found

    def _index_of(self, workflow: str, key: str) -> int:
        """Which of `workflow`'s limits the slot of `key` is (-1: the deployment's cap, or
        a limit no longer declared)."""
        route = self.router.routes.get(workflow)
        budget = ControlKey.parse(key).budget
        for hop in route.hops if route is not None else ():
            if hop.stage == NAME and hop.budget == budget:
                return hop.index
        return -1

    def _waiting(self, ctx: StageContext, key: str, execution_id: str) -> tuple[str, Parked] | None:
        found = ctx.table("waiting").get((key, execution_id))
        if found is None:
            return None
        lane, row = found
        if lane is None:
            lane = Where.lane(key, row)
        parked = self.queue(ctx, key).lane(lane).at(row)
        return None if parked is None else (lane, parked)

    # -- input -----------------------------------------------------------------------------

    def on_start(self, ctx: StageContext, record: InputRecord, start: PendingStart) -> None:
        if record.key is None:
            self._rekey(ctx, start, record.headers)
            return
        # The record's bytes are the start's own encoding when it was handed over with
        # it in this process: parked, it is not encoded again.
        self._arrive(ctx, record.key.decode(), start, record.headers,
                     record.value if record.message is start else None)

    def on_release(self, ctx: StageContext, release: Release) -> None:
        self._release(ctx, release)

    def _rekey(self, ctx: StageContext, start: PendingStart, headers: Headers | None) -> None:
        """A start produced without its key: send it on to the task that owns its key."""
        wf = self.router.workflow(start.workflow)
        hop = self.router.hop(start)
        if wf is None or hop is None or hop.stage != NAME:
            self.router.forward(ctx, start, headers=headers)
            return
        key = Router.key_for(wf, hop, self.router.payloads.open(start.payload))
        ctx.send(ctx.topics.stage(self.name), key.encode(), codec.encode(start), None, headers)

    def _arrive(self, ctx: StageContext, key: str, start: PendingStart,
                headers: Headers | None, encoded: bytes | None = None) -> None:
        wf = self.router.workflow(start.workflow)
        resume = start.kind is AdmittedKind.resume
        if wf is None and not resume:
            self._fail(ctx, key, start, Outcome.failed, REMOVED, headers)
            return
        hop = self.router.hop(start)
        if wf is None or hop is None or hop.stage != NAME:
            # The route changed under it (or a resume of a workflow now gone, whose run
            # exists): no limit of this hop applies any more.
            self.router.forward(ctx, start, headers=headers)
            return
        if cancelon.discard_on_arrival(ctx, self.app, self.router, start,
                                       key_text(key), headers=headers):
            return
        limit = self.limit_at(wf, hop, key)
        queue = self.queue(ctx, key)
        occupancy = Occupancy(self.held(ctx, key), len(queue))
        # The key and the execution id as the holders' and the waiting index's tables
        # encode them, once.
        where = SIZED.encode((key, start.execution_id))
        verdict = arrive(
            occupancy, limit,
            holding=(ctx.table("run_holders").has_encoded(where)
                     or ctx.table("holders").has_encoded(where)),
            queued=ctx.table("waiting").has_encoded(where), resume=resume)
        if verdict is Verdict.take:
            self._take(ctx, key, start, hop, headers, held=occupancy.held)
        elif verdict is Verdict.keep:
            self.router.forward(ctx, with_slot(start, NAME, key), headers=headers)
        elif verdict is Verdict.full:
            reason = (f"queue-full: {occupancy.waiting} starts already wait for a concurrency "
                      f"slot of {self._described(key, wf)} (max_queued {limit.max_queued})")
            self.router.decide(ctx, start, Outcome.dropped, key=key_text(key),
                               reason=reason, headers=headers)
            self.router.give_back(ctx, start, reason)
        elif verdict is Verdict.wait:
            self._park(ctx, key, start, wf, queue, headers,
                       waits_for=f"{occupancy.held} of {limit.limit} slots",
                       whence=self._whence(wf, hop, limit), where=where, encoded=encoded)
            if has_room(occupancy, limit):
                # Room, but others were waiting first (a limit raised by a redeploy).
                self._drain(ctx, key, queue=queue, held=occupancy.held)

    def _take(self, ctx: StageContext, key: str, start: PendingStart, hop: Hop,
              headers: Headers | None, lane: str | None = None, *, held: int) -> None:
        """`start` takes one of `key`'s slots, of which `held` were held."""
        ctx.table(self._holder_table(ctx, start)).put((key, start.execution_id),
                                                      Holder(start.workflow, hop.index))
        self._set_held(ctx, key, held + 1)
        if hop.budget in self.floors:
            wf = self.router.workflow(start.workflow)
            if lane is None and wf is not None:
                lane = self._lane(wf, start)
            if lane is not None:
                floors.took(ctx.store, _prefixed(key), start.execution_id, lane)
        self.router.forward(ctx, with_slot(start, NAME, key), headers=headers)

    def _park(self, ctx: StageContext, key: str, start: PendingStart, wf: Workflow,
              queue: FairQueue, headers: Headers | None, *, waits_for: str,
              where: bytes, whence: str = "", encoded: bytes | None = None) -> None:
        """`where`: the key and the execution id as the waiting index encodes them."""
        lane = self._lane(wf, start)
        parked, position = queue.park(lane, start, headers, encoded)
        ctx.table("waiting").put_encoded(where, (lane, parked.row))
        self.sweeps.add(ctx, start.workflow, where)
        timeout = wf.timeouts.start_ms if wf.timeouts is not None else None
        due = expires_at(start, timeout)
        if due is not None:
            ctx.timers.schedule(due, _EXPIRE + _prefixed(key) + start.execution_id.encode())
        if start.kind is AdmittedKind.start:
            # The ledger row says why in words: `ledger ask why` shows it.
            place = (f"number {position + 1} in line" if position is not None
                     else f"more than {COUNTED} ahead of it in line")
            self.router.queued(
                ctx, start, deferral=NAME, key=key_text(key), position=position,
                reason=f"concurrency: {waits_for} of {self._described(key, wf)} in use"
                       f"{whence}; {place} for the next free one", headers=headers)

    def _lane(self, wf: Workflow, start: PendingStart) -> str:
        """The lane `start` waits in at its hop: the value of the limit's fairness key
        when it declares one, else the narrower key before it (`lane_hop`)."""
        hop = self.router.hop(start)
        option = (wf.concurrency[hop.index] if hop is not None and hop.stage == NAME
                  and hop.index >= 0 else None)
        fair = option.fair_expr if option is not None else None
        if fair is not None:
            try:
                return fair.text(self.router.payloads.open(start.payload))
            except ExpressionError:
                return "null"  # as a key that cannot be evaluated (seed 003)
        by = lane_hop(self.router.routes[wf.name], start.hop)
        return wf.name if by is None else Router.key_for(
            wf, by, self.router.payloads.open(start.payload))

    @staticmethod
    def _weight(wf: Workflow, hop: Hop, lane: str) -> int:
        """The turns in a row `lane` gets at this concurrency hop (its fairness key's
        weight; 1 without one, and at the deployment cap)."""
        if hop.index < 0:
            return 1
        option = wf.concurrency[hop.index]
        return option.weight(lane) if option.fair_by is not None else 1

    def _unpark(self, ctx: StageContext, key: str, start: PendingStart) -> None:
        """Drop a start's waiting index and expiry timer once it leaves the queue."""
        where = SIZED.encode((key, start.execution_id))
        ctx.table("waiting").delete_encoded(where)
        self.sweeps.remove(ctx, start.workflow, where)
        wf = self.router.workflow(start.workflow)
        timeout = wf.timeouts.start_ms if wf is not None and wf.timeouts is not None else None
        due = expires_at(start, timeout)
        if due is not None:
            # A declaration changed since it was parked may leave the old timer behind; it
            # then finds no waiting row and does nothing.
            ctx.timers.cancel(due, _EXPIRE + _prefixed(key) + start.execution_id.encode())

    # -- releases and admission from the queue -------------------------------------------

    def _release(self, ctx: StageContext, release: Release) -> None:
        key = release.key
        # The key and the execution id as the holders' tables encode them, once.
        where = SIZED.encode((key, release.execution_id))
        holder, table = self._holder(ctx, where)
        if holder is None:
            if release.kind is not ReleaseKind.suspended:
                # The run ended while its resume waited here: it no longer needs a slot.
                self._forget_waiting_resume(ctx, key, release.execution_id)
                # Or its slot was made again from its row at a restore after it ended and
                # before this release came: the slot is free already, and who waits for
                # it goes now.
                self._drain(ctx, key)
            return
        if not frees(release.kind, self._mode_of_holder(holder.workflow, holder.index)):
            return
        ctx.table(table).delete_encoded(where)
        held = self.held(ctx, key) - 1
        self._set_held(ctx, key, held)
        if self.floors:
            floors.released(ctx.store, _prefixed(key), release.execution_id)
        self._drain(ctx, key, held=held)

    def _forget_waiting_resume(self, ctx: StageContext, key: str, execution_id: str) -> None:
        found = self._waiting(ctx, key, execution_id)
        if found is None or found[1].start.kind is not AdmittedKind.resume:
            return
        lane, parked = found
        self.queue(ctx, key).remove(lane, parked)
        self._unpark(ctx, key, parked.start)

    def _drain(self, ctx: StageContext, key: str, sweeping: bool = False, *,
               queue: FairQueue | None = None, held: int | None = None) -> None:
        """Admit waiting starts while the key has room, in the queue's fair order. `queue`
        and `held`: the key's queue and the slots it holds, when the caller has them.

        Once the key holds the widest limit of its budget nobody waiting can take a slot,
        and the queue is not read. Only a sweep at restore reads it anyway: starts whose
        route changed with a redeploy wait there, and leave without a slot."""
        if queue is None:
            queue = self.queue(ctx, key)
        budget = ControlKey.parse(key).budget
        widest = self._widest(budget)
        floor = self.floors.get(budget)
        # Only a start taking a slot here changes it while this runs (what it sends, a
        # release among it, is handed over after): counted here, not read again.
        if held is None:
            held = self.held(ctx, key)
        while True:
            if not sweeping and widest is not None and held >= widest:
                return
            head = (queue.next() if floor is None
                    else floors.next_start(queue, ctx.store, _prefixed(key), floor))
            if head is None:
                return
            lane, parked = head
            start = parked.start
            wf = self.router.workflow(start.workflow)
            hop = self.router.hop(start)
            if wf is None and start.kind is AdmittedKind.start:
                queue.remove(lane, parked)
                self._unpark(ctx, key, start)
                self._fail(ctx, key, start, Outcome.failed, REMOVED, parked.headers)
                continue
            if wf is None or hop is None or hop.stage != NAME:
                queue.take(lane, parked)
                self._unpark(ctx, key, start)
                self.router.forward(ctx, start, headers=parked.headers)
                continue
            if held >= self.limit_at(wf, hop, key).limit:
                return
            queue.take(lane, parked, self._weight(wf, hop, lane))
            self._unpark(ctx, key, start)
            self._take(ctx, key, start, hop, parked.headers, lane, held=held)
            held += 1

    def on_sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards this partition's waiting starts that match the event, read
        from the index by workflow: only the starts of the workflows it names, whatever
        the budgets they wait in (a pool, the deployment cap) hold of others. A waiting
        resume is left alone: its run exists, and the correlator cancels runs. No slot
        frees, so nothing drains."""
        for workflow in sweep.workflows:
            for where in self.sweeps.parked(ctx, workflow):
                key, execution_id = _unprefix(where)
                self._judge(ctx, sweep, key, execution_id.decode())

    def _judge(self, ctx: StageContext, sweep: CancelSweep, key: str,
               execution_id: str) -> None:
        found = self._waiting(ctx, key, execution_id)
        if found is not None:
            lane, parked = found
            start = parked.start
            reason = cancelon.judge(self.app, self.router, ctx.stage, sweep, start,
                                    cancelon.Group.of(parked.headers))
            if reason is not None:
                self.queue(ctx, key).remove(lane, parked)
                self._unpark(ctx, key, start)
                cancelon.discard(ctx, self.router, start, sweep, reason, key_text(key),
                                 headers=parked.headers)

    # -- timers ----------------------------------------------------------------------------

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if cancelon.forget(ctx, key):
            return
        if key.startswith(_EXPIRE):
            budget_key, execution_id = _unprefix(key[len(_EXPIRE):])
            self._expire(ctx, budget_key, execution_id.decode())
        elif key == _SWEEP:
            self._sweep(ctx)
        elif key == _OVERRIDDEN:
            control = self.router.control
            for row in list(control.overrides.values()) if control is not None else ():
                self._overridden(ctx, row)

    def _overridden(self, ctx: StageContext, row: OverrideRow) -> None:
        if row.control != NAME:
            return
        for name in pending.fair_budgets(ctx.store):
            key = name.decode()
            if ControlKey.parse(key).budget == row.budget:
                self._drain(ctx, key)

    def _expire(self, ctx: StageContext, key: str, execution_id: str) -> None:
        found = self._waiting(ctx, key, execution_id)
        if found is None:
            return
        lane, parked = found
        start = parked.start
        self.queue(ctx, key).remove(lane, parked)
        self._unpark(ctx, key, start)
        wf = self.router.workflow(start.workflow)
        allowed = wf.timeouts.start_ms if wf is not None and wf.timeouts is not None else None
        waited = format_duration(max(0, ctx.now_ms - start.arrived_at_ms))
        limit = f" (timeouts.start is {format_duration(allowed)})" if allowed else ""
        self._fail(ctx, key, start, Outcome.expired,
                   f"timeouts.start: waited {waited} for a concurrency slot of "
                   f"{self._described(key, wf)} and never got one{limit}", parked.headers)

    def restored(self, ctx: StageContext) -> None:
        self.sweeps.restored(ctx, lambda: self._parked(ctx.store))
        if self.router.control is not None and self.router.control.overrides:
            # Changed while another worker had the partition, maybe: drain what it allows.
            ctx.timers.schedule(ctx.now_ms, _OVERRIDDEN)
        # A timer due now does the sweep in the cycle's timer pass, through the same code
        # as any other sweep. Under the declarations the last sweep ran with there is
        # nothing for it to do: it reads every waiting start, seconds at a million.
        if checked_under(ctx, self._declared):
            return
        if next(ctx.table("waiting").keys(), None) is None:
            # Nothing waits, so nothing to sweep: these are the declarations the partition
            # was checked under. (Without this row, a partition first assigned empty swept
            # every start queued since at its first restart.)
            mark_checked(ctx, self._declared)
            return
        ctx.timers.schedule(ctx.now_ms, _SWEEP)

    def _sweep(self, ctx: StageContext) -> None:
        """Fail the waiting starts of workflows the declarations no longer have, and fill
        any room a raised limit made."""
        keys: list[str] = []
        for key, execution_id in list(ctx.table("waiting").keys()):
            if not keys or keys[-1] != key:
                keys.append(key)
            found = self._waiting(ctx, key, execution_id)
            if found is None:
                continue
            lane, parked = found
            start = parked.start
            if start.kind is AdmittedKind.start and self.router.workflow(start.workflow) is None:
                self.queue(ctx, key).remove(lane, parked)
                self._unpark(ctx, key, start)
                self._fail(ctx, key, start, Outcome.failed, REMOVED, parked.headers)
        for key in keys:
            self._drain(ctx, key, sweeping=True)
        mark_checked(ctx, self._declared)

    # -- decisions -------------------------------------------------------------------------

    def _fail(self, ctx: StageContext, key: str, start: PendingStart, outcome: Outcome,
              reason: str, headers: Headers | None = None) -> None:
        self.router.fail(ctx, start, outcome, reason, key=key_text(key), headers=headers)

    def _described(self, key: str, wf: Workflow | None) -> str:
        budget, text = ControlKey.parse(key)
        what = ("the deployment cap" if budget == DEPLOYMENT_BUDGET
                else f"workflow {budget}" if wf is not None and budget == wf.name
                else budget)
        return f"{what} key {text!r}" if text else what
