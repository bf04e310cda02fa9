"""The paces a workflow is held to, as the flow view and the console show them: each
throttle (a workflow's one, one of its several, a pool's) and each rateLimit, with the
limit in force and where it comes from (issue 35, "shows everywhere a limit shows").

A pace is LIMIT per PERIOD. The one in force is an operator's override's while one is set
on its budget (`overrides.effective`, `effective_period`), else, for a key of a limit
declared `per_key`, the key's row of the limits table (its limit; the period stays the
declared one), else the declared one: the rule the throttle and rateLimit stages apply
(docs/decisions/limit-overrides.md, limits-table.md). A workflow's line of the flow view
gets one line per pace, `throttle 10/1m (override since 03:12:00 UTC by ana: "partner
503s"; declared 100/1m)`; a key whose own limit comes from the table says so on its line,
`throttle=30/1m (from sg.limits; declared 10/1m)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sluicegate.admission.limits import LimitChange
from sluicegate.admission.overrides import (
    RATE_LIMIT,
    THROTTLE,
    effective,
    effective_period,
    in_force,
    nth_budget,
    target,
)
from sluicegate.declare import App, format_duration
from sluicegate.ops.services.overrides import describe_override
from sluicegate.schemas.records import OverrideRow


def rate_text(limit: int, period_ms: int) -> str:
    """`10/1m`, as `--throttle` and `--rate-limit` take it."""
    return f"{limit}/{format_duration(period_ms)}"


@dataclass(frozen=True, slots=True)
class PaceLimit:
    """A throttle's or a rateLimit's pace: declared, and in force (`limit`, `period_ms`)."""

    kind: str  # the override's control: `throttle` or `rateLimit`
    budget: str  # `sync`, `sync#1` (a second throttle), `pool:partner`
    # As the flow view names it: `throttle`, `throttle[1]`, `throttle pool:partner`,
    # `rateLimit`.
    control: str
    limit: int
    period_ms: int
    declared: int
    declared_period_ms: int
    keyed: bool = False
    per_key: str | None = None  # the limits table's rows a key's limit comes from
    members: tuple[str, ...] = ()
    override: OverrideRow | None = None

    @property
    def name(self) -> str:
        return target(self.kind, self.budget)

    def of_key(self, key: str | None, rows: Mapping[tuple[str, str], LimitChange],
               ) -> LimitChange | None:
        """The limits table's row `key`'s limit comes from, if it does (no override set)."""
        if self.override is not None or self.per_key is None or key is None:
            return None
        row = rows.get((self.per_key, key))
        return row if row is not None and row.limit is not None else None

    def text(self, now_ms: int, limits_topic: str = "sg.limits") -> str:
        """`throttle 10/1m (override since ...; declared 100/1m)`, `rateLimit 5/1m per key
        (or its row of tiers in sg.limits)`."""
        per = (f" per key (or its row of {self.per_key} in {limits_topic})"
               if self.per_key is not None and self.override is None
               else " per key" if self.keyed else "")
        if self.override is None:
            return f"{self.control} {rate_text(self.limit, self.period_ms)}{per}"
        said = describe_override(replace(self.override, declared=None), now_ms=now_ms)
        declared = rate_text(self.declared, self.declared_period_ms)
        return (f"{self.control} {rate_text(self.limit, self.period_ms)}{per} "
                f"({said}; declared {declared})")

    def key_text(self, row: LimitChange, limits_topic: str = "sg.limits") -> str:
        """`throttle=30/1m (from sg.limits; declared 10/1m)`, on a key's line."""
        assert row.limit is not None
        return (f"{self.control}={rate_text(row.limit, self.period_ms)} (from {limits_topic}; "
                f"declared {rate_text(self.declared, self.declared_period_ms)})")

    def to_json(self) -> dict[str, Any]:
        row = self.override
        return {"control": self.control, "kind": self.kind, "budget": self.budget,
                "limit": self.limit, "period_ms": self.period_ms, "keyed": self.keyed,
                "per_key": self.per_key, "members": list(self.members),
                "declared": self.declared, "declared_period_ms": self.declared_period_ms,
                "override": None if row is None else {
                    "limit": row.limit, "period_ms": row.period_ms, "at_ms": row.at_ms,
                    "by": row.by, "reason": row.reason}}


def pace_limits(app: App | None) -> dict[str, PaceLimit]:
    """Every throttle and rateLimit `app` declares, by its override's name, as declared
    (a pool's once, with its members)."""
    paces: dict[str, PaceLimit] = {}
    for name, wf in sorted(app.workflows.items()) if app is not None else ():
        several = len(wf.throttle) > 1
        for index, throttle in enumerate(wf.throttle):
            if throttle.pool is not None:
                budget, control = f"pool:{throttle.pool}", f"throttle pool:{throttle.pool}"
            else:
                budget = nth_budget(name, index)
                control = f"throttle[{index}]" if several else "throttle"
            found = paces.get(target(THROTTLE, budget))
            paces[target(THROTTLE, budget)] = PaceLimit(
                THROTTLE, budget, control, throttle.limit, throttle.period_ms,
                throttle.limit, throttle.period_ms, keyed=throttle.key is not None,
                # The stage takes a key's limit from the table for a workflow's one throttle.
                per_key=None if several else throttle.per_key,
                members=(*(found.members if found is not None else ()), name))
        option = wf.rate_limit
        if option is not None:
            paces[target(RATE_LIMIT, name)] = PaceLimit(
                RATE_LIMIT, name, "rateLimit", option.limit, option.period_ms, option.limit,
                option.period_ms, keyed=option.key is not None, per_key=option.per_key,
                members=(name,))
    return paces


def with_overrides(paces: Mapping[str, PaceLimit],
                   overrides: Mapping[str, OverrideRow]) -> dict[str, PaceLimit]:
    """The declared `paces` with the overrides in force."""
    out = {}
    for name, pace in paces.items():
        row = in_force(overrides, pace.kind, pace.budget)
        out[name] = replace(pace, limit=effective(pace.declared, row),
                            period_ms=effective_period(pace.declared_period_ms, row),
                            override=row)
    return out


def of_workflow(paces: Mapping[str, PaceLimit], workflow: str) -> tuple[PaceLimit, ...]:
    """`workflow`'s paces, its throttles in declaration order, then its rateLimit."""
    return tuple(sorted((p for p in paces.values() if workflow in p.members),
                        key=lambda p: (p.kind != THROTTLE, p.control)))
