"""Overrides of declared limits at run time: `sluicegate workflows limit` (issue 35, point 1).

An override is one row of the compacted control table keyed by the limit it changes
(`override:<control>:<budget>`, admission/overrides.py), read by every worker as a pause
row is, so it applies fleet-wide within about a second; `--clear` writes a row without a
limit (not a tombstone: the workers are told, and the row keeps who cleared it). Each
change is also a ledger row per workflow the limit judges (outcome `overridden`, control
`override`), with the old and the new limit, who and why, written in the same Kafka
transaction as the control row. What a change does to runs and waiting starts is the
stages' business (docs/decisions/limit-overrides.md). `preview` says what a change would
admit now, for the console.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from sluicegate.admission.control import ControlTable
from sluicegate.admission.overrides import (
    RATE_LIMIT,
    THROTTLE,
    OverrideError,
    Target,
    effective,
    effective_period,
    in_force,
    override_key,
    override_row,
    target_of,
)
from sluicegate.config import Settings
from sluicegate.declare import App, format_duration, parse_duration
from sluicegate.ops.services.control import who
from sluicegate.ops.services.formatting import clock
from sluicegate.ops.services.ledger import LATEST, LedgerDb
from sluicegate.schemas import codec
from sluicegate.schemas.records import ENDED, LedgerRecord, Outcome, OverrideRow, RunRow
from sluicegate.topology.keys import ControlKey, key_text
from sluicegate.topology.route import control_name, route_for
from sluicegate.topology.topics import Topics

__all__ = ["Change", "OverrideError", "Preview", "change_limit", "describe_override",
           "held_by_key", "ledger_rows", "overrides_in_force", "parse_rate", "preview",
           "target_of", "waiting_by_key"]

# The ranges a declared limit and a throttle's or rateLimit's period may take (SPEC.md
# section 1).
LIMITS = (1, 100_000)
PERIODS = (1_000, 7 * 86_400_000)
CONCURRENCY = "concurrency"
CONTROL = "override"


@dataclass(frozen=True, slots=True)
class Change:
    """What `workflows limit` did: the limit, in force before and after, and the row."""

    target: Target
    before: int
    after: int
    row: OverrideRow | None  # None: nothing to clear, nothing written
    # A throttle's or rateLimit's periods, before and after.
    before_period_ms: int | None = None
    after_period_ms: int | None = None

    @property
    def old(self) -> str:
        return _rate(self.before, self.before_period_ms)

    @property
    def new(self) -> str:
        return _rate(self.after, self.after_period_ms)

    @property
    def declared(self) -> str:
        return _rate(self.target.declared, self.target.declared_period_ms)

    def text(self) -> str:
        what = self.target.describe()
        if self.row is None:
            return f"{what} has no override: it is the declared {self.declared}"
        if self.row.limit is None:
            return (f"cleared the override of the {what}: {self.old} -> {self.new} "
                    "(the declared limit)")
        return f"{what}: {self.old} -> {self.new} (declared {self.declared})"


def _rate(limit: int, period_ms: int | None) -> str:
    """`4`, or a throttle's or rateLimit's `10 per 1m`."""
    return str(limit) if period_ms is None else f"{limit} per {format_duration(period_ms)}"


@dataclass(frozen=True, slots=True)
class Preview:
    """What a change would do now: the limit before and after, and per the budget's keys,
    the waiting starts it admits at once and the runs over it that drain. A throttle's or
    rateLimit's also has its periods, and `note` says what it does to what waits."""

    target: Target
    before: int
    after: int
    waiting: int
    admitted_now: int
    draining: int
    before_period_ms: int | None = None
    after_period_ms: int | None = None
    note: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"control": self.target.control, "limit": self.target.describe(),
                "budget": self.target.budget, "declared": self.target.declared,
                "declared_text": _rate(self.target.declared, self.target.declared_period_ms),
                "before": self.before, "after": self.after,
                "old": _rate(self.before, self.before_period_ms),
                "new": _rate(self.after, self.after_period_ms),
                "waiting": self.waiting, "admitted_now": self.admitted_now,
                "draining": self.draining, "note": self.note}


def preview(target: Target, current: Mapping[str, OverrideRow], limit: int | None,
            held: Mapping[str, int], waiting: Mapping[str, int],
            period_ms: int | None = None, key_limits: Mapping[str, int] | None = None,
            ) -> Preview:
    """What setting `limit` (None: clearing) on `target` would do, from the slots held
    and the starts waiting per key of its budget: each key admits its waiting starts up to
    the new limit at once; a key holding more than it keeps its runs, which drain. A
    cleared override returns each key to its own limit (`key_limits`: the limits table's,
    for a limit declared per_key), else to the declared one. A
    throttle or a rateLimit (`period_ms`: its new period) admits none at once: a throttle
    keeps each key's turn already due and paces the ones after it, and nothing waits at a
    rateLimit (docs/decisions/limit-overrides.md)."""
    row = in_force(current, target.control, target.budget)
    before = effective(target.declared, row)
    after = target.declared if limit is None else limit
    if target.control in (RATE_LIMIT, THROTTLE):
        declared_ms = target.declared_period_ms or 0
        before_ms = effective_period(declared_ms, row)
        after_ms = declared_ms if limit is None or period_ms is None else period_ms
        if target.control == RATE_LIMIT:
            note = ("nothing waits at a rateLimit: the change decides the starts that arrive "
                    "after it")
        else:
            note = (f"each key's turn already due stands; the turns after it come one each "
                    f"{_every(after, after_ms)} instead of one each {_every(before, before_ms)}")
        return Preview(target, before, after, sum(waiting.values()), 0, 0, before_ms,
                       after_ms, note)
    keys = set(held) | set(waiting)

    def after_at(key: str) -> int:
        return after if limit is not None else (key_limits or {}).get(key, after)

    return Preview(
        target, before, after, sum(waiting.values()),
        admitted_now=sum(min(waiting.get(k, 0), max(0, after_at(k) - held.get(k, 0)))
                         for k in keys),
        draining=sum(max(0, held.get(k, 0) - after_at(k)) for k in keys))


def _every(limit: int, period_ms: int) -> str:
    """The spacing of a pace: 10 per 2s is one each `200ms`."""
    return format_duration(max(1, round(period_ms / limit)))


def held_by_key(target: Target, runs: Iterable[RunRow]) -> dict[str, int]:
    """The slots of `target`'s budget its live runs hold, per key (as the ledger shows it)."""
    held: dict[str, int] = {}
    for run in runs:
        if run.status in ENDED:
            continue
        for slot in run.slots:
            if slot.stage == target.control and ControlKey.parse(slot.key).budget == target.budget:
                text = key_text(slot.key)
                held[text] = held.get(text, 0) + 1
    return held


WAITING_SQL = f"""
WITH {LATEST}
SELECT workflow, control, coalesce(key, '') AS key, count(*)
FROM latest
WHERE outcome = 'queued' AND deferral = $deferral AND NOT starts_with(request_id, 'run:')
GROUP BY ALL
"""


def waiting_by_key(target: Target, app: App, db: LedgerDb) -> dict[str, int]:
    """The starts waiting for a slot (a throttle's turn) of `target`'s budget, per key,
    from the ledger: those whose latest row is queued by the limit it names. None waits
    at a rateLimit."""
    if target.control == RATE_LIMIT:
        return {}
    names = set()
    for workflow in target.workflows:
        wf = app.workflows[workflow]
        for hop in route_for(wf).hops:
            if hop.stage == target.control and hop.budget == target.budget:
                names.add((workflow, control_name(wf, hop)))
    waiting: dict[str, int] = {}
    for workflow, control, key, n in db.query(WAITING_SQL, {"deferral": target.control}).rows:
        if (workflow, control) in names:
            waiting[str(key)] = waiting.get(str(key), 0) + int(n)
    return waiting


def overrides_in_force(settings: Settings, timeout_s: float = 10.0) -> dict[str, OverrideRow]:
    """Every override row of the control table, by target (cleared ones too)."""
    table = ControlTable(settings)
    try:
        table.catch_up(timeout_s=timeout_s)
        return table.overrides
    finally:
        table.close()


def ledger_rows(change: Change) -> list[LedgerRecord]:
    """One row per workflow the limit judges: what changed, who changed it and why."""
    row = change.row
    assert row is not None
    by = f" by {row.by}" if row.by else ""
    why = f": {row.reason}" if row.reason else ""
    what = ("cleared, the declared limit again" if row.limit is None
            else f"declared {change.declared}")
    reason = (f"override of the {change.target.describe()}: {change.old} -> "
              f"{change.new} ({what}){by}{why}")
    return [LedgerRecord(
        request_id=f"override:{change.target.name}:{row.at_ms}:{workflow}",
        workflow=workflow, outcome=Outcome.overridden, requested_at_ms=row.at_ms,
        decided_at_ms=row.at_ms, stage=row.control, reason=reason, control=CONTROL)
        for workflow in change.target.workflows]


def parse_rate(text: str) -> tuple[int, int]:
    """`10/1m` (a limit per a period, as declared) -> (10, 60000)."""
    # The same form for --rate-limit and --throttle.
    limit, slash, period = text.partition("/")
    try:
        if not slash:
            raise ValueError("no '/'")
        return int(limit.strip()), parse_duration(period.strip())
    except (ValueError, TypeError) as exc:
        raise OverrideError(f"a rate is LIMIT/PERIOD, as 10/1m or 100/1h, not "
                            f"{text!r} ({exc})") from None


def change_limit(settings: Settings, app: App, workflow: str | None = None, *,
                 concurrency: int | None = None, rate_limit: tuple[int, int] | None = None,
                 throttle: tuple[int, int] | None = None, control: str = CONCURRENCY,
                 pool: str | None = None, nth: int = 1, reason: str, by: str | None = None,
                 current: Mapping[str, OverrideRow] | None = None) -> Change:
    """Override a limit `app` declares, fleet-wide: a concurrency limit (`concurrency`),
    a rateLimit or a throttle (`rate_limit`, `throttle`: limit and period in ms). None
    given: clear the override of `control`. `current`: the control table's override
    rows, when read already. OverrideError for a limit that cannot be overridden or out
    of range."""
    rate = rate_limit if rate_limit is not None else throttle
    if rate is not None:
        control = RATE_LIMIT if rate_limit is not None else THROTTLE
    target = target_of(app, workflow, control, pool=pool, nth=nth)
    limit, period_ms = rate if rate is not None else (concurrency, None)
    if limit is not None and not LIMITS[0] <= limit <= LIMITS[1]:
        raise OverrideError(f"{target.describe()}: a limit must be between {LIMITS[0]} and "
                            f"{LIMITS[1]:,}, not {limit}")
    if period_ms is not None and not PERIODS[0] <= period_ms <= PERIODS[1]:
        raise OverrideError(f"{target.describe()}: a period must be between 1s "
                            f"and 7d, not {format_duration(period_ms)}")
    rows = overrides_in_force(settings) if current is None else current
    previous = in_force(rows, target.control, target.budget)
    declared_ms = target.declared_period_ms
    before = effective(target.declared, previous)
    before_ms = None if declared_ms is None else effective_period(declared_ms, previous)
    if limit is None and previous is None:
        return Change(target, before, before, None, before_ms, before_ms)
    row = override_row(target, time.time_ns() // 1_000_000, limit, period_ms, reason=reason,
                       by=who(by))
    change = Change(target, before, effective(target.declared, row), row, before_ms,
                    None if declared_ms is None else effective_period(declared_ms, row))
    _write(settings, row, ledger_rows(change))
    return change


def _write(settings: Settings, row: OverrideRow, ledger: Iterable[LedgerRecord],
           timeout_s: float = 30.0) -> None:
    """The control row and its ledger rows in one transaction: both or neither."""
    topics = Topics(settings)
    producer = Producer(settings.client_config(**{
        "transactional.id": f"{settings.namespace}override-{uuid.uuid4()}",
        "partitioner": "murmur2_random"}))
    try:
        producer.init_transactions(timeout_s)
        producer.begin_transaction()
        producer.produce(topics.control, codec.encode(row),
                         override_key(row.control, row.budget))
        for record in ledger:
            producer.produce(topics.ledger, codec.encode(record), record.request_id.encode())
        producer.commit_transaction(timeout_s)
    except KafkaException as exc:
        raise RuntimeError(f"could not write the override of {row.control} {row.budget}: "
                           f"{exc}") from exc


def describe_override(row: OverrideRow, *, now_ms: int | None = None) -> str:
    """`override since 03:12 by alice: "partner 503s"; declared 50`, as the flow view
    shows it beside a limit."""
    since = clock(row.at_ms, now_ms if now_ms is not None else time.time_ns() // 1_000_000)
    by = f" by {row.by}" if row.by else ""
    why = f': "{row.reason}"' if row.reason else ""
    declared = f"; declared {row.declared}" if row.declared is not None else ""
    return f"override since {since}{by}{why}{declared}"
