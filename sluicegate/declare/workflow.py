"""A workflow's declaration: its payload schema and the flow control it declares.

Construction never raises: every problem (a pydantic type error, a duration that does not
parse, an expression naming a missing field, a range or combination rule) is recorded in
`problems`, each prefixed with `workflow <name>:`, and App raises them all together.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, ClassVar

from pydantic import BaseModel, PrivateAttr, field_validator

from sluicegate.declare import validation
from sluicegate.declare.base import Declared
from sluicegate.declare.controls import Control
from sluicegate.declare.options import (
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Idempotency,
    Option,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
)

# The controls in the order a start meets them (SPEC.md section 3).
CONTROL_ORDER = tuple(control.option for control in Control)
# Options read on the start as it arrives (for a batch workflow: the item); the others judge
# the run's payload.
_START_SIDE = frozenset(c.option for c in (Control.idempotency, Control.rate_limit,
                                            Control.debounce))


class Workflow(Declared):
    """`Workflow(name=..., payload=Model, debounce=Debounce(...), ...)`; see SPEC.md section 1.

    Shorthands: `idempotency="expr"` for Idempotency(key=...), `priority="expr"` for
    Priority(expr=...) (strict), `concurrency=5` or one Concurrency for a list of one, one
    Throttle for a list of one (several throttles: a start goes when all have room)."""

    name: str
    payload: type[BaseModel]
    idempotency: Idempotency | None = None
    rate_limit: RateLimit | None = None
    debounce: Debounce | None = None
    batch: Batch | None = None
    singleton: Singleton | None = None
    throttle: tuple[Throttle, ...] = ()
    concurrency: tuple[Concurrency, ...] = ()
    priority: Priority | None = None
    timeouts: Timeouts | None = None
    cancel_on: tuple[CancelOn, ...] = ()
    on_failure: str | None = None
    encrypt_payloads: bool = False

    option_fields: ClassVar[tuple[str, ...]] = (
        *CONTROL_ORDER, "timeouts", "cancel_on",
    )

    _version: str = PrivateAttr(default="")

    def __init__(self, /, **data: Any) -> None:
        super().__init__(**data)
        if not self.valid:
            # The fields did not validate, but the options still know their own problems.
            for field, kind in _OPTION_TYPES.items():
                for option in _options_in(data.get(field), kind):
                    self._problems.extend(option.problems)
        name = data.get("name")
        label = name if isinstance(name, str) and name else repr(name)
        self._problems[:] = [f"workflow {label}: {problem}" for problem in self._problems]

    @field_validator("idempotency", mode="before")
    @classmethod
    def _idempotency_shorthand(cls, value: Any) -> Any:
        return Idempotency(key=value) if isinstance(value, str) else value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_shorthand(cls, value: Any) -> Any:
        return Priority(expr=value) if isinstance(value, str) else value

    @field_validator("concurrency", mode="before")
    @classmethod
    def _concurrency_shorthand(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (Concurrency(limit=value),)
        return _as_tuple(value)

    @field_validator("throttle", mode="before")
    @classmethod
    def _throttle_list(cls, value: Any) -> Any:
        return _as_tuple(value)

    @field_validator("cancel_on", mode="before")
    @classmethod
    def _cancel_on_list(cls, value: Any) -> Any:
        return _as_tuple(value)

    def model_post_init(self, context: Any, /) -> None:
        # Bind each option to the schema its expressions read. The fields are frozen for
        # users; this is construction, replacing each option with its compiled copy.
        for field in self.option_fields:
            value = getattr(self, field)
            if isinstance(value, tuple):
                bound: Any = tuple(option.bind(self.payload) for option in value)
                problems = [p for option in bound for p in option.problems]
            elif isinstance(value, Option):
                bound = value.bind(self.start_model if field in _START_SIDE else self.payload)
                problems = list(bound.problems)
            else:
                continue
            object.__setattr__(self, field, bound)
            self._problems.extend(problems)
        self._problems.extend(validation.check_workflow(self))
        self._version = _version_of(self)

    @cached_property
    def start_model(self) -> type[BaseModel]:
        """What a start request's payload is validated against: the batch item for a batch
        workflow, the event for a debounce that hands over every event (callers send one
        item or event), else the workflow's payload."""
        if self.batch is not None:
            return self.batch.item
        if self.debounce is not None and self.debounce.events is not None:
            return self.debounce.events
        return self.payload

    @cached_property
    def declared_controls(self) -> tuple[str, ...]:
        """The controls this workflow declares, in evaluation order; () is the passthrough."""
        return tuple(name for name in CONTROL_ORDER if getattr(self, name))

    @cached_property
    def defers(self) -> bool:
        """Whether a start can wait in the admission queue (so blocking callers are refused)."""
        return any((self.debounce, self.batch, self.throttle, self.concurrency)) or (
            self.singleton is not None and self.singleton.mode == "queue")

    @cached_property
    def version(self) -> str:
        """A stable hex hash of the declaration, payload JSON schema included. Equal for the
        same declaration in any process; durations count by value, expressions by their
        normal form, and the order of concurrency limits or cancelOn entries does not count."""
        if not self._version:
            raise RuntimeError(f"workflow {self.name!r} has problems: {self._problems}")
        return self._version

    def check(self) -> None:
        """Raise DeclarationError if this workflow has problems (App does this for all)."""
        if self._problems:
            from sluicegate.declare.errors import DeclarationError

            raise DeclarationError(self._problems)


def _as_tuple(value: Any) -> Any:
    if value is None:
        return ()
    if isinstance(value, list | tuple):
        return tuple(value)
    return (value,)


_OPTION_TYPES: dict[str, type[Option]] = {
    "idempotency": Idempotency, "rate_limit": RateLimit, "debounce": Debounce, "batch": Batch,
    "singleton": Singleton, "throttle": Throttle, "concurrency": Concurrency,
    "priority": Priority, "timeouts": Timeouts, "cancel_on": CancelOn,
}


def _options_in(value: Any, kind: type[Option]) -> list[Declared]:
    items = value if isinstance(value, list | tuple) else [value]
    out: list[Declared] = []
    for item in items:
        if isinstance(item, Declared):
            out.append(item)
        elif isinstance(item, dict):
            out.append(kind(**item))  # as pydantic would have built it, to hear its problems
    return out


# --- version -------------------------------------------------------------------------------


def _version_of(wf: Workflow) -> str:
    canonical = {
        "name": wf.name,
        "payload": _schema_of(wf.payload),
        "on_failure": wf.on_failure,
        "encrypt_payloads": wf.encrypt_payloads,
        "options": {
            field: _canonical_option(_one_or_many(getattr(wf, field)))
            for field in Workflow.option_fields
            if getattr(wf, field)
        },
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _one_or_many(value: Any) -> Any:
    # One throttle hashes as it did when a workflow could declare only one, so a
    # declaration that did not change keeps its version.
    return value[0] if isinstance(value, tuple) and len(value) == 1 and isinstance(
        value[0], Throttle) else value


# Option fields added after versions were first hashed count only when set, so a
# declaration that does not use them keeps the version it had.
_HASHED_WHEN_SET = frozenset({"per_key", "floor"})


def _canonical_option(value: Any) -> Any:
    if isinstance(value, tuple):
        entries = [_canonical_option(option) for option in value]
        return sorted(entries, key=lambda entry: json.dumps(entry, sort_keys=True, default=str))
    out: dict[str, Any] = {}
    for field in type(value).model_fields:
        raw = getattr(value, field)
        if raw is None and field in _HASHED_WHEN_SET:
            continue
        if field in value.duration_fields:
            out[field] = value.ms(field)
        elif field in value.expression_fields:
            expr = value._exprs.get(field) if value._exprs else None
            out[field] = expr.canonical if expr is not None else raw
        elif isinstance(raw, type) and issubclass(raw, BaseModel):
            out[field] = _schema_of(raw)
        else:
            out[field] = raw
    return out


def _schema_of(model: type[BaseModel]) -> Any:
    try:
        return model.model_json_schema()
    except Exception:  # a schema pydantic cannot express still needs a stable name
        return f"{model.__module__}.{model.__qualname__}"
