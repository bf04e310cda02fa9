"""The load-time rules. Each returns messages; nothing raises until App has them all.

`check_workflow` judges one workflow on its own (messages without the `workflow f:` prefix,
which the Workflow adds); `check_app` judges the set (pools, onFailure targets, duplicate
names, encryption), with full messages.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sluicegate.declare.durations import format_duration
from sluicegate.declare.failure import FailureReport

if TYPE_CHECKING:
    from sluicegate.declare.options import Option
    from sluicegate.declare.workflow import Workflow

MAX_LIMIT = 100_000
SECOND = 1_000
HOUR = 3_600_000
WEEK = 7 * 24 * HOUR
AGE_PRIORITY = 600
MAX_CONCURRENCY_LIMITS = 2
# The most turns in a row a fairness value may be given (`Concurrency.weights`).
MAX_FAIR_WEIGHT = 100
# The most events a debounce that hands over every event may gather into one run.
MAX_DEBOUNCE_EVENTS = 1000
# Names end up in Kafka keys and topic-derived names, where ':' separates parts.
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")
_NAME_RULE = "letters, digits, '_', '.' and '-', at most 200, not starting with '.' or '-'"


def check_workflow(wf: Workflow) -> list[str]:
    problems: list[str] = []
    if not NAME.fullmatch(wf.name):
        problems.append(f"name {wf.name!r} is not a valid workflow name ({_NAME_RULE})")
    problems += _combinations(wf)
    problems += _ranges(wf)
    problems += _concurrency(wf.concurrency)
    problems += _priority(wf)
    problems += _batch_shape(wf)
    for entry in wf.cancel_on:
        if not entry.valid:
            continue
        if entry.match is None:
            problems.append(
                f"cancel_on {entry.event!r} match is required: an omitted match would cancel "
                "every live run; write match='true' if that is what you mean"
            )
        if not entry.event:
            problems.append("cancel_on event must name the event")
    return problems


def _combinations(wf: Workflow) -> list[str]:
    problems = []
    if wf.throttle and wf.rate_limit:
        problems.append(
            "throttle and rate_limit cannot both be declared: throttle queues the excess, "
            "rate_limit drops it; pick one"
        )
    if len(wf.throttle) > 1 and any(t.pool is not None for t in wf.throttle):
        problems.append(
            "throttle pool cannot be shared by a workflow that declares several throttles: "
            "its starts are paced together on one partition of their own, where the "
            "pool's other members never come; declare the pool's throttle alone"
        )
    if len(wf.throttle) > 1 and any(t.per_key is not None for t in wf.throttle):
        problems.append(
            "throttle per_key cannot be declared by a workflow that declares several "
            "throttles: declare the per-key throttle alone"
        )
    if wf.batch and wf.debounce:
        problems.append(
            "batch and debounce cannot both be declared: a batch timeout is a deadline, a "
            "debounce period a quiet time that resets; pick one"
        )
    if wf.timeouts and wf.timeouts.start is not None and not wf.defers:
        problems.append(
            "timeouts start needs a deferring control (debounce, batch, throttle, "
            "concurrency or singleton mode 'queue'): without one a start never waits, so "
            "it could never fire"
        )
    if wf.singleton and wf.singleton.mode is None:
        problems.append(
            "singleton mode is required: 'skip' stands the newcomer down, 'cancel' cancels "
            "the incumbent, 'queue' keeps the newcomer waiting for the incumbent to end (a "
            "later one replacing it), and a default would silently throw away one or another"
        )
    return problems


def _ranges(wf: Workflow) -> list[str]:
    out: list[str] = []
    for option in (wf.rate_limit, *wf.throttle):
        if option is not None:
            out += _between(option, "limit", 1, MAX_LIMIT)
            out += _duration(option, "period", SECOND, WEEK)
            out += _per_key(option)
    for throttle in wf.throttle:
        out += _between(throttle, "burst", 0, MAX_LIMIT)
        out += _queue_cap(throttle)
        pool = throttle.pool
        if pool is not None and not NAME.fullmatch(pool):
            out.append(f"throttle pool {pool!r} is not a valid pool name ({_NAME_RULE})")
    if wf.debounce is not None:
        out += _duration(wf.debounce, "period", SECOND, WEEK)
        out += _duration(wf.debounce, "timeout", SECOND, WEEK)
        out += _queue_cap(wf.debounce)
        if wf.debounce.events is not None:
            out += _between(wf.debounce, "max_events", 1, MAX_DEBOUNCE_EVENTS)
            out += _at_least(wf.debounce, "max_bytes", 1, "must be more than 0 bytes")
    if wf.batch is not None:
        out += _between(wf.batch, "max_size", 1, 100)
        out += _duration(wf.batch, "timeout", SECOND, HOUR)
        out += _at_least(wf.batch, "max_bytes", 1, "must be more than 0 bytes")
        out += _queue_cap(wf.batch)
    for limit in wf.concurrency:
        out += _between(limit, "limit", 1, MAX_LIMIT)
        out += _per_key(limit)
        out += _floor(limit)
        out += _duration(limit, "lease", SECOND, WEEK)
        out += _queue_cap(limit)
    if wf.idempotency is not None:
        out += _duration(wf.idempotency, "ttl", SECOND, None)
    if wf.timeouts is not None:
        out += _duration(wf.timeouts, "start", SECOND, None)
        out += _duration(wf.timeouts, "finish", SECOND, None)
    for entry in wf.cancel_on:
        out += _duration(entry, "within", SECOND, None)
    return out


def _floor(limit: Any) -> list[str]:
    """A guaranteed share of a concurrency limit per fairness value (admission/floors.py):
    at most the limit. Floors of many values may add up to more than the limit: while
    more values wait than it can hold, they share the slots in the round's order."""
    floor = limit.floor
    if floor is None or not limit.valid:
        return []
    if limit.fair_by is None:
        return [f"concurrency floor needs fair_by: it is each fairness value's guaranteed "
                f"share of the limit's {limit.limit} slots"]
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
        return [f"concurrency floor must be a whole number from 1 to the limit "
                f"({limit.limit}) (got {floor!r})"]
    if isinstance(limit.limit, int) and floor > limit.limit:
        return [f"concurrency floor {floor} is over the limit {limit.limit}: no fairness "
                "value could ever hold it"]
    return []


def _per_key(option: Any) -> list[str]:
    """A limit whose values per key come from the limits table (admission/limits.py)."""
    name = option.per_key
    if name is None:
        return []
    if not NAME.fullmatch(name):
        return [f"{option.option_name} per_key {name!r} is not a valid name for the limits "
                f"table's rows ({_NAME_RULE})"]
    if option.key is None:
        return [f"{option.option_name} per_key {name!r} needs a key: the limits table "
                "gives a limit per value of the key expression"]
    return []


def _between(option: Option, field: str, low: int, high: int) -> list[str]:
    value = getattr(option, field)
    # An option that failed type validation has already said so; its raw values are not judged.
    if not option.valid or (isinstance(value, int) and low <= value <= high):
        return []
    return [f"{option.option_name} {field} must be between {low:,} and {high:,} (got {value!r})"]


def _at_least(option: Option, field: str, low: int, message: str) -> list[str]:
    value = getattr(option, field)
    return [] if not option.valid or (isinstance(value, int) and value >= low) else [
        f"{option.option_name} {field} {message} (got {value!r})"
    ]


def _queue_cap(option: Option) -> list[str]:
    if not option.valid or getattr(option, "max_queued", None) is None:
        return []
    return _at_least(option, "max_queued", 1, "must be at least 1 when set")


def _duration(option: Option, field: str, low: int, high: int | None) -> list[str]:
    ms = option.ms(field)
    if ms is None:  # unset, or it did not parse (already reported)
        return []
    if high is None:
        if ms >= low:
            return []
        return [f"{option.option_name} {field} must be at least {format_duration(low)} "
                f"(got {format_duration(ms)})"]
    if low <= ms <= high:
        return []
    return [f"{option.option_name} {field} must be between {format_duration(low)} and "
            f"{format_duration(high)} (got {format_duration(ms)})"]


def _concurrency(limits: Sequence[Any]) -> list[str]:
    out = []
    if len(limits) > MAX_CONCURRENCY_LIMITS:
        out.append(f"concurrency declares {len(limits)} limits; at most "
                   f"{MAX_CONCURRENCY_LIMITS} are allowed")
    seen: set[tuple[str, str | None, str]] = set()
    for limit in limits:
        if not limit.valid:
            continue
        if limit.scope != "fn" and limit.key is None:
            out.append(f"concurrency scope {limit.scope!r} requires a key: the key expression "
                       "is what workflows sharing the limit have in common")
        if limit.scope != "fn" and limit.pool is not None:
            out.append(f"concurrency pool {limit.pool!r} and scope {limit.scope!r} are two ways "
                       "to share a budget; declare one")
        if limit.pool is not None and not NAME.fullmatch(limit.pool):
            out.append(f"concurrency pool {limit.pool!r} is not a valid pool name ({_NAME_RULE})")
        if limit.weights is not None and limit.fair_by is None:
            out.append("concurrency weights need fair_by: they weigh the values of the "
                       "fairness key")
        for value, weight in (limit.weights or {}).items():
            if isinstance(weight, bool) or not 1 <= weight <= MAX_FAIR_WEIGHT:
                out.append(f"concurrency weights[{value!r}] must be a whole number from 1 to "
                           f"{MAX_FAIR_WEIGHT} (got {weight!r})")
        expr = limit._exprs.get("key") if limit._exprs else None
        identity = (limit.scope, limit.pool, expr.canonical if expr else str(limit.key))
        if identity in seen:
            out.append(f"concurrency declares two limits with the same scope and key "
                       f"(scope {limit.scope!r}, key {limit.key!r})")
        seen.add(identity)
    return out


def _priority(wf: Workflow) -> list[str]:
    priority = wf.priority
    if priority is None or priority.mode != "age" or not priority._exprs:
        return []
    expr = priority._exprs.get("expr")
    if expr is None:
        return []
    out = []
    for value in expr.constant_results:
        if isinstance(value, bool) or not isinstance(value, int | float):
            out.append(f"priority expr gives {value!r}, which is not a number of seconds")
        elif not -AGE_PRIORITY <= value <= AGE_PRIORITY:
            out.append(f"priority in age mode must be between -{AGE_PRIORITY} and "
                       f"{AGE_PRIORITY} seconds (got {value!r})")
    return out


def _batch_shape(wf: Workflow) -> list[str]:
    if wf.batch is not None and wf.batch.valid:
        return _list_shape(wf, wf.batch.item, "batch item", "items", "the batch")
    if wf.debounce is not None and wf.debounce.valid and wf.debounce.events is not None:
        return _list_shape(wf, wf.debounce.events, "debounce events", "events",
                           "every event of the window")
    return []


def _list_shape(wf: Workflow, model: type[Any], where: str, name: str,
                what: str) -> list[str]:
    """The workflow's payload must hold what the run receives: `name: list[model]`."""
    wanted = (f"its payload must have a field {name}: list[{model.__name__}], {what} the run "
              "receives")
    field = wf.payload.model_fields.get(name)
    if field is None:
        return [f"{where}: {wanted}; {wf.payload.__name__} has no field {name}"]
    element = _list_element(field.annotation)
    if element is None or not (isinstance(element, type) and issubclass(model, element)):
        return [f"{where}: {wanted}; {wf.payload.__name__}.{name} is {field.annotation}"]
    return []


def _list_element(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (list, tuple, Sequence, typing.Sequence) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return None
        return args[0]
    return None


# --- across workflows -----------------------------------------------------------------------


def check_app(workflows: Iterable[Workflow], *, encryption_configured: bool) -> list[str]:
    listed = list(workflows)
    by_name: dict[str, Workflow] = {}
    problems: list[str] = []
    for wf in listed:
        if wf.name in by_name:
            problems.append(f"workflow {wf.name}: is declared twice; workflow names must be "
                            "unique")
        by_name.setdefault(wf.name, wf)
    for wf in listed:
        if wf.encrypt_payloads and not encryption_configured:
            problems.append(
                f"workflow {wf.name}: encrypt_payloads is declared but no encryption key is "
                "configured (set Settings.encryption_keys / SLUICEGATE_ENCRYPTION_KEYS); "
                "sluicegate will not keep plaintext copies of a payload declared encrypted"
            )
        problems += _on_failure(wf, by_name)
    problems += _pools(listed)
    problems += _throttle_pools(listed)
    return problems


def _on_failure(wf: Workflow, by_name: dict[str, Workflow]) -> list[str]:
    if wf.on_failure is None:
        return []
    handler = by_name.get(wf.on_failure)
    if handler is None:
        return [f"workflow {wf.name}: on_failure names {wf.on_failure!r}, which is not a "
                "declared workflow"]
    problems = []
    if not _is_failure_report(handler.payload):
        problems.append(
            f"workflow {wf.name}: on_failure names {wf.on_failure!r}, whose payload "
            f"{handler.payload.__name__} is not FailureReport (declare payload=FailureReport "
            "or a subclass)"
        )
    if handler.on_failure is not None:
        problems.append(
            f"workflow {handler.name}: is the on_failure handler of {wf.name} and declares "
            f"on_failure {handler.on_failure!r} itself; there is no onFailure for an onFailure "
            "(a failing handler is logged, not re-notified)"
        )
    if wf.encrypt_payloads and not handler.encrypt_payloads:
        problems.append(
            f"workflow {wf.name}: encrypt_payloads is set but its on_failure handler "
            f"{handler.name!r} does not set it; the failure report carries the payload, so "
            "the handler must keep it encrypted too"
        )
    return problems


def _is_failure_report(model: type[BaseModel]) -> bool:
    return isinstance(model, type) and issubclass(model, FailureReport)


def _throttle_pools(workflows: Sequence[Workflow]) -> list[str]:
    """Every member of a throttle pool paces it alike: one rate, burst and queue cap, and
    one set of per-key limits."""
    first: dict[str, tuple[str, tuple[Any, ...]]] = {}
    per_key: dict[str, tuple[str, str | None]] = {}
    problems = []
    for wf in workflows:
        if len(wf.throttle) != 1:
            continue
        (option,) = wf.throttle
        if option.pool is None or not option.valid:
            continue
        pace = (option.limit, option.period_ms, option.burst, option.max_queued)
        if option.pool not in first:
            first[option.pool] = (wf.name, pace)
            per_key[option.pool] = (wf.name, option.per_key)
            continue
        other, other_pace = first[option.pool]
        if pace != other_pace:
            problems.append(
                f"workflow {wf.name}: throttle pool {option.pool!r} declares {_pace(pace)}, "
                f"but workflow {other} declares {_pace(other_pace)}; every member of a "
                "throttle pool must declare the same limit, period, burst and max_queued")
        other, other_rows = per_key[option.pool]
        if other_rows != option.per_key:
            problems.append(
                f"workflow {wf.name}: throttle pool {option.pool!r} declares per_key "
                f"{option.per_key!r}, but workflow {other} declares {other_rows!r}; every "
                "member of a throttle pool must take its limits per key from the same rows")
    return problems


def _pace(pace: tuple[Any, ...]) -> str:
    limit, period, burst, cap = pace
    return f"limit {limit} per {format_duration(period)}, burst {burst}, max_queued {cap}"


def _fairness(limit: Any) -> str:
    return "no fair_by" if limit.fair_by is None else f"fair_by with weights {limit.weights or {}}"


def _pools(workflows: Sequence[Workflow]) -> list[str]:
    first: dict[str, tuple[str, Any]] = {}
    problems = []
    for wf in workflows:
        for limit in wf.concurrency:
            if not limit._exprs:
                continue
            budget = limit.shared_budget
            if budget is None:
                continue
            if budget not in first:
                first[budget] = (wf.name, limit)
                continue
            other, other_limit = first[budget]
            what = (f"pool {limit.pool!r}" if limit.pool is not None
                    else f"shared by key {limit.key!r} (scope {limit.scope!r})")
            if other_limit.limit != limit.limit:
                problems.append(
                    f"workflow {wf.name}: concurrency {what} declares limit {limit.limit}, but "
                    f"workflow {other} declares {other_limit.limit}; every member of a shared "
                    "budget must declare the same limit"
                )
            if other_limit.floor != limit.floor:
                problems.append(
                    f"workflow {wf.name}: concurrency {what} declares floor {limit.floor}, "
                    f"but workflow {other} declares {other_limit.floor}; every member of a "
                    "shared budget must declare the same floor"
                )
            if other_limit.per_key != limit.per_key:
                problems.append(
                    f"workflow {wf.name}: concurrency {what} declares per_key "
                    f"{limit.per_key!r}, but workflow {other} declares "
                    f"{other_limit.per_key!r}; every member of a shared budget must take "
                    "its limits per key from the same rows"
                )
            if ((limit.fair_by is None, limit.weights or {})
                    != (other_limit.fair_by is None, other_limit.weights or {})):
                problems.append(
                    f"workflow {wf.name}: concurrency {what} declares {_fairness(limit)}, but "
                    f"workflow {other} declares {_fairness(other_limit)}; every member of a "
                    "shared budget must declare fairness alike (its expression may differ)"
                )
    return problems
