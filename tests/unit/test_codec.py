"""The wire contract: every record survives the trip, every frame says what it is,
and bad bytes only ever raise DecodeError."""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import typing
from enum import Enum
from importlib.resources import files
from types import NoneType, UnionType
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.schemas import (
    NAMED_TYPES,
    RECORD_TYPES,
    Codec,
    DecodeError,
    EncodeError,
    LedgerRecord,
    Origin,
    Outcome,
    RecordSchema,
    Reply,
    RunRow,
    RunStatus,
    Slot,
    StartRequest,
    decode_key,
    dump_payload,
    encode_key,
    fingerprint,
    load_payload,
)
from sluicegate.schemas.codec import (
    RELEASED,
    SINGLE_OBJECT_MARKER,
    ReleasedSchema,
    SingleObjectFraming,
    parse_writer_schema,
    schema_fingerprint,
)

# These tests are about single-object framing, whatever codec the process uses.
_SINGLE_OBJECT = Codec()
encode, decode = _SINGLE_OBJECT.encode, _SINGLE_OBJECT.decode

AVRO_LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
RECORD_CLASSES = sorted(RECORD_TYPES, key=lambda c: c.__name__)

# Every schema each record type has had, oldest first; the last is the current one.
# Changing an .avsc changes the bytes on the wire: append its new fingerprint (keeping the
# earlier ones) together with docs/wire-format.md, and make sure the version it replaces
# is in sluicegate/schemas/avro/history/ (a release's folder has it once that release is
# out): readers of the new version must still read what the old one wrote.
PINNED_FINGERPRINTS = {
    "AdmittedStart": ("0c1c2e8302038724", "10e5af302b304c1c"),
    "CancelSweep": ("a84268df03602e6b",),
    "ControlRow": ("169fc12db8a32c7d",),
    "DeadLetter": ("41bf56937f62f2fd",),
    "EngineCommand": ("0d0500815e3a9f47",),
    "FailureReportRecord": ("bd0c4f1464eeddb1",),
    "IdentityAlias": ("5477608d3edd6039",),
    "KeyLimit": ("6eae03c5ca2e1e6e",),
    "LedgerRecord": ("15b3363074c5d885", "ad4be50f143d2e3f", "ca48cc5318db898f"),
    "OverrideRow": ("dc4847637aa723f9",),
    "PendingStart": ("b777d6c986184f76",),
    "Release": ("465edb096de24533",),
    "Reply": ("fdda1162b93a2102", "398e955231c7dd2a", "70226475d504994d"),
    "RunEvent": ("9462448059425459",),
    "RunOperation": ("238a6cfbdf372512",),
    "RunRow": ("06447376cd9c7853",),
    "Slot": ("16224862afffa95e",),
    "StartRequest": ("bd2bd67921797a9d", "5ceb6ca412bcb42a"),
}


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is UnionType or origin is typing.Union:
        (inner,) = [a for a in args if a is not NoneType]
        return st.none() | strategy_for(inner)
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=4)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return st.sampled_from(tp)
    if dataclasses.is_dataclass(tp):
        return records_of(tp)
    return {
        str: st.text(),
        bytes: st.binary(),
        bool: st.booleans(),
        int: AVRO_LONG,
        float: st.floats(allow_nan=False),
    }[tp]


def records_of(cls: Any) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)})


def a_start_request(**changes: Any) -> StartRequest:
    fields: dict[str, Any] = {
        "request_id": "req-1",
        "workflow": "sync-tenant",
        "payload": b'{"tenantId":"t-42"}',
        "origin": Origin.event,
        "requested_at_ms": 1_767_225_600_000,
    }
    return StartRequest(**(fields | changes))


# -- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_record_type_decodes_to_the_record_it_was_encoded_from(cls: Any, data: Any) -> None:
    record = data.draw(records_of(cls))
    assert decode(cls, encode(record)) == record


def test_decoded_enums_are_enum_members_and_nested_slots_are_slots() -> None:
    row = RunRow(
        execution_id="e-1",
        workflow="wf",
        status=RunStatus.suspended,
        payload=b"{}",
        declaration_version="v1",
        admitted_at_ms=1,
        updated_at_ms=2,
        slots=[Slot("concurrency", "wf:t-42")],
        keys={"concurrency": "t-42"},
    )
    decoded = decode(RunRow, encode(row))
    assert decoded.status is RunStatus.suspended
    assert decoded.slots == [Slot("concurrency", "wf:t-42")]
    assert type(decoded.slots[0]) is Slot


def test_unicode_and_extreme_longs_survive_the_trip() -> None:
    record = LedgerRecord(
        request_id="请求-🚀",
        workflow="wörkflow",
        outcome=Outcome.lease_expired,
        requested_at_ms=-(2**63),
        decided_at_ms=2**63 - 1,
        key="",
        reason="\u0000 and \U0010ffff",
    )
    assert decode(LedgerRecord, encode(record)) == record


def test_defaults_need_not_be_given() -> None:
    request = a_start_request()
    decoded = decode(StartRequest, encode(request))
    assert decoded.wait is False
    assert decoded.idempotency_id is None
    assert decoded.at_ms is None


# -- framing and fingerprints --------------------------------------------------------


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@given(data=st.data())
@settings(max_examples=10)
def test_every_frame_is_marker_then_its_types_fingerprint(cls: Any, data: Any) -> None:
    frame = encode(data.draw(records_of(cls)))
    assert frame[:2] == b"\xc3\x01"
    assert frame[2:10] == fingerprint(cls)


def test_fingerprints_are_pinned_so_a_wire_change_is_deliberate() -> None:
    actual = {cls.__name__: rs.fingerprint.hex() for cls, rs in RECORD_TYPES.items()}
    assert actual == {name: pinned[-1] for name, pinned in PINNED_FINGERPRINTS.items()}


def test_every_earlier_schema_of_a_record_type_is_kept_in_the_history() -> None:
    # Fails when an .avsc changed and the version it replaces was not kept: records that
    # version wrote (in stores, changelogs, on stage topics) would no longer be read.
    lost = [
        f"{name} {earlier}" for name, pinned in PINNED_FINGERPRINTS.items()
        for earlier in pinned[:-1]
        if getattr(RELEASED.get(bytes.fromhex(earlier)), "cls", None) is not NAMED_TYPES[
            f"io.sluicegate.{name}"]
    ]
    assert not lost, (f"no schema in sluicegate/schemas/avro/history/ has these pinned"
                      f" fingerprints: {lost}; keep the released .avsc files there")


def test_every_schema_in_the_history_is_pinned() -> None:
    # A history file edited by hand would be a version no release ever wrote.
    unpinned = [
        f"{released.full_name} {released.fingerprint.hex()} (history/{released.release})"
        for released in RELEASED.values()
        if released.fingerprint.hex() not in PINNED_FINGERPRINTS[released.cls.__name__][:-1]
    ]
    assert not unpinned


def test_fingerprint_is_the_crc64_avro_of_the_canonical_form() -> None:
    for rs in RECORD_TYPES.values():
        assert rs.fingerprint == schema_fingerprint(rs.canonical_form)
        assert fastavro.schema.to_parsing_canonical_form(rs.schema) == rs.canonical_form


@pytest.mark.parametrize(
    ("canonical", "expected"),
    [  # from Apache Avro's share/test/data/schema-tests.txt, as signed longs
        ('"null"', 7195948357588979594),
        ('"boolean"', -6970731678124411036),
        ('"int"', 8247732601305521295),
        ('"string"', -8142146995180207161),
        ('["int","boolean"]', 5392556393470105090),
    ],
)
def test_schema_fingerprint_matches_avro_reference_vectors(canonical: str, expected: int) -> None:
    assert schema_fingerprint(canonical) == struct.pack("<q", expected)


def test_every_type_has_its_own_fingerprint() -> None:
    fingerprints = [rs.fingerprint for rs in RECORD_TYPES.values()]
    assert len(set(fingerprints)) == len(fingerprints)


def test_a_frame_of_another_type_is_refused_naming_both_types() -> None:
    frame = encode(Reply(request_id="req-1", outcome=Outcome.admitted, decided_at_ms=1))
    with pytest.raises(DecodeError) as err:
        decode(StartRequest, frame)
    assert "io.sluicegate.StartRequest" in str(err.value)
    assert "io.sluicegate.Reply" in str(err.value)


def test_an_unknown_fingerprint_is_refused_as_written_by_a_newer_version() -> None:
    frame = SINGLE_OBJECT_MARKER + bytes.fromhex("0123456789abcdef") + encode(
        a_start_request())[10:]
    newer = (r"written by a newer version \(or an unknown writer\): expected"
             r" {}, unknown schema fingerprint 0123456789abcdef")
    with pytest.raises(DecodeError, match=newer.format(r"io\.sluicegate\.StartRequest")):
        decode(StartRequest, frame)
    with pytest.raises(DecodeError, match=newer.format(
            r"io\.sluicegate\.StartRequest or io\.sluicegate\.Reply")):
        _SINGLE_OBJECT.decode_one_of((StartRequest, Reply), frame)


def test_a_wrong_marker_is_refused_showing_the_bytes_found() -> None:
    frame = b"\x01\x02" + encode(a_start_request())[2:]
    with pytest.raises(DecodeError, match="marker c3 01, found 01 02"):
        decode(StartRequest, frame)


def test_a_schema_registry_frame_is_refused_saying_no_registry_is_configured() -> None:
    frame = b"\x00\x00\x00\x00\x07" + encode(a_start_request())[10:]
    with pytest.raises(DecodeError, match=r"Schema Registry framing \(schema id 7\).*no schema"
                                          " registry configured"):
        decode(StartRequest, frame)


def test_every_truncation_of_a_frame_is_refused() -> None:
    frame = encode(a_start_request(idempotency_id="id-1", at_ms=5, reply_partition=2, wait=True))
    for cut in range(len(frame)):
        with pytest.raises(DecodeError):
            decode(StartRequest, frame[:cut])


def test_bytes_after_the_record_are_refused() -> None:
    with pytest.raises(DecodeError, match="more after it"):
        decode(StartRequest, encode(a_start_request()) + b"\x00")


def test_a_tombstone_is_a_decode_error_not_a_type_error() -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        decode(RunRow, None)


def test_a_bytearray_or_memoryview_decodes_like_bytes() -> None:
    frame = encode(a_start_request())
    assert decode(StartRequest, bytearray(frame)) == a_start_request()  # type: ignore[arg-type]
    assert decode(StartRequest, memoryview(frame)) == a_start_request()  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@given(garbage=st.binary(max_size=64))
def test_random_bytes_only_ever_raise_decode_error(cls: Any, garbage: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(cls, garbage)


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@given(body=st.binary(max_size=96))
@settings(max_examples=300)
def test_random_bodies_behind_a_valid_header_decode_or_raise_decode_error(
    cls: Any, body: bytes
) -> None:
    try:
        record = decode(cls, SINGLE_OBJECT_MARKER + fingerprint(cls) + body)
    except DecodeError:
        return
    assert type(record) is cls


def test_encoding_a_value_that_does_not_fit_raises_encode_error() -> None:
    with pytest.raises(EncodeError, match=r"io\.sluicegate\.StartRequest"):
        encode(a_start_request(workflow="\ud800"))  # a lone surrogate is not UTF-8


def test_encoding_something_that_is_not_a_record_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a sluicegate record"):
        encode({"request_id": "req-1"})  # type: ignore[arg-type]


# -- released schemas: what earlier releases wrote -------------------------------------


def older_start_request() -> dict[str, Any]:
    """StartRequest's schema as an earlier release might have had it: no `wait` field."""
    current = RECORD_TYPES[StartRequest].schema
    return {**current, "fields": [f for f in current["fields"] if f["name"] != "wait"]}


def released(schema: dict[str, Any], cls: Any) -> ReleasedSchema:
    canonical = fastavro.schema.to_parsing_canonical_form(schema)
    return ReleasedSchema(cls, RECORD_TYPES[cls].full_name, "0.0.1",
                          schema_fingerprint(canonical), parse_writer_schema(schema))


def records_written_by(release: ReleasedSchema) -> st.SearchStrategy[Any]:
    """Records a process of that release could write: an enum field takes only the symbols
    its schema had (a symbol added since is Avro-compatible, and only newer writers use it)."""
    hints = typing.get_type_hints(release.cls)
    symbols = {f["name"]: set(f["type"]["symbols"]) for f in release.parsed["fields"]
               if isinstance(f["type"], dict) and f["type"].get("type") == "enum"}
    return st.builds(release.cls, **{
        f.name: (st.sampled_from([m for m in hints[f.name] if m.value in symbols[f.name]])
                 if f.name in symbols else strategy_for(hints[f.name]))
        for f in dataclasses.fields(release.cls)})


def written_by(release: ReleasedSchema, record: Any) -> bytes:
    """The single-object frame a process of that release writes for `record` (the fields
    its schema has)."""
    body = io.BytesIO()
    fastavro.schemaless_writer(body, release.parsed, RECORD_TYPES[type(record)].to_avro(record))
    return SINGLE_OBJECT_MARKER + release.fingerprint + body.getvalue()


def knowing(*releases: ReleasedSchema) -> Codec:
    return Codec(SingleObjectFraming(RECORD_TYPES.values(), releases))


def test_a_record_an_earlier_release_wrote_reads_with_the_fields_it_lacked_defaulted() -> None:
    older = released(older_start_request(), StartRequest)
    codec = knowing(older)
    frame = written_by(older, a_start_request(wait=True))
    assert codec.decode(StartRequest, frame) == a_start_request(wait=False)
    assert codec.decode_one_of((Reply, StartRequest), frame) == a_start_request(wait=False)
    assert codec.framing.record_type(frame) is StartRequest
    with pytest.raises(DecodeError, match="written by a newer version"):
        decode(StartRequest, frame)  # a reader without that release in its history


def test_a_released_schema_of_another_type_is_refused_naming_both_types() -> None:
    older = released(older_start_request(), StartRequest)
    with pytest.raises(DecodeError, match=r"expected io\.sluicegate\.Reply .*found"
                                          r" io\.sluicegate\.StartRequest"):
        knowing(older).decode(Reply, written_by(older, a_start_request()))


class CountingFraming(SingleObjectFraming):
    def __init__(self, *releases: ReleasedSchema) -> None:
        super().__init__(RECORD_TYPES.values(), releases)
        self.asked = 0

    def writer_schema(self, expected: RecordSchema, data: bytes) -> tuple[Any, int]:
        self.asked += 1
        return super().writer_schema(expected, data)


def test_only_a_record_of_an_earlier_schema_leaves_the_fast_path() -> None:
    older = released(older_start_request(), StartRequest)
    framing = CountingFraming(older)
    codec = Codec(framing)
    assert codec.decode(StartRequest, codec.encode(a_start_request())) == a_start_request()
    assert framing.asked == 0
    codec.decode(StartRequest, written_by(older, a_start_request()))
    assert framing.asked == 1


@given(data=st.data())
@settings(max_examples=20)
def test_every_released_schema_reads_into_its_current_class(data: Any) -> None:
    # RELEASED is what this package's history holds; the made-up one keeps the test
    # meaningful while no schema has changed since the first release.
    for release in [*RELEASED.values(), released(older_start_request(), StartRequest)]:
        record = data.draw(records_written_by(release))
        written = {f["name"] for f in release.parsed["fields"]}
        lacked = {f.name: f.default for f in dataclasses.fields(release.cls)
                  if f.name not in written}
        assert knowing(release).decode(release.cls, written_by(release, record)) == (
            dataclasses.replace(record, **lacked)), release.release


# -- the framing hook ----------------------------------------------------------------


class ToyRegistryFraming:
    """Confluent-style framing (magic 0 + 4-byte id) over an in-memory registry, with an
    older StartRequest (no `wait` field) registered under id 1."""

    def __init__(self) -> None:
        current = RECORD_TYPES[StartRequest]
        self.by_id: dict[int, Any] = {1: parse_writer_schema(older_start_request()),
                                      2: current.parsed}
        self.ids: dict[type, int] = {StartRequest: 2}

    def header(self, rs: RecordSchema) -> bytes:
        return b"\x00" + self.ids.get(rs.cls, 0).to_bytes(4, "big")

    def record_type(self, data: bytes) -> type | None:
        return StartRequest if int.from_bytes(data[1:5], "big") in self.by_id else None

    def writer_schema(self, expected: RecordSchema, data: bytes) -> tuple[Any, int]:
        if data[:1] != b"\x00" or len(data) < 5:
            raise DecodeError(f"expected a {expected.full_name} behind magic byte 0")
        return self.by_id[int.from_bytes(data[1:5], "big")], 5


def test_a_plugged_in_framing_frames_and_resolves_older_writer_schemas() -> None:
    framing = ToyRegistryFraming()
    codec = Codec(framing)
    request = a_start_request(wait=True)
    frame = codec.encode(request)
    assert frame[:5] == b"\x00\x00\x00\x00\x02"
    assert codec.decode(StartRequest, frame) == request

    older_body = io.BytesIO()
    fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    fastavro.schemaless_writer(older_body, framing.by_id[1], fields)
    older_frame = b"\x00\x00\x00\x00\x01" + older_body.getvalue()
    assert codec.decode(StartRequest, older_frame) == a_start_request(wait=False)


# -- the schema files -----------------------------------------------------------------


def avsc_files() -> list[Any]:
    folder = files("sluicegate.schemas").joinpath("avro")
    return sorted((e for e in folder.iterdir() if e.name.endswith(".avsc")), key=lambda e: e.name)


def test_every_avsc_file_parses_and_has_a_matching_python_class() -> None:
    for entry in avsc_files():
        schema = json.loads(entry.read_text(encoding="utf-8"))
        full_name = f"{schema['namespace']}.{schema['name']}"
        assert entry.name == f"{full_name}.avsc"
        assert schema["namespace"] == "io.sluicegate"
        cls = NAMED_TYPES[full_name]
        assert cls.__name__ == schema["name"]
        if schema["type"] == "enum":
            assert [m.value for m in cls] == schema["symbols"]  # type: ignore[attr-defined]
        else:
            assert [f.name for f in dataclasses.fields(cls)] == [
                f["name"] for f in schema["fields"]
            ]
    assert len(NAMED_TYPES) == len(avsc_files())


def test_every_record_class_has_a_schema_that_fastavro_parses() -> None:
    for cls, rs in RECORD_TYPES.items():
        assert rs.full_name == f"io.sluicegate.{cls.__name__}"
        fastavro.parse_schema(rs.schema)


def test_the_published_schema_reads_our_bytes_with_timestamps_as_instants() -> None:
    published = fastavro.parse_schema(RECORD_TYPES[StartRequest].schema)
    body = io.BytesIO(encode(a_start_request())[10:])
    fields = typing.cast(dict[str, Any], fastavro.schemaless_reader(body, published, None))
    assert fields["requested_at_ms"].year == 2026


# -- keys and payloads ----------------------------------------------------------------


@given(key=st.text())
def test_keys_are_plain_utf8_and_round_trip(key: str) -> None:
    assert encode_key(key) == key.encode("utf-8")
    assert decode_key(encode_key(key)) == key


def test_a_key_that_is_not_utf8_or_missing_raises_decode_error() -> None:
    with pytest.raises(DecodeError, match="UTF-8"):
        decode_key(b"\xff\xfe")
    with pytest.raises(DecodeError, match="no key"):
        decode_key(None)


def test_payloads_are_compact_utf8_json_in_the_callers_key_order() -> None:
    assert dump_payload({"z": 1, "a": ["é", None]}) == '{"z":1,"a":["é",null]}'.encode()


@given(
    obj=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=10,
    )
)
def test_payloads_round_trip(obj: Any) -> None:
    assert load_payload(dump_payload(obj)) == obj


@pytest.mark.parametrize(
    "data", [b"", b"{", b"\xff", b"NaN", b'{"a": Infinity}', "{}".encode("utf-16")]
)
def test_a_payload_that_is_not_utf8_json_raises_decode_error(data: bytes) -> None:
    with pytest.raises(DecodeError, match="expected a UTF-8 JSON payload"):
        load_payload(data)


def test_a_payload_json_cannot_carry_raises_encode_error() -> None:
    with pytest.raises(EncodeError):
        dump_payload({"x": float("nan")})
    with pytest.raises(EncodeError):
        dump_payload({"x": object()})
