"""Resolving a field path against a payload schema, once, when the declarations load.

A path that names a field the schema lacks is an error naming the field (and the nearest
spelling), never a key that silently becomes `null`. The result is the list of lookups the
evaluator performs on the decoded JSON: dict keys (the JSON name, i.e. the alias when one is
set), list indexes, and `length` of a list or text.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

from sluicegate.declare.expr_syntax import ExpressionError, PathRef


class Length:
    """The `length` of a list or a text: the one computed step a path may take."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "length"


LENGTH = Length()
Step = str | int | Length

_ANY = object()  # the schema says nothing below this point: look up whatever is there


@dataclasses.dataclass(frozen=True, slots=True)
class Resolved:
    steps: tuple[Step, ...]  # what to look up at run time, from the root of the data
    display: str  # the path as a person reads it, e.g. "items[0].issueKey"


class _Miss(Exception):
    def __init__(self, message: str) -> None:
        self.message = message


def resolve(
    ref: PathRef,
    source: str,
    model: type[BaseModel] | None,
    roots: Mapping[str, type[BaseModel]] | None,
) -> Resolved:
    segments = list(ref.segments)
    prefix: list[Step] = []
    shown: list[str | int] = []
    current: Any
    if roots is not None:
        root = segments[0]
        if root not in roots:
            names = ", ".join(f"{name}.<field>" for name in roots)
            raise ExpressionError(f"unknown name {root!r}; this expression reads {names}",
                                  source, ref.pos)
        current = roots[str(root)]
        prefix.append(str(root))
        shown.append(str(root))
        segments = segments[1:]
    elif model is None:
        raise ExpressionError("this expression has no schema, so it cannot name fields",
                              source, ref.pos)
    else:
        current = model
        # Seed 003 writes `event.data.<field>` for the payload; accept it unless the payload
        # really has a field called `event`.
        if segments[:2] == ["event", "data"] and _field(model, "event") is None:
            segments = segments[2:]
    for segment in segments:
        try:
            current, step = _step(current, segment)
        except _Miss as miss:
            where = f"{_display(shown)}: " if shown else ""
            raise ExpressionError(f"{where}{miss.message}", source, ref.pos) from None
        prefix.append(step)
        shown.append(segment)
    return Resolved(tuple(prefix), _display(shown))


def _display(segments: Sequence[str | int]) -> str:
    out = ""
    for segment in segments:
        if isinstance(segment, int):
            out += f"[{segment}]"
        elif segment.isidentifier():
            out += f".{segment}" if out else segment
        else:
            out += f"[{segment!r}]"
    return out or "(the payload)"


def _step(tp: Any, segment: str | int) -> tuple[Any, Step]:
    if tp is _ANY:
        return _ANY, segment
    members = _members(tp)
    if not members:
        raise _Miss("the schema says this is always null, so it has no fields")
    found: list[tuple[Any, Step]] = []
    first_miss: _Miss | None = None
    for member in members:
        try:
            found.append(_step_one(member, segment))
        except _Miss as miss:
            first_miss = first_miss or miss
    if not found:
        assert first_miss is not None
        raise first_miss
    if len(found) == 1:
        return found[0]
    # A union of several shapes that all have this field: check no further below it.
    return _ANY, found[0][1]


def _members(tp: Any) -> list[Any]:
    """The non-null alternatives of `tp`, with Annotated unwrapped."""
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(tp):
            out.extend(_members(arg))
        return out
    if tp is None or tp is type(None):
        return []
    return [tp]


def _step_one(tp: Any, segment: str | int) -> tuple[Any, Step]:
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return _ANY, segment
    origin = typing.get_origin(tp) or tp
    args = typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _model_field(tp, segment)
    if dataclasses.is_dataclass(tp) or typing.is_typeddict(tp):
        return _hinted_field(tp, segment)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        if isinstance(segment, int):
            raise _Miss("this is a map; index it by a quoted key, not a number")
        return (args[1] if len(args) == 2 else _ANY), segment
    if origin in (str, bytes):
        if segment == "length":
            return int, LENGTH
        raise _Miss(f"this is text; it has no field {segment!r}")
    if isinstance(origin, type) and issubclass(origin, list | tuple | set | frozenset | Sequence):
        if segment == "length":
            return int, LENGTH
        if not isinstance(segment, int):
            raise _Miss(f"this is a list; pick an item with [0], not .{segment}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if segment >= len(args):
                raise _Miss(f"this tuple has {len(args)} items; [{segment}] is past its end")
            return args[segment], segment
        return (args[0] if args else _ANY), segment
    name = "a literal" if origin is Literal else getattr(tp, "__name__", repr(tp))
    raise _Miss(f"this is {name}; it has no field {segment!r}")


def _field(model: type[BaseModel], name: str) -> tuple[Any, str] | None:
    for field_name, info in model.model_fields.items():
        if name in (field_name, info.alias):
            return info.annotation, info.alias or field_name
    return None


def _model_field(model: type[BaseModel], segment: str | int) -> tuple[Any, Step]:
    if isinstance(segment, int):
        raise _Miss(f"{model.__name__} is an object; name a field instead of [{segment}]")
    hit = _field(model, segment)
    if hit is not None:
        return hit
    if model.model_config.get("extra") == "allow":
        return _ANY, segment
    raise _Miss(_unknown(segment, model.__name__, list(model.model_fields)))


def _hinted_field(tp: Any, segment: str | int) -> tuple[Any, Step]:
    hints = typing.get_type_hints(tp, include_extras=True)
    if isinstance(segment, int) or segment not in hints:
        raise _Miss(_unknown(str(segment), tp.__name__, list(hints)))
    return hints[segment], segment


def _unknown(name: str, owner: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    fields = ", ".join(sorted(known)) or "none"
    return f"unknown field {name!r} in {owner}{hint} (its fields: {fields})"
