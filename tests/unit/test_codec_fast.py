"""The codec's fast paths (the C extension, and the generated Python it mirrors) write and
read exactly fastavro's bytes, and leave every case they do not take (odd values, bad
bytes) to fastavro, with the same outcome. The C cases skip when the extension is turned
off (SLUICEGATE_NO_SPEEDUPS=1), as CI runs the suite once."""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
from enum import Enum
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    Idempotency,
    RateLimit,
    Singleton,
    Throttle,
    Workflow,
)
from sluicegate.schemas import RECORD_TYPES, Codec, DecodeError, EncodeError, native
from sluicegate.schemas import codec as codec_module
from sluicegate.schemas.codec import NAMED_TYPES, RecordSchema
from sluicegate.schemas.murmur2 import python_partition_for
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, StartRequest
from sluicegate.testing import TestDriver
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.keys import python_placed_uuid_text as _placed_uuid_text
from sluicegate.topology.keys import python_uuid5_text as _uuid5_text

NATIVE = Codec()  # the C fast paths (the generated Python when they are off)
PYTHON = Codec(native=False)  # the generated Python fast paths
REFERENCE = Codec(fast=False)  # fastavro only
needs_c = pytest.mark.skipif(native.speedups is None, reason="the C extension is off")
FAST_CODECS = [pytest.param(NATIVE, id="native", marks=needs_c),
               pytest.param(PYTHON, id="python")]
RECORD_CLASSES = sorted(RECORD_TYPES, key=lambda c: c.__name__)
LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(max_size=40)  # includes non-ASCII; no lone surrogates (not encodable)


def _strategy(t: Any, names: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of an Avro type, as the Python records carry them."""
    if isinstance(t, str) and t in names:
        t = names[t]
    if isinstance(t, dict) and t.get("type") in ("record", "enum"):
        names[f"{t['namespace']}.{t['name']}"] = t
    if isinstance(t, dict) and isinstance(t.get("type"), str) and "logicalType" in t:
        t = t["type"]
    if t == "long":
        return LONGS
    if t == "string":
        return TEXT
    if t == "bytes":
        return st.binary(max_size=40)
    if t == "boolean":
        return st.booleans()
    if t == "double":
        return st.floats(allow_nan=False)
    if isinstance(t, list):
        assert t[0] == "null" and len(t) == 2
        return st.none() | _strategy(t[1], names)
    if t["type"] == "enum":
        enum_cls = NAMED_TYPES[f"{t['namespace']}.{t['name']}"]
        assert issubclass(enum_cls, Enum)
        return st.sampled_from(list(enum_cls))
    if t["type"] == "array":
        return st.lists(_strategy(t["items"], names), max_size=4)
    if t["type"] == "map":
        return st.dictionaries(TEXT, _strategy(t["values"], names), max_size=4)
    assert t["type"] == "record", t
    cls = NAMED_TYPES[f"{t['namespace']}.{t['name']}"]
    fields = [_strategy(f["type"], names) for f in t["fields"]]
    return st.tuples(*fields).map(lambda values: cls(*values))


def records_of(cls: type) -> st.SearchStrategy[Any]:
    return _strategy(RECORD_TYPES[cls].schema, {})


any_record = st.sampled_from(RECORD_CLASSES).flatmap(records_of)


def fastavro_body(rs: RecordSchema, record: Any) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, rs.parsed, rs.to_avro(record))
    return buf.getvalue()


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    """What a call does: its result, or its error's type and message. The result as its
    repr, so that a damaged float read as NaN compares equal to itself."""
    try:
        return "ok", repr(fn(*args))
    except (DecodeError, EncodeError, TypeError) as exc:
        return type(exc).__name__, str(exc)


def test_every_record_type_has_a_fast_path() -> None:
    # A schema that grows a type the generator does not handle quietly loses its fast
    # path (fastavro still serves it); the hot records must never lose theirs.
    assert set(codec_module._FAST) == set(RECORD_TYPES)
    for cls in (StartRequest, AdmittedStart, LedgerRecord):
        assert cls in codec_module._FAST


@pytest.mark.skipif(native.TURN_OFF in os.environ, reason="the C extension is turned off")
def test_the_c_fast_paths_are_built_for_every_record_type() -> None:
    # A build that lost them would still work (on the Python paths) but several times
    # slower, so it fails here unless the suite was asked to run without them.
    assert codec_module.NATIVE, native.missing_because
    assert set(codec_module._NATIVE_SPECS) == set(RECORD_TYPES)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_record)
def test_fast_bytes_are_fastavros_bytes(record: Any) -> None:
    rs = RECORD_TYPES[type(record)]
    encode_fast, decode_fast = codec_module._FAST[type(record)]
    body = fastavro_body(rs, record)
    assert encode_fast(record) == body
    data = REFERENCE.encode(record)
    for fast in (NATIVE, PYTHON):
        assert fast.encode(record) == data
        # and the fast reader reads fastavro's bytes back to the same record
        assert fast.decode(type(record), data) == record
    assert decode_fast(data, len(data) - len(body)) == record
    assert REFERENCE.decode(type(record), data) == record


@pytest.mark.parametrize("fast", FAST_CODECS)
@settings(max_examples=600, deadline=None)
@given(record=any_record, data=st.data())
def test_damaged_bytes_decode_or_fail_exactly_as_with_fastavro(fast: Codec, record: Any,
                                                               data: st.DataObject) -> None:
    good = REFERENCE.encode(record)
    header = len(good) - len(fastavro_body(RECORD_TYPES[type(record)], record))
    damage = data.draw(st.sampled_from(["truncate", "append", "flip", "splice"]))
    if damage == "truncate":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    elif damage == "append":
        bad = good + data.draw(st.binary(min_size=1, max_size=8))
    elif damage == "flip":
        i = data.draw(st.integers(header, len(good) - 1)) if len(good) > header else 0
        bad = good[:i] + bytes([data.draw(st.integers(0, 255))]) + good[i + 1:]
    else:
        bad = good[:header] + data.draw(st.binary(max_size=60))
    cls = type(record)
    assert outcome(fast.decode, cls, bad) == outcome(REFERENCE.decode, cls, bad)


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), TEXT, st.binary(max_size=8),
    st.just(2**63), st.just(-(2**63) - 1), st.just("\ud800"), st.lists(TEXT, max_size=2),
    st.tuples(TEXT), st.just(bytearray(b"ab")), st.dictionaries(TEXT, TEXT, max_size=2),
)


@pytest.mark.parametrize("fast", FAST_CODECS)
@settings(max_examples=600, deadline=None)
@given(record=any_record, data=st.data())
def test_odd_values_encode_or_fail_exactly_as_with_fastavro(fast: Codec, record: Any,
                                                            data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(dataclasses.fields(record)))
    odd = dataclasses.replace(record, **{field.name: data.draw(ODD_VALUES)})
    assert outcome(fast.encode, odd) == outcome(REFERENCE.encode, odd)


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_long_varints_match_fastavro(n: int) -> None:
    if -(2**63) <= n < 2**63:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, "long", n)
        assert codec_module._long(n) == buf.getvalue()
        assert codec_module._read_long(buf.getvalue() + b"\x00", 0) == (n, len(buf.getvalue()))
    else:
        with pytest.raises(codec_module._NotFast):
            codec_module._long(n)


@given(TEXT, st.text(max_size=64), st.integers(1, 48).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(0, n - 1))))
def test_execution_ids_are_the_uuid5_placed_on_their_partition(
        workflow: str, request_id: str, placement: tuple[int, int]) -> None:
    partitions, partition = placement
    namespace = uuid.UUID("6f1c2d8e-5b7a-4c1e-9a53-2f0e8d4b7c61")
    plain = str(uuid.uuid5(namespace, f"{workflow}\x1f{request_id}"))
    placed = execution_id_for(workflow, request_id, partition, partitions)
    assert python_partition_for(placed.encode(), partitions) == partition
    # The same version-5 UUID but for its last 16 bits, which count up from the plain
    # one's to the first value on the partition.
    assert uuid.UUID(placed).version == 5 and uuid.UUID(placed).variant == uuid.RFC_4122
    assert placed[:32] == plain[:32]
    start, chosen = int(plain[32:], 16), int(placed[32:], 16)
    for n in range((chosen - start) % 0x10000):
        skipped = f"{plain[:32]}{(start + n) % 0x10000:04x}"
        assert python_partition_for(skipped.encode(), partitions) != partition
    assert _placed_uuid_text(plain, partitions, partition) == placed
    if partitions == 1:
        assert placed == plain


def test_an_id_no_16_bit_value_places_stays_the_plain_uuid5() -> None:
    plain = str(uuid.uuid5(uuid.NAMESPACE_OID, "x"))
    # Among a billion partitions, one no 16-bit suffix reaches (the search ends, not hangs).
    reached = {python_partition_for(f"{plain[:32]}{v:04x}".encode(), 10**9)
               for v in range(0x10000)}
    unreached = next(p for p in range(10**9) if p not in reached)
    if native.speedups is not None:
        assert native.speedups.placed_uuid_text(plain, 10**9, unreached) is None
    assert _placed_uuid_text(plain, 10**9, unreached) is None


def c_and_python(name: str, python: Any) -> list[Any]:
    c = getattr(native.speedups, name, None)
    return [pytest.param(c, id="c", marks=needs_c), pytest.param(python, id="python")]


@pytest.mark.parametrize("placed", c_and_python("placed_uuid_text", _placed_uuid_text))
def test_a_partition_outside_the_topic_is_refused(placed: Any) -> None:
    plain = str(uuid.uuid5(uuid.NAMESPACE_OID, "x"))
    with pytest.raises(ValueError, match="partition 6 of 6 partitions"):
        placed(plain, 6, 6)


@pytest.mark.parametrize("uuid5_text", c_and_python("uuid5_text", _uuid5_text))
@given(digest=st.binary(min_size=20, max_size=20))
def test_uuid_text_in_c_and_python_is_the_uuid_modules(uuid5_text: Any, digest: bytes) -> None:
    assert uuid5_text(digest) == str(uuid.UUID(bytes=digest[:16], version=5))


@needs_c
def test_uuid_text_in_c_refuses_a_short_digest() -> None:
    assert native.speedups is not None
    with pytest.raises(ValueError, match="20 bytes, got 15"):
        native.speedups.uuid5_text(b"x" * 15)


class _Item(BaseModel):
    id: str
    grp: str


class _Items(BaseModel):
    items: list[_Item]


def test_the_ledger_rows_of_every_control_are_encoded_by_the_fast_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ledger row names its control. The fast paths take an exact str only, so a control
    named by its enum member sent every row of rateLimit, throttle, debounce, batch and
    singleton to fastavro, at ~15 µs a row; none may go there."""
    by_fastavro: list[str] = []
    writer = codec_module.schemaless_writer

    def counted(buf: Any, schema: Any, datum: Any) -> None:
        by_fastavro.append(str(schema.get("name")))
        writer(buf, schema, datum)

    monkeypatch.setattr(codec_module, "schemaless_writer", counted)
    workflows = [
        Workflow(name="rl", payload=_Item, rate_limit=RateLimit(limit=1, period="1h", key="grp")),
        Workflow(name="th", payload=_Item, throttle=Throttle(limit=1, period="1h", key="grp")),
        Workflow(name="db", payload=_Item, debounce=Debounce(key="grp", period="1s")),
        Workflow(name="bt", payload=_Items, batch=Batch(item=_Item, max_size=2, timeout="1h")),
        Workflow(name="sg", payload=_Item, singleton=Singleton(key="grp", mode="skip")),
        Workflow(name="id", payload=_Item, idempotency=Idempotency(key="id")),
        Workflow(name="cc", payload=_Item, concurrency=[Concurrency(limit=1, key="grp")]),
    ]
    with TestDriver(App(workflows)) as driver:
        for wf in workflows:
            item = {"id": "same", "grp": "k"}
            for _ in range(2):
                # Twice on one key: admitted (or parked), then dropped, queued or collapsed.
                driver.start(wf.name, item)
        driver.advance(2_000)
        outcomes = {(row.workflow, row.outcome.value) for row in driver.ledger}
    assert {"rl", "th", "db", "bt", "sg", "id", "cc"} <= {wf for wf, _ in outcomes}
    assert ("rl", "dropped") in outcomes and ("th", "queued") in outcomes
    assert by_fastavro == []
