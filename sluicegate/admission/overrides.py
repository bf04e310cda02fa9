"""Operators' overrides of declared limits: which limit is in force.

An override is a row of the control table (`OverrideRow`, keyed `override:<control>:
<budget>`), written by `sluicegate workflows limit` and read by every worker as pause rows
are. It names a budget, as a route's hops do: a workflow's first concurrency limit is
the workflow's name, its second `<workflow>#1`, a pool's `pool:<name>`; every member of a
pool reads the pool's one row. The declaration stays the default: the limit in force is
the override's while one is set, else the declared one. That choice is made here alone,
so a stage asks `effective` and never reads an override itself
(docs/decisions/limit-overrides.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sluicegate.declare import App
from sluicegate.schemas.records import OverrideRow

OVERRIDE_PREFIX = "override:"


def target(control: str, budget: str) -> str:
    """The name of what an override changes: `concurrency:pool:gpu`, `concurrency:orders`."""
    return f"{control}:{budget}"


def override_key(control: str, budget: str) -> bytes:
    """Its key on the compacted control topic: the latest row per limit wins."""
    return f"{OVERRIDE_PREFIX}{target(control, budget)}".encode()


def in_force(overrides: Mapping[str, OverrideRow], control: str,
             budget: str) -> OverrideRow | None:
    """The override set on `budget`'s `control` limit (None: none, or cleared)."""
    row = overrides.get(target(control, budget))
    return row if row is not None and row.limit is not None else None


def effective(declared: int, row: OverrideRow | None) -> int:
    """The limit in force: the override's while one is set, else the declared one."""
    return declared if row is None or row.limit is None else row.limit


def effective_period(declared_ms: int, row: OverrideRow | None) -> int:
    """The period in force (a rateLimit's): the override's when it sets one."""
    return declared_ms if row is None or row.period_ms is None else row.period_ms


class OverrideError(ValueError):
    """An override that names no limit it could change; the message says which to name."""


@dataclass(frozen=True, slots=True)
class Target:
    """The limit an override changes: its budget, the declared limit, the workflows whose
    starts it judges."""

    control: str
    budget: str
    declared: int
    workflows: tuple[str, ...]
    declared_period_ms: int | None = None  # a rateLimit's
    # The limits table's rows its keys take their limits from while no override is set.
    per_key: str | None = None

    @property
    def name(self) -> str:
        return target(self.control, self.budget)

    def describe(self) -> str:
        """`concurrency limit of pool:gpu`, `concurrency limit 2 of orders`, `rateLimit of
        alerts`."""
        if self.control in (RATE_LIMIT, THROTTLE):
            return f"{self.control} of {self.budget}"
        if self.budget.startswith("pool:"):
            return f"{self.control} limit of {self.budget}"
        workflow, _, index = self.budget.partition("#")
        nth = f" {int(index) + 1}" if index else ""
        return f"{self.control} limit{nth} of {workflow}"


def concurrency_target(app: App, workflow: str | None = None, *, pool: str | None = None,
                       nth: int = 1) -> Target:
    """The concurrency limit `workflow --nth N` or `--pool P` names in `app`. A pool is
    named as a pool: an override of one member's limit would be every member's, so it is
    refused with the pool's name. A limit shared by a scope (account/env) is refused."""
    control = "concurrency"
    if pool is not None:
        if workflow is not None:
            raise OverrideError("name a workflow or a pool, not both")
        members = [(wf.name, c) for wf in app.workflows.values() for c in wf.concurrency
                   if c.pool == pool]
        if not members:
            pools = sorted({c.pool for wf in app.workflows.values() for c in wf.concurrency
                            if c.pool is not None})
            raise OverrideError(f"no workflow declares a concurrency limit in pool {pool!r} "
                                f"(pools declared: {', '.join(pools) or 'none'})")
        return Target(control, f"pool:{pool}", members[0][1].limit,
                      tuple(sorted({name for name, _ in members})),
                      per_key=members[0][1].per_key)
    if workflow is None:
        raise OverrideError("name a workflow, or a pool with --pool")
    wf = app.get(workflow)
    if wf is None:
        raise OverrideError(f"workflow {workflow!r} is not declared")
    if not wf.concurrency:
        raise OverrideError(f"workflow {workflow} declares no concurrency limit")
    if not 1 <= nth <= len(wf.concurrency):
        raise OverrideError(f"workflow {workflow} declares {len(wf.concurrency)} concurrency "
                            f"limit{'s' if len(wf.concurrency) > 1 else ''}: --nth must be "
                            f"between 1 and {len(wf.concurrency)}")
    option = wf.concurrency[nth - 1]
    if option.pool is not None:
        raise OverrideError(f"workflow {workflow}'s concurrency limit {nth} is pool "
                            f"{option.pool!r}, shared with other workflows: name it with "
                            f"--pool {option.pool}")
    if option.shared_budget is not None:
        raise OverrideError(f"workflow {workflow}'s concurrency limit {nth} is shared by its "
                            f"scope ({option.scope!r}) with other workflows: an override of "
                            "a scope's limit is not supported")
    budget = workflow if nth == 1 else f"{workflow}#{nth - 1}"
    return Target(control, budget, option.limit, (workflow,), per_key=option.per_key)


RATE_LIMIT = "rateLimit"
THROTTLE = "throttle"


def rate_limit_target(app: App, workflow: str | None) -> Target:
    """The rateLimit `workflow` declares (its budget is the workflow's name)."""
    if workflow is None:
        raise OverrideError("name the workflow whose rateLimit changes")
    wf = app.get(workflow)
    if wf is None:
        raise OverrideError(f"workflow {workflow!r} is not declared")
    if wf.rate_limit is None:
        raise OverrideError(f"workflow {workflow} declares no rateLimit")
    return Target(RATE_LIMIT, workflow, wf.rate_limit.limit, (workflow,),
                  wf.rate_limit.period_ms)


def throttle_target(app: App, workflow: str | None, pool: str | None = None) -> Target:
    """The throttle `workflow` declares, or a throttle pool (every member's pace). A
    workflow with several throttles is refused (they are judged together elsewhere)."""
    if pool is not None:
        if workflow is not None:
            raise OverrideError("name a workflow or a pool, not both")
        members = [(wf.name, t) for wf in app.workflows.values() for t in wf.throttle
                   if t.pool == pool]
        if not members:
            raise OverrideError(f"no workflow declares a throttle in pool {pool!r}")
        first = members[0][1]
        return Target(THROTTLE, f"pool:{pool}", first.limit,
                      tuple(sorted({name for name, _ in members})), first.period_ms)
    if workflow is None:
        raise OverrideError("name a workflow, or a throttle pool with --pool")
    wf = app.get(workflow)
    if wf is None:
        raise OverrideError(f"workflow {workflow!r} is not declared")
    if not wf.throttle:
        raise OverrideError(f"workflow {workflow} declares no throttle")
    if len(wf.throttle) > 1:
        raise OverrideError(f"workflow {workflow} declares {len(wf.throttle)} throttles: an "
                            "override of one of several is not supported")
    option = wf.throttle[0]
    if option.pool is not None:
        raise OverrideError(f"workflow {workflow}'s throttle is pool {option.pool!r}, shared "
                            f"with other workflows: name it with --pool {option.pool}")
    return Target(THROTTLE, workflow, option.limit, (workflow,), option.period_ms)


def target_of(app: App, workflow: str | None, control: str = "concurrency", *,
              pool: str | None = None, nth: int = 1) -> Target:
    """The limit an override names: a concurrency limit (a workflow's nth, or a pool's),
    a throttle (a workflow's, or a pool's) or a workflow's rateLimit."""
    if control == THROTTLE:
        if nth != 1:
            raise OverrideError("--nth names a concurrency limit, not a throttle")
        return throttle_target(app, workflow, pool)
    if control == RATE_LIMIT:
        if pool is not None or nth != 1:
            raise OverrideError("a rateLimit is a workflow's own: no --pool, no --nth")
        return rate_limit_target(app, workflow)
    if control != "concurrency":
        raise OverrideError(f"no override of {control!r}: concurrency, throttle or "
                            "rateLimit")
    return concurrency_target(app, workflow, pool=pool, nth=nth)


def targets(app: App) -> list[Target]:
    """Every limit of `app` an override may name, once each, by name: each workflow's own
    concurrency limits (its first, its second) and each pool's, each throttle (a
    workflow's one, or a pool's) and each rateLimit. A scope's limit and one of several
    throttles are not among them (no override names them)."""
    found: dict[str, Target] = {}
    for wf in app.workflows.values():
        for nth, option in enumerate(wf.concurrency, 1):
            if option.pool is not None or option.shared_budget is None:
                made = (concurrency_target(app, pool=option.pool) if option.pool is not None
                        else concurrency_target(app, wf.name, nth=nth))
                found[made.name] = made
        if len(wf.throttle) == 1:
            pool = wf.throttle[0].pool
            made = throttle_target(app, None if pool is not None else wf.name, pool)
            found[made.name] = made
        if wf.rate_limit is not None:
            made = rate_limit_target(app, wf.name)
            found[made.name] = made
    return [found[name] for name in sorted(found)]


def override_row(target: Target, at_ms: int, limit: int | None, period_ms: int | None = None,
                 *, reason: str | None = None, by: str | None = None) -> OverrideRow:
    """The row that puts `limit` (None: clears the override) in force on `target`."""
    if limit is None:
        period_ms = None
    elif target.control in (RATE_LIMIT, THROTTLE) and period_ms is None:
        period_ms = target.declared_period_ms
    return OverrideRow(control=target.control, budget=target.budget, at_ms=at_ms,
                       limit=limit, period_ms=period_ms, declared=target.declared,
                       reason=reason, by=by)
