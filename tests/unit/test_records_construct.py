"""Calling a record class builds it in C (`_speedups.install_constructor`): the same record
its generated `__init__` builds, for every way of calling it, and the same error when the
call is wrong."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.schemas import RECORD_TYPES, _speedups
from sluicegate.schemas.records import Slot, changed
from sluicegate.streams.stage import InputRecord, Table

RECORDS = sorted([*RECORD_TYPES, InputRecord, Table], key=lambda c: c.__name__)
# Any object will do as a field's value: construction neither checks nor converts.
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.binary(max_size=8),
                   st.lists(st.integers(), max_size=2))


def by_init(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What the class's own `__init__` makes of the call."""
    made = object.__new__(cls)
    cls.__init__(made, *args, **kwargs)  # type: ignore[misc]
    return made


def fields_of(record: Any) -> list[Any]:
    return [getattr(record, f.name) for f in dataclasses.fields(record)]


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "made", fields_of(call())
    except TypeError as exc:
        return "refused", str(exc)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_class_is_built_in_c(cls: type) -> None:
    assert _speedups.has_constructor(cls)


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_record_called_in_any_way_is_what_its_init_makes(cls: type, data: st.DataObject
                                                            ) -> None:
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    names = [f.name for f in fields]
    # Some fields by position, then some by keyword in any order, with now and then a
    # keyword the class does not have, a field given twice, or one argument too many.
    positional = data.draw(st.integers(0, len(names)))
    args = tuple(data.draw(VALUES) for _ in range(positional))
    rest = data.draw(st.permutations(names[positional:]))
    named = rest[:data.draw(st.integers(0, len(rest)))]
    kwargs = {name: data.draw(VALUES) for name in named}
    mistake = data.draw(st.sampled_from(["none", "none", "unknown", "twice", "extra"]))
    if mistake == "unknown":
        kwargs["no_such_field"] = 1
    elif mistake == "twice" and positional:
        kwargs[names[0]] = 2
    elif mistake == "extra":
        args = (*args, *(None for _ in range(len(names) - positional)), None)
    built = outcome(lambda: cls(*args, **kwargs))
    assert built == outcome(lambda: by_init(cls, args, kwargs))
    if built[0] == "made":
        assert type(cls(*args, **kwargs)) is cls


def test_a_missing_field_is_refused_with_the_inits_words() -> None:
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'prefix'"):
        Table(name="runs", topic="sg.runs")  # type: ignore[call-arg]


def test_defaults_fill_the_fields_not_given_and_are_shared_as_init_shares_them() -> None:
    record = InputRecord("t", 0, 5, None, b"v", 1)
    assert record.headers is None and record.message is None
    assert record == InputRecord(topic="t", partition=0, offset=5, key=None, value=b"v",
                                 timestamp_ms=1, headers=None, message=None)


def test_records_built_in_c_compare_hash_and_replace_as_dataclasses() -> None:
    a = InputRecord("t", 0, 5, b"k", b"v", 1)
    b = by_init(InputRecord, ("t", 0, 5, b"k", b"v", 1), {})
    assert a == b and hash(a) == hash(b)
    moved = dataclasses.replace(a, offset=6)
    assert moved.offset == 6 and moved.value == b"v" and a.offset == 5


def test_a_subclass_is_built_by_its_own_init() -> None:
    @dataclasses.dataclass(slots=True)
    class Marked(Table):
        mark: str = "m"

    marked = Marked("runs", b"R", "sg.runs")
    assert (marked.name, marked.mark) == ("runs", "m")
    assert not _speedups.has_constructor(Marked)


@pytest.mark.parametrize("cls", sorted(RECORD_TYPES, key=lambda c: c.__name__),
                         ids=lambda c: c.__name__)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_changed_makes_the_copy_replace_makes(cls: type, data: st.DataObject) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    original = cls(*[data.draw(VALUES) for _ in names])
    picked = data.draw(st.lists(st.sampled_from(names), unique=True))
    changes = {name: data.draw(VALUES) for name in picked}
    copy = changed(original, **changes)
    assert type(copy) is cls
    assert fields_of(copy) == fields_of(dataclasses.replace(original, **changes))
    assert fields_of(original) == fields_of(cls(*[getattr(original, n) for n in names]))


def test_changed_refuses_a_field_the_record_does_not_have() -> None:
    slot = Slot("concurrency", "k")
    with pytest.raises(TypeError, match="Slot has no field 'nope'"):
        changed(slot, nope=1)
