"""The flow-control options a workflow declares, as frozen pydantic models.

Each option holds what the user wrote (expression sources, duration texts). Durations are
parsed once, at construction, into `<field>_ms`. Expressions are compiled when a Workflow
takes the option, because only the workflow knows the payload schema: the Workflow keeps a
bound copy (`wf.debounce.key_expr`), so one option object can be shared by two workflows
(seed 003's `partnerLimit`). Ranges and cross-option rules live in `validation.py`.

A key left as None means one key for the whole workflow: `key_expr` is then the constant
empty text, so every start of the workflow shares one debounce window, one rate, one slot
budget. (Idempotency is the exception; see Idempotency.)
"""

from __future__ import annotations

from datetime import timedelta
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AliasChoices, BaseModel, BeforeValidator, Field, PrivateAttr

from sluicegate.declare.base import Declared
from sluicegate.declare.durations import parse_duration
from sluicegate.declare.expr_syntax import ExpressionError
from sluicegate.declare.expressions import Expression, compile_expression, constant_expression


def _duration_input(value: Any) -> Any:
    # Text and timedelta pass to the post-init parse (whose problems do not hide the other
    # fields' problems); a bare number is refused here, with the reason.
    if value is None or isinstance(value, str | timedelta):
        return value
    raise ValueError(
        f"{value!r} is not a duration: write it as text with a unit, like '30s' or "
        "'15 minutes' (a bare number means seconds in Python, ms in JavaScript, ns in Go)"
    )


DurationValue = Annotated[str | timedelta, BeforeValidator(_duration_input)]


class Option(Declared):
    """Common machinery: duration parsing and expression binding.

    The accessors (`key_expr`, `period_ms`, ...) are cached properties: stages read them per
    start, and a plain attribute read is much cheaper than pydantic's private-attribute path.
    """

    # Duration fields, parsed into `_ms` at construction.
    duration_fields: ClassVar[tuple[str, ...]] = ()
    # Expression fields: field name -> the name of its compiled form (`key` -> `key_expr`).
    expression_fields: ClassVar[tuple[str, ...]] = ()

    _ms: dict[str, int | None] = PrivateAttr(default_factory=dict)
    _exprs: dict[str, Expression | None] | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any, /) -> None:
        for name in self.duration_fields:
            value = getattr(self, name)
            if value is None:
                self._ms[name] = None
                continue
            try:
                self._ms[name] = parse_duration(value)
            except ValueError as exc:
                self._problems.append(f"{self.option_name} {name}: {exc}")

    def ms(self, name: str) -> int | None:
        """A duration field in milliseconds; None when unset or when it did not parse."""
        return self._ms.get(name)

    def _required_ms(self, name: str) -> int:
        value = self._ms.get(name)
        if value is None:
            raise ValueError(f"{self.option_name} {name} is not a valid duration: "
                             f"{getattr(self, name, None)!r}")
        return value

    # -- expressions

    def bind(self, model: type[BaseModel]) -> Self:
        """A copy with every expression compiled against `model`, compile errors recorded
        as problems (`debounce key: unknown field 'rowid' in Tour ...`)."""
        bound = self.model_copy()
        bound._problems = list(self._problems)
        bound._exprs = {}
        if not self.valid:
            return bound
        for name in self.expression_fields:
            source = getattr(self, name)
            try:
                bound._exprs[name] = self._compile(name, source, model)
            except ExpressionError as exc:
                bound._exprs[name] = None
                bound._problems.append(f"{self.option_name} {_field_label(name)}: {exc}")
        return bound

    def _compile(self, name: str, source: str | None, model: type[BaseModel]) -> Expression | None:
        if source is None:
            return constant_expression("") if name == "key" else None
        return compile_expression(source, model)

    def _expr(self, name: str) -> Expression | None:
        if self._exprs is None:
            raise RuntimeError(
                f"this {self.option_name} is not bound to a payload schema; read it from its "
                f"workflow (app.workflows[name].{self.option_name}), which compiles it"
            )
        return self._exprs.get(name)

    def _required_expr(self, name: str) -> Expression:
        expr = self._expr(name)
        if expr is None:
            raise RuntimeError(f"{self.option_name} {name} did not compile; see the load errors")
        return expr


def _field_label(name: str) -> str:
    return "if" if name == "if_" else name


class _Keyed(Option):
    expression_fields: ClassVar[tuple[str, ...]] = ("key",)
    key: str | None = None

    @cached_property
    def key_expr(self) -> Expression:
        """The compiled key; a constant (empty text) when the key was left out."""
        return self._required_expr("key")


class Idempotency(Option):
    """The execution's identity. Permanent by default (seed 000): a spent key answers
    `existing` forever. With `ttl`, seed 003's window: the key is kept while the run is live
    and `ttl` after it ends. With no `key` there is no expression: starts are deduplicated
    only by the explicit id a caller passes (a `direct` start's id), never all into one."""

    option_name = "idempotency"
    duration_fields = ("ttl",)
    expression_fields = ("key",)
    key: str | None = None
    ttl: DurationValue | None = None

    def _compile(self, name: str, source: str | None, model: type[BaseModel]) -> Expression | None:
        return None if source is None else compile_expression(source, model)

    @cached_property
    def key_expr(self) -> Expression | None:
        return self._expr("key")

    @cached_property
    def ttl_ms(self) -> int | None:
        """None: permanent."""
        return self.ms("ttl")


class RateLimit(_Keyed):
    """At most `limit` admitted per sliding `period` per key; the excess is dropped."""

    option_name = "rate_limit"
    duration_fields = ("period",)
    limit: int
    period: DurationValue
    # The name of this limit's rows in the limits table (`sg.limits`): a key the table
    # names gets the table's limit, any other `limit` (admission/limits.py).
    per_key: str | None = None

    @cached_property
    def period_ms(self) -> int:
        return self._required_ms("period")


class Throttle(_Keyed):
    """At most `limit` started per `period` per key, spaced evenly; the excess waits.
    `burst` extra may start at once after a quiet time (GCRA). `pool` names a pace shared
    by every workflow naming it (per key within the pool)."""

    option_name = "throttle"
    duration_fields = ("period",)
    limit: int
    period: DurationValue
    burst: int = 0
    max_queued: int | None = None
    pool: str | None = None
    # Per-key limits from the limits table, as RateLimit's.
    per_key: str | None = None

    @cached_property
    def period_ms(self) -> int:
        return self._required_ms("period")

    @cached_property
    def shared_budget(self) -> str | None:
        """`pool:<name>` for a pool shared with other workflows, else None."""
        return f"pool:{self.pool}" if self.pool is not None else None


class Debounce(_Keyed):
    """Starts sharing a key collapse into one pending start, run `period` after the last
    arrival with the latest payload; `timeout` caps the wait from the first arrival.

    With `events` (the model each start carries), the run gets every folded start's
    payload instead, `{"events": [...]}` in arrival order; a window that reaches
    `max_events` events, or whose payload one more event would take past `max_bytes`,
    runs early, as a batch does."""

    option_name = "debounce"
    duration_fields = ("period", "timeout")
    period: DurationValue
    timeout: DurationValue | None = None
    events: type[BaseModel] | None = None
    max_events: int = 100
    max_bytes: int = 4 * 1024 * 1024
    # No max_queued: a debounce key holds one pending start (or one window of events).

    @cached_property
    def period_ms(self) -> int:
        return self._required_ms("period")

    @cached_property
    def timeout_ms(self) -> int | None:
        """None: uncapped (starvation then shows as a growing `waiting=`)."""
        return self.ms("timeout")


class Batch(_Keyed):
    """Starts carry one `item`; the run gets `{items: [...]}`, flushed at `max_size` items,
    `max_bytes`, or `timeout` after the oldest item. An item failing `if` runs alone at once.
    `key` and `if` read the item, since they judge each arriving start."""

    option_name = "batch"
    duration_fields = ("timeout",)
    expression_fields = ("key", "if_")
    item: type[BaseModel]
    max_size: int
    timeout: DurationValue
    if_: str | None = Field(default=None, validation_alias=AliasChoices("if", "if_"))
    max_bytes: int = 4 * 1024 * 1024
    # No max_queued: a batch key holds at most max_size items before it runs.

    def bind(self, model: type[BaseModel]) -> Self:
        # The batch's own expressions are over the item, whatever the workflow passes.
        return super().bind(self.item if self.valid else model)

    @cached_property
    def timeout_ms(self) -> int:
        return self._required_ms("timeout")

    @cached_property
    def if_expr(self) -> Expression | None:
        return self._expr("if_")


class Singleton(_Keyed):
    """One active run per key. No default `mode`: `skip` drops the newcomer, `cancel` the
    incumbent, `queue` keeps one newcomer waiting for the incumbent to end (a later one
    replacing it), and any default would silently throw work away (None is a load error)."""

    option_name = "singleton"
    mode: Literal["skip", "cancel", "queue"] | None = None


class Concurrency(_Keyed):
    """At most `limit` runs in flight per key. `pool` names a budget shared by every
    workflow naming it; `scope="account"`/`"env"` (seed 003) shares the budget between every
    workflow using the same key expression. `mode="steps"` frees a slot while the run is
    suspended; `lease` frees a slot whose run went silent (unless timeouts.finish is set).
    `fair_by` serves the waiting starts round-robin across the values of an expression,
    `weights` giving some values more turns (docs/decisions/fairness-option.md); `floor`
    guarantees each value with starts waiting that many slots (concurrency-floor.md)."""

    option_name = "concurrency"
    duration_fields = ("lease",)
    expression_fields = ("key", "fair_by")
    limit: int
    pool: str | None = None
    scope: Literal["fn", "account", "env"] = "fn"
    mode: Literal["runs", "steps"] = "runs"
    lease: DurationValue = "1h"
    max_queued: int | None = None
    # Fairness: the starts waiting at a key are served round-robin across the values of
    # this expression (a tenant, an account), `weights[value]` turns in a row each (1 by
    # default), so one value's backlog cannot hold back the others.
    fair_by: str | None = None
    weights: dict[str, int] | None = None
    # A guaranteed share: every fairness value with starts waiting gets up to `floor` of
    # the limit's slots before the weighted round serves the rest (admission/floors.py).
    floor: int | None = None
    # Per-key limits from the limits table, as RateLimit's.
    per_key: str | None = None

    @cached_property
    def fair_expr(self) -> Expression | None:
        """The compiled fairness key, or None when the limit declares none."""
        return self._expr("fair_by") if self.fair_by is not None else None

    def weight(self, value: str) -> int:
        """The turns in a row the fairness value `value` gets (1 unless declared)."""
        return self.weights.get(value, 1) if self.weights else 1

    @cached_property
    def lease_ms(self) -> int:
        return self._required_ms("lease")

    @cached_property
    def shared_budget(self) -> str | None:
        """The name of the budget this limit shares with other workflows, or None when it
        bounds this workflow alone. `pool:<name>` for a pool, `key:<expression>` for scope
        account/env (seed 003 shares by the key expression; its two scopes are one)."""
        if self.pool is not None:
            return f"pool:{self.pool}"
        if self.scope != "fn" and self.key is not None:
            return f"key:{self.key_expr.canonical}"
        return None


class Priority(Option):
    """Orders the pending queue. `strict`: higher first, ties by arrival. `age`: a number
    of seconds (-600..600, clamped at run time) counted as extra waiting time."""

    option_name = "priority"
    expression_fields = ("expr",)
    expr: str
    mode: Literal["strict", "age"] = "strict"

    @cached_property
    def expression(self) -> Expression:
        return self._required_expr("expr")

    def value(self, data: Any) -> float:
        """The priority of a payload; age mode clamps to -600..600 (seed 003's range)."""
        number = self.expression.number(data)
        return max(-600.0, min(600.0, number)) if self.mode == "age" else number


class Timeouts(Option):
    """`start`: how long a start may wait in the admission queue, from the first arrival in
    its group; `finish`: how long an admitted run may take. Both expire into onFailure."""

    option_name = "timeouts"
    duration_fields = ("start", "finish")
    start: DurationValue | None = None
    finish: DurationValue | None = None

    @cached_property
    def start_ms(self) -> int | None:
        return self.ms("start")

    @cached_property
    def finish_ms(self) -> int | None:
        return self.ms("finish")


class CancelOn(Option):
    """Cancel live runs and discard queued starts when `event` arrives and `match` (over
    `event.<field>` and `payload.<field>`) holds. `match` has no default: write 'true' to
    mean every live run. `reason` defaults to `cancelOn:<event>`."""

    option_name = "cancel_on"
    duration_fields = ("within",)
    expression_fields = ("match",)
    event: str
    # `schema` would shadow BaseModel.schema(); the field is `schema_`, written `schema=`.
    schema_: type[BaseModel] = Field(alias="schema")
    match: str | None
    within: DurationValue | None = None
    reason: str | None = None

    def _compile(self, name: str, source: str | None, model: type[BaseModel]) -> Expression | None:
        if source is None:
            return None
        return compile_expression(source, roots={"event": self.schema_, "payload": model})

    @cached_property
    def match_expr(self) -> Expression:
        return self._required_expr("match")

    @cached_property
    def within_ms(self) -> int | None:
        return self.ms("within")

    @cached_property
    def cancel_reason(self) -> str:
        return self.reason or f"cancelOn:{self.event}"
