"""Records are slots dataclasses built by their own `__init__`, `__post_init__` included,
whether code calls the class or the codec decodes one; `changed` makes the copy
`dataclasses.replace` makes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.schemas import RECORD_TYPES, codec, records
from sluicegate.schemas.native import speedups
from sluicegate.schemas.records import (
    AdmittedStart,
    LedgerRecord,
    PendingStart,
    Slot,
    changed,
    record,
)

# Any object will do as a field's value: construction neither checks nor converts.
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.binary(max_size=8),
                   st.lists(st.integers(), max_size=2))


def fields_of(record: Any) -> list[Any]:
    return [getattr(record, f.name) for f in dataclasses.fields(record)]


@record
class Checked:
    """A record whose `__post_init__` refuses a negative count."""

    name: str
    count: int = 0

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"{self.name}: a count is never negative, got {self.count}")


@record
class Sample:
    """A record with defaults."""

    topic: str
    offset: int
    key: bytes | None = None
    value: bytes | None = None


CHECKED_SCHEMA = {"type": "record", "namespace": codec.NAMESPACE, "name": "Checked",
                  "fields": [{"name": "name", "type": "string"},
                             {"name": "count", "type": "long"}]}
# The Avro body of Checked("n", -1): "n" (length 1, zig-zag 2), then -1 (zig-zag 1).
NEGATIVE_BODY = b"\x02n\x01"


@pytest.mark.parametrize("call", [
    pytest.param(lambda: Checked("n", -1), id="by position"),
    pytest.param(lambda: Checked(name="n", count=-1), id="by keyword"),
    pytest.param(lambda: Checked(count=-1, name="n"), id="keywords in another order"),
])
def test_a_record_runs_its_post_init_when_built(call: Callable[[], Checked]) -> None:
    with pytest.raises(ValueError, match="a count is never negative, got -1"):
        call()
    assert Checked("n").count == 0


def _python_decoder(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes, int], Any]:
    # The generated decoder finds a record's class by its schema's name in `records`.
    monkeypatch.setattr(records, "Checked", Checked, raising=False)
    rs = SimpleNamespace(schema=CHECKED_SCHEMA, full_name=f"{codec.NAMESPACE}.Checked")
    return codec._compile(rs)[1]  # type: ignore[arg-type]


def _native_decoder(monkeypatch: pytest.MonkeyPatch) -> Callable[[bytes, int], Any]:
    if speedups is None:
        pytest.skip("the C extension is not in use")
    spec = ("record", Checked, ("name", "count"), (("string",), ("long",)))
    return speedups.Program(spec, b"").decode


@pytest.mark.parametrize("decoder", [_python_decoder, _native_decoder],
                         ids=["generated python", "c"])
def test_a_decoded_record_runs_its_post_init(decoder: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    decode = decoder(monkeypatch)
    assert decode(b"\x02n\x04", 0) == Checked("n", 2)
    with pytest.raises(ValueError, match="a count is never negative, got -1"):
        decode(NEGATIVE_BODY, 0)


def test_a_missing_field_is_refused_with_the_inits_words() -> None:
    with pytest.raises(TypeError, match=r"missing 1 required positional argument: 'topic'"):
        Sample(offset=5)  # type: ignore[call-arg]


def test_defaults_fill_the_fields_not_given() -> None:
    record = Sample("t", 5)
    assert record.key is None and record.value is None
    assert record == Sample(topic="t", offset=5, key=None, value=None)


def test_records_compare_hash_and_replace_as_dataclasses() -> None:
    a = Sample("t", 5, b"k", b"v")
    b = Sample(topic="t", offset=5, key=b"k", value=b"v")
    assert a == b and hash(a) == hash(b)
    moved = dataclasses.replace(a, offset=6)
    assert moved.offset == 6 and moved.value == b"v" and a.offset == 5


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


# The gated path builds these positionally (Router.admit and decide, IdentityStage):
# a field inserted among them would take another's value without a word.
POSITIONAL_FIELDS = {
    LedgerRecord: ["request_id", "workflow", "outcome", "requested_at_ms", "decided_at_ms",
                   "waited_ms", "folded", "key", "stage", "reason", "execution_id",
                   "retry_after_ms", "deferral", "due_at_ms", "position",
                   "declaration_version", "payload", "control"],
    AdmittedStart: ["execution_id", "workflow", "payload", "declaration_version", "origin",
                    "kind", "slots", "request_ids", "requested_at_ms", "admitted_at_ms",
                    "retry_of", "lease_ms", "heartbeat_every_ms"],
    PendingStart: ["execution_id", "workflow", "payload", "origin", "kind",
                   "declaration_version", "hop", "request_id", "request_ids",
                   "requested_at_ms", "arrived_at_ms", "priority", "slots",
                   "reply_partition", "identity_key", "retry_of", "on_failure"],
}


@pytest.mark.parametrize("cls", list(POSITIONAL_FIELDS), ids=lambda cls: cls.__name__)
def test_records_built_positionally_keep_their_fields_order(cls: type) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert names[:len(POSITIONAL_FIELDS[cls])] == POSITIONAL_FIELDS[cls], (
        "a field added to a record built positionally goes after these")
