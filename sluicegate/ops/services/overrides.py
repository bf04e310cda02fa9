"""Overrides of declared limits at run time: `sluicegate workflows limit` (issue 35, point 1).

An override is one row of the compacted control table keyed by the limit it changes
(`override:<control>:<budget>`, admission/overrides.py), read by every worker as a pause
row is, so it applies fleet-wide within about a second; `--clear` writes a row without a
limit (not a tombstone: the workers are told, and the row keeps who cleared it). Each
change is also a ledger row per workflow the limit judges (outcome `overridden`, control
`override`), with the old and the new limit, who and why, written in the same Kafka
transaction as the control row. What a change does to runs and waiting starts is the
concurrency stage's business (docs/decisions/limit-overrides.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from sluicegate.admission.control import ControlTable
from sluicegate.admission.overrides import (
    OverrideError,
    Target,
    concurrency_target,
    effective,
    in_force,
    override_key,
)
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.ops.services.control import who
from sluicegate.ops.services.formatting import clock
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Outcome, OverrideRow
from sluicegate.topology.topics import Topics

__all__ = ["Change", "OverrideError", "change_limit", "describe_override", "ledger_rows",
           "overrides_in_force"]

# The range a declared concurrency limit may take (SPEC.md section 1).
LIMITS = (1, 100_000)
CONTROL = "override"


@dataclass(frozen=True, slots=True)
class Change:
    """What `workflows limit` did: the limit, in force before and after, and the row."""

    target: Target
    before: int
    after: int
    row: OverrideRow | None  # None: nothing to clear, nothing written

    def text(self) -> str:
        what = self.target.describe()
        if self.row is None:
            return f"{what} has no override: it is the declared {self.target.declared}"
        if self.row.limit is None:
            return (f"cleared the override of the {what}: {self.before} -> {self.after} "
                    "(the declared limit)")
        return f"{what}: {self.before} -> {self.after} (declared {self.target.declared})"


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
            else f"declared {change.target.declared}")
    reason = (f"override of the {change.target.describe()}: {change.before} -> "
              f"{change.after} ({what}){by}{why}")
    return [LedgerRecord(
        request_id=f"override:{change.target.name}:{row.at_ms}:{workflow}",
        workflow=workflow, outcome=Outcome.overridden, requested_at_ms=row.at_ms,
        decided_at_ms=row.at_ms, stage=row.control, reason=reason, control=CONTROL)
        for workflow in change.target.workflows]


def change_limit(settings: Settings, app: App, workflow: str | None = None, *,
                 concurrency: int | None, pool: str | None = None, nth: int = 1,
                 reason: str, by: str | None = None,
                 current: Mapping[str, OverrideRow] | None = None) -> Change:
    """Override (or, with `concurrency` None, clear the override of) a concurrency limit
    `app` declares, fleet-wide. `current`: the control table's override rows, when read
    already. OverrideError for a limit that cannot be overridden or out of range."""
    target = concurrency_target(app, workflow, pool=pool, nth=nth)
    if concurrency is not None and not LIMITS[0] <= concurrency <= LIMITS[1]:
        raise OverrideError(f"{target.describe()}: a concurrency limit must be between "
                            f"{LIMITS[0]} and {LIMITS[1]:,}, not {concurrency}")
    rows = overrides_in_force(settings) if current is None else current
    previous = in_force(rows, target.control, target.budget)
    before = effective(target.declared, previous)
    if concurrency is None and previous is None:
        return Change(target, before, before, None)
    row = OverrideRow(control=target.control, budget=target.budget,
                      at_ms=time.time_ns() // 1_000_000, limit=concurrency,
                      declared=target.declared, reason=reason, by=who(by))
    change = Change(target, before, effective(target.declared, row), row)
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
