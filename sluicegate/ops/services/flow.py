"""The flow view: per workflow and key, what is waiting and for how long, what folded,
what was dropped or expired, what runs, and whether the workflow is paused (SPEC.md
section 4; seed 000, "Seeing what happened").

Its sources, each read the way its owner writes it:

- the admissions ledger, through its incremental DuckDB copy (`services.ledger`): `queued`
  counts the starts whose latest row is `queued`; `collapsed`, `dropped` and `expired`
  count final outcomes;
- the compacted runs table `sg.runs` (`services.runs.RunsTable`), read to its end: a live
  run counts once under each concurrency slot it holds (`in_flight`), or under no key when
  it holds none;
- the control table `sg.control` (`ControlTable`): the pause row of each workflow, and
  the override of a workflow's or a pool's concurrency limit (shown beside it, with the
  declared one);
- with declarations that take limits per key from it, the limits table `sg.limits`
  (`LimitsTable`): a key's own limit, shown beside its in_flight as `3/20 (from
  sg.limits; declared 2)` while no override is set.

A pool's limit is shared by its members, so it has lines of its own after the workflows':
`pool gpu (embed, summarize)  in_flight=7/10`, the runs of every member against the pool's
limit (per key for a keyed pool).

`compute` is the pure part (counts in, view out); `flow_view` asks the ledger for the
counts; `FlowReader` keeps the sources open, `read_flow` reads them once. The text
and JSON forms are `FlowView.text()` and `FlowView.to_json()`; the CLI and
`GET /inspect/workflows/flow-control` print the same JSON. See docs/operations.md.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sluicegate.admission.control import ControlTable
from sluicegate.admission.limits import LimitChange, LimitsTable, declares_per_key
from sluicegate.admission.overrides import effective, in_force
from sluicegate.admission.stages.concurrency import NAME as CONCURRENCY
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.ops.services.formatting import ONE_KEY, duration_ms
from sluicegate.ops.services.ledger import (
    LATEST,
    LedgerDb,
    default_db_path,
    ledger_consumer,
    refresh,
)
from sluicegate.ops.services.overrides import describe_override
from sluicegate.ops.services.runs import RunsTable
from sluicegate.schemas.records import ENDED, ControlRow, OverrideRow, RunRow
from sluicegate.topology.keys import ControlKey, key_text
from sluicegate.topology.topics import Topics

FlowKey = tuple[str, str | None]  # (workflow, key as the ledger shows it)
POOL = "pool:"  # a pool's budget: `pool:<name>`

# Per workflow and key, from the ledger. `run:` request ids are rows about runs (a lapsed
# lease, timeouts.finish), not starts. A queued row's `decided_at - waited_ms` is when its
# group began waiting (for a debounce, the burst's first start), as in `ledger ask stuck`.
FLOW_SQL = f"""
WITH {LATEST},
queued AS (
    SELECT workflow, coalesce(key, '') AS key, count(*) AS queued,
           epoch_ms(min(least(requested_at, decided_at - to_milliseconds(waited_ms))))
               AS oldest_ms
    FROM latest
    WHERE outcome = 'queued' AND NOT starts_with(request_id, 'run:')
    GROUP BY ALL
), finals AS (
    SELECT workflow, coalesce(key, '') AS key,
           count(DISTINCT request_id) FILTER (WHERE outcome = 'collapsed') AS collapsed,
           count(DISTINCT request_id) FILTER (WHERE outcome = 'dropped') AS dropped,
           count(DISTINCT request_id) FILTER (WHERE outcome = 'expired') AS expired
    FROM ledger
    WHERE outcome IN ('collapsed', 'dropped', 'expired')
      AND NOT starts_with(request_id, 'run:')
    GROUP BY ALL
)
SELECT coalesce(q.workflow, f.workflow) AS workflow, coalesce(q.key, f.key) AS key,
       coalesce(q.queued, 0), q.oldest_ms, coalesce(f.collapsed, 0),
       coalesce(f.dropped, 0), coalesce(f.expired, 0)
FROM queued q
FULL OUTER JOIN finals f ON q.workflow = f.workflow AND q.key = f.key
WHERE $workflow IS NULL OR coalesce(q.workflow, f.workflow) = $workflow
"""

# Every workflow with any ledger row: one whose starts were all admitted at once (or
# answered `existing`) has no count above, and is listed all the same.
WORKFLOWS_SQL = """
SELECT DISTINCT workflow FROM ledger WHERE $workflow IS NULL OR workflow = $workflow
"""

@dataclass(frozen=True, slots=True)
class SlotLimit:
    """A workflow's own concurrency limit, or a pool's, as `in_flight=n/limit` shows it."""

    limit: int
    keyed: bool
    # The operator's override the limit is, if any (its row has the declared one).
    override: OverrideRow | None = None
    # The rows of the limits table the limit takes its keys' limits from (`per_key`).
    per_key: str | None = None
    # Its budget when it is not the workflow's name (a pool's `pool:gpu`), and a pool's
    # members.
    budget: str | None = None
    members: tuple[str, ...] = ()
    # As the ledger names it (`concurrency[1]`), for a limit shown on its own.
    control: str | None = None

    def of_key(self, key: str | None, rows: Mapping[tuple[str, str], LimitChange],
               ) -> tuple[int, LimitChange | None]:
        """The limit of `key` and the limits table's row it comes from, if it does: the
        override's while one is set, else the table's row for the key, else this one
        (admission/limits.py's rule, as the stage applies it)."""
        if self.override is None and self.per_key is not None and key is not None:
            row = rows.get((self.per_key, key))
            if row is not None and row.limit is not None:
                return row.limit, row
        return self.limit, None


def with_overrides(limits: Mapping[str, SlotLimit],
                   overrides: Mapping[str, OverrideRow]) -> dict[str, SlotLimit]:
    """The declared `limits` with the overrides in force (a workflow's own limit is the
    budget of its name, a pool's `pool:<name>`)."""
    out = {}
    for name, slot in limits.items():
        row = in_force(overrides, CONCURRENCY, slot.budget or name)
        out[name] = replace(slot, limit=effective(slot.limit, row), override=row)
    return out


def concurrency_limits(app: App | None) -> dict[str, SlotLimit]:
    """The limit of each workflow of `app` that declares one concurrency limit of its own
    (not a pool's or a scope's, whose budget other workflows share, nor two limits, whose
    keys the view does not tell apart)."""
    if app is None:
        return {}
    limits = {}
    for name, wf in app.workflows.items():
        if len(wf.concurrency) == 1 and wf.concurrency[0].shared_budget is None:
            limit = wf.concurrency[0]
            limits[name] = SlotLimit(limit.limit, keyed=limit.key is not None,
                                     per_key=limit.per_key)
    return limits


def paired_limits(app: App | None) -> dict[str, SlotLimit]:
    """The own limits of each workflow of `app` that declares two concurrency limits, by
    budget (`w`, `w#1`): their keys are not told apart on a key's line, so the workflow's
    line names each with the limit in force (a pool's shows on the pool's lines)."""
    limits = {}
    for name, wf in app.workflows.items() if app is not None else ():
        if len(wf.concurrency) < 2:
            continue
        for index, limit in enumerate(wf.concurrency):
            if limit.shared_budget is None:
                budget = name if index == 0 else f"{name}#{index}"
                limits[budget] = SlotLimit(limit.limit, keyed=limit.key is not None,
                                           per_key=limit.per_key, budget=budget,
                                           members=(name,), control=f"concurrency[{index}]")
    return limits


def pool_limits(app: App | None) -> dict[str, SlotLimit]:
    """The limit of each concurrency pool `app` declares, by the pool's name, with its
    members (every member declares the same limit, key and per_key: checked at load)."""
    pools: dict[str, SlotLimit] = {}
    for name, wf in sorted(app.workflows.items()) if app is not None else ():
        for limit in wf.concurrency:
            if limit.pool is None:
                continue
            found = pools.get(limit.pool)
            pools[limit.pool] = SlotLimit(
                limit.limit, keyed=limit.key is not None, per_key=limit.per_key,
                budget=f"pool:{limit.pool}",
                members=(*(found.members if found is not None else ()), name))
    return pools


@dataclass(frozen=True, slots=True)
class LedgerCounts:
    queued: int = 0
    oldest_queued_ms: int | None = None
    collapsed: int = 0
    dropped: int = 0
    expired: int = 0


@dataclass(frozen=True, slots=True)
class KeyFlow:
    key: str | None
    queued: int = 0
    # When the oldest queued start began waiting, and how long ago that is.
    oldest_queued_at_ms: int | None = None
    waiting_ms: int | None = None
    collapsed: int = 0
    dropped: int = 0
    expired: int = 0
    in_flight: int = 0
    limit: int | None = None  # the concurrency limit in_flight counts against, if known
    override: OverrideRow | None = None  # the override that limit is, if any
    # The limits table's row that limit is, if any, and the declared one it stands in for.
    limit_row: LimitChange | None = None
    declared: int | None = None

    @property
    def waiting(self) -> str | None:
        """`12m00s`: the age of the oldest queued start, as `waiting=` prints it."""
        if self.waiting_ms is None:
            return None
        return duration_ms(self.waiting_ms)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "queued": self.queued, "waiting": self.waiting,
                "waiting_ms": self.waiting_ms, "oldest_queued_at_ms": self.oldest_queued_at_ms,
                "collapsed": self.collapsed, "dropped": self.dropped, "expired": self.expired,
                "in_flight": self.in_flight, "limit": self.limit,
                "override": override_json(self.override),
                "limit_row": None if self.limit_row is None else {
                    "name": self.limit_row.name, "key": self.limit_row.key,
                    "limit": self.limit_row.limit, "declared": self.declared,
                    "at_ms": self.limit_row.at_ms, "by": self.limit_row.by,
                    "reason": self.limit_row.reason}}


def override_json(row: OverrideRow | None) -> dict[str, Any] | None:
    """An override as the JSON documents give it (the flow view, the console's overview)."""
    return None if row is None else {
        "limit": row.limit, "declared": row.declared, "at_ms": row.at_ms, "by": row.by,
        "reason": row.reason}


@dataclass(frozen=True, slots=True)
class PoolFlow:
    """A concurrency pool: the runs of every member in flight against the pool's limit
    (`limit`: an unkeyed pool's), and per key for a keyed one."""

    pool: str
    members: tuple[str, ...]
    in_flight: int = 0
    limit: int | None = None
    override: OverrideRow | None = None
    keys: tuple[KeyFlow, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "members": list(self.members), "in_flight": self.in_flight,
                "limit": self.limit, "override": override_json(self.override),
                "keys": [{"key": k.key, "in_flight": k.in_flight, "limit": k.limit,
                          "limit_row": k.to_json()["limit_row"]} for k in self.keys]}


@dataclass(frozen=True, slots=True)
class WorkflowFlow:
    workflow: str
    paused: bool = False
    pause: ControlRow | None = None  # the latest pause row, paused or lifted
    keys: tuple[KeyFlow, ...] = ()
    # The limit of the whole workflow's in_flight: an unkeyed concurrency limit's.
    limit: int | None = None
    override: OverrideRow | None = None
    # A workflow with two limits: its own ones, in force, each named (`paired_limits`).
    limits: tuple[SlotLimit, ...] = ()

    def total(self) -> KeyFlow:
        """The workflow as one line: sums, and the oldest wait of any key."""
        waits = [k for k in self.keys if k.waiting_ms is not None]
        oldest = max(waits, key=lambda k: k.waiting_ms or 0, default=None)
        return KeyFlow(
            key=None, queued=sum(k.queued for k in self.keys),
            oldest_queued_at_ms=oldest.oldest_queued_at_ms if oldest else None,
            waiting_ms=oldest.waiting_ms if oldest else None,
            collapsed=sum(k.collapsed for k in self.keys),
            dropped=sum(k.dropped for k in self.keys),
            expired=sum(k.expired for k in self.keys),
            in_flight=sum(k.in_flight for k in self.keys), limit=self.limit,
            override=self.override if self.limit is not None else None)

    def to_json(self) -> dict[str, Any]:
        total = self.total().to_json()
        del total["key"]
        pause = None if self.pause is None else {
            "paused": self.pause.paused, "at_ms": self.pause.at_ms,
            "reason": self.pause.reason, "by": self.pause.by}
        return {"workflow": self.workflow, "paused": self.paused, "pause": pause,
                "total": total, "keys": [k.to_json() for k in self.keys],
                "limits": [{"control": lim.control, "budget": lim.budget, "limit": lim.limit,
                            "keyed": lim.keyed, "per_key": lim.per_key,
                            "override": override_json(lim.override)}
                           for lim in self.limits]}


@dataclass(frozen=True, slots=True)
class FlowView:
    now_ms: int
    workflows: tuple[WorkflowFlow, ...] = ()
    pools: tuple[PoolFlow, ...] = ()
    # The limits table's topic, as a limit from it is said to come from.
    limits_topic: str = "sg.limits"

    def get(self, workflow: str) -> WorkflowFlow | None:
        return next((w for w in self.workflows if w.workflow == workflow), None)

    def only(self, workflow: str) -> FlowView:
        return FlowView(self.now_ms, tuple(w for w in self.workflows if w.workflow == workflow),
                        tuple(p for p in self.pools if workflow in p.members),
                        self.limits_topic)

    def to_json(self) -> dict[str, Any]:
        return {"now_ms": self.now_ms, "workflows": [w.to_json() for w in self.workflows],
                "pools": [p.to_json() for p in self.pools]}

    def text(self) -> str:
        """One line per workflow, then one indented line per key; then each pool's."""
        if not self.workflows and not self.pools:
            return "no workflow has any start, run or pause row yet"
        lines: list[str] = []
        for wf in self.workflows:
            state = "PAUSED" if wf.paused else "running"
            if wf.paused and wf.pause is not None and wf.pause.reason:
                state += f" ({wf.pause.reason})"
            named = ", ".join(self._named(lim) for lim in wf.limits)
            lines.append(f"{wf.workflow}  {state}  {self._line(wf.total())}"
                         + (f"  limits: {named}" if named else ""))
            for key in wf.keys:
                lines.append(f"  key={_key_text(key.key)}  {self._line(key)}")
        for pool in self.pools:
            total = KeyFlow(None, in_flight=pool.in_flight, limit=pool.limit,
                            override=pool.override)
            lines.append(f"pool {pool.pool} ({', '.join(pool.members)})  "
                         f"in_flight={pool.in_flight}{self._limit(total)}")
            for key in pool.keys:
                lines.append(f"  key={_key_text(key.key)}  "
                             f"in_flight={key.in_flight}{self._limit(key)}")
        return "\n".join(lines)

    def _line(self, k: KeyFlow) -> str:
        waiting = f" waiting={k.waiting}" if k.waiting is not None else ""
        return (f"queued={k.queued}{waiting} collapsed={k.collapsed} dropped={k.dropped} "
                f"expired={k.expired} in_flight={k.in_flight}{self._limit(k)}")

    def _named(self, lim: SlotLimit) -> str:
        """`concurrency[1]=1 (override since ...; declared 2)`, `concurrency[0]=5 per key`."""
        per = (f" per key (or its row of {lim.per_key} in {self.limits_topic})"
               if lim.per_key is not None and lim.override is None
               else " per key" if lim.keyed else "")
        override = (f" ({describe_override(lim.override, now_ms=self.now_ms)})"
                    if lim.override is not None else "")
        return f"{lim.control}={lim.limit}{per}{override}"

    def _limit(self, k: KeyFlow) -> str:
        """`/10`, with where it comes from when it is not the declared limit."""
        if k.limit is None:
            return ""
        if k.override is not None:
            return f"/{k.limit} ({describe_override(k.override, now_ms=self.now_ms)})"
        if k.limit_row is not None:
            return f"/{k.limit} (from {self.limits_topic}; declared {k.declared})"
        return f"/{k.limit}"


def _key_text(key: str | None) -> str:
    return ONE_KEY if not key else repr(key) if " " in key else key


# -- the pure part ---------------------------------------------------------------------


def in_flight(runs: Iterable[RunRow]) -> Counter[FlowKey]:
    """Live runs per (workflow, key): one per concurrency slot a run holds, keyed as the
    ledger shows that limit's key; a run holding no concurrency slot counts under the
    workflow's one key ("")."""
    counts: Counter[FlowKey] = Counter()
    for run in runs:
        if run.status in ENDED:
            continue
        slots = [s for s in run.slots if s.stage == CONCURRENCY]
        if not slots:
            counts[(run.workflow, "")] += 1
        for slot in slots:
            counts[(run.workflow, key_text(slot.key))] += 1
    return counts


def pool_in_flight(runs: Iterable[RunRow]) -> Counter[tuple[str, str]]:
    """Live runs per (pool, key): one per slot of a pool a run holds, whichever member."""
    counts: Counter[tuple[str, str]] = Counter()
    for run in runs:
        if run.status in ENDED:
            continue
        for slot in run.slots:
            budget = ControlKey.parse(slot.key).budget if slot.stage == CONCURRENCY else ""
            if budget.startswith(POOL):
                counts[(budget[len(POOL):], key_text(slot.key))] += 1
    return counts


def _pools(pools: Mapping[str, SlotLimit], running: Mapping[tuple[str, str], int],
           rows: Mapping[tuple[str, str], LimitChange],
           workflow: str | None) -> tuple[PoolFlow, ...]:
    out = []
    for name, pool in sorted(pools.items()):
        if workflow is not None and workflow not in pool.members:
            continue
        held = {k: n for (p, k), n in running.items() if p == name}
        keys = []
        for key in sorted(held) if pool.keyed else ():
            limit, row = pool.of_key(key, rows)
            keys.append(KeyFlow(key, in_flight=held[key], limit=limit,
                                override=pool.override, limit_row=row,
                                declared=pool.limit if row is not None else None))
        out.append(PoolFlow(name, pool.members, sum(held.values()),
                            None if pool.keyed else pool.limit, pool.override, tuple(keys)))
    return tuple(out)


def compute(ledger: Mapping[FlowKey, LedgerCounts], running: Mapping[FlowKey, int],
            control: Mapping[str, ControlRow], now_ms: int, *, workflow: str | None = None,
            declared: Iterable[str] = (),
            limits: Mapping[str, SlotLimit] | None = None,
            pools: Mapping[str, SlotLimit] | None = None,
            pool_running: Mapping[tuple[str, str], int] | None = None,
            key_limits: Mapping[tuple[str, str], LimitChange] | None = None,
            limits_topic: str = "sg.limits",
            paired: Mapping[str, SlotLimit] | None = None) -> FlowView:
    """The view from its sources' figures. Every workflow any source names is listed
    (and each of `declared`, even with nothing to show), keys sorted by name; `limits`
    puts each workflow's concurrency limit beside its in_flight, `key_limits` (the
    limits table's rows) a key's own where its limit declares per_key; each of `pools`
    is listed with its members' runs in flight (`pool_running`, per pool and key);
    `paired`, the own limits of workflows with two, are named on their workflows' lines."""
    limits = limits or {}
    rows = key_limits or {}
    names = {w for w, _ in ledger} | {w for w, _ in running} | set(control) | set(declared)
    if workflow is not None:
        names &= {workflow}
    flows = []
    for name in sorted(names):
        keys = sorted({k for w, k in ledger if w == name} | {k for w, k in running if w == name},
                      key=lambda k: (k is not None, k or ""))
        lines = []
        slot_limit = limits.get(name)
        for key in keys:
            counts = ledger.get((name, key), LedgerCounts())
            oldest = counts.oldest_queued_ms
            limit, limit_row = (slot_limit.of_key(key, rows) if slot_limit is not None
                                else (None, None))
            lines.append(KeyFlow(
                key=key, queued=counts.queued, oldest_queued_at_ms=oldest,
                waiting_ms=None if oldest is None else max(0, now_ms - oldest),
                collapsed=counts.collapsed, dropped=counts.dropped, expired=counts.expired,
                in_flight=running.get((name, key), 0), limit=limit,
                override=slot_limit.override if slot_limit is not None else None,
                limit_row=limit_row,
                declared=slot_limit.limit if limit_row is not None and slot_limit else None))
        row = control.get(name)
        flows.append(WorkflowFlow(
            name, paused=row is not None and row.paused, pause=row, keys=tuple(lines),
            limit=slot_limit.limit if slot_limit is not None and not slot_limit.keyed
            else None,
            override=slot_limit.override if slot_limit is not None else None,
            limits=tuple(lim for _, lim in sorted((paired or {}).items())
                         if name in lim.members)))
    return FlowView(now_ms, tuple(flows),
                    _pools(pools or {}, pool_running or {}, rows, workflow), limits_topic)


# -- the sources -----------------------------------------------------------------------


def ledger_counts(db: LedgerDb, workflow: str | None = None) -> dict[FlowKey, LedgerCounts]:
    result = db.query(FLOW_SQL, {"workflow": workflow})
    return {(wf, key): LedgerCounts(int(q), None if oldest is None else int(oldest),
                                    int(c), int(d), int(e))
            for wf, key, q, oldest, c, d, e in result.rows}


def ledger_workflows(db: LedgerDb, workflow: str | None = None) -> list[str]:
    return [str(w) for (w,) in db.query(WORKFLOWS_SQL, {"workflow": workflow}).rows]


def flow_view(db: LedgerDb, runs: Iterable[RunRow], control: Mapping[str, ControlRow],
              now_ms: int, *, workflow: str | None = None, declared: Iterable[str] = (),
              limits: Mapping[str, SlotLimit] | None = None,
              pools: Mapping[str, SlotLimit] | None = None,
              key_limits: Mapping[tuple[str, str], LimitChange] | None = None,
              limits_topic: str = "sg.limits",
              paired: Mapping[str, SlotLimit] | None = None) -> FlowView:
    live = list(runs)
    return compute(ledger_counts(db, workflow), in_flight(live), control, now_ms,
                   workflow=workflow, declared={*declared, *ledger_workflows(db, workflow)},
                   limits=limits, pools=pools, pool_running=pool_in_flight(live),
                   key_limits=key_limits, limits_topic=limits_topic, paired=paired)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class FlowReader:
    """The sources, kept open: each `view` reads only what is new since the last. The CLI
    makes one for a single view; `inspect serve` keeps one for its life. `limits`, `pools`
    and `paired` are the declared ones (`concurrency_limits`, `pool_limits`,
    `paired_limits`); `per_key`: some
    take their keys' limits from the limits table, which is then read too."""

    def __init__(self, settings: Settings, db: LedgerDb, declared: Iterable[str] = (), *,
                 limits: Mapping[str, SlotLimit] | None = None,
                 pools: Mapping[str, SlotLimit] | None = None,
                 paired: Mapping[str, SlotLimit] | None = None,
                 per_key: bool = False) -> None:
        self.settings = settings
        self.db = db
        self.declared = tuple(declared)
        self.limits = dict(limits or {})
        self.pools = dict(pools or {})
        self.paired = dict(paired or {})
        self.runs = RunsTable(settings)
        self.control = ControlTable(settings)
        self.key_limits = LimitsTable(settings) if per_key else None
        self._ledger_consumer = ledger_consumer(settings)
        self._caught_up = False

    @classmethod
    def of(cls, settings: Settings, db: LedgerDb, app: App | None,
           declared: Iterable[str] = ()) -> FlowReader:
        """A reader showing the limits `app` declares (none without declarations)."""
        return cls(settings, db, declared, limits=concurrency_limits(app),
                   pools=pool_limits(app), paired=paired_limits(app),
                   per_key=app is not None and declares_per_key(app))

    def view(self, workflow: str | None = None, timeout_s: float = 10.0) -> FlowView:
        refresh(self.db, self.settings, consumer=self._ledger_consumer, timeout_s=timeout_s)
        self.runs.refresh(timeout_s)
        if self._caught_up:
            self.control.poll()
            if self.key_limits is not None:
                self.key_limits.poll()
        else:
            self.control.catch_up(timeout_s)
            if self.key_limits is not None:
                self.key_limits.catch_up(timeout_s)
            self._caught_up = True
        overrides = self.control.overrides
        return flow_view(self.db, self.runs.live.values(), self.control.rows, now_ms(),
                         workflow=workflow, declared=self.declared,
                         limits=with_overrides(self.limits, overrides),
                         pools=with_overrides(self.pools, overrides),
                         key_limits=self.key_limits.rows if self.key_limits else None,
                         limits_topic=Topics(self.settings).limits,
                         paired=with_overrides(self.paired, overrides))

    def close(self) -> None:
        self.runs.close()
        self.control.close()
        if self.key_limits is not None:
            self.key_limits.close()
        self._ledger_consumer.close()


def read_flow(settings: Settings, db: Path | None = None, app: App | None = None) -> FlowView:
    """One view, as `sluicegate workflows flow` prints it: the ledger copy at `db` (the
    default one when None) refreshed, the runs, control (and limits) tables read to their
    ends; every workflow `app` declares listed, with its concurrency limit, and its
    pools."""
    declared = sorted(app.workflows) if app is not None else []
    with LedgerDb(db or default_db_path(settings)) as ledger:
        reader = FlowReader.of(settings, ledger, app, declared)
        try:
            return reader.view()
        finally:
            reader.close()
