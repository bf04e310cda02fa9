"""Schema Registry framing: 00 + the schema's id, both framings read on every topic,
unknown ids fetched once, and bad bytes still only ever raise DecodeError.

The registry here is an in-memory stand-in with a registry's id rules (one id per schema
text, 404 for an id it never gave); tests/integration/test_schema_registry.py runs the
same framing against a real one."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryError
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.codec import (
    RECORD_TYPES,
    Codec,
    DecodeError,
    parse_writer_schema,
)
from sluicegate.schemas.records import (
    CancelSweep,
    LedgerRecord,
    Outcome,
    PendingStart,
    Release,
    ReleaseKind,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.schemas.registry import RegistryError, RegistryFraming
from sluicegate.topology.framing import configure_codec, topic_subjects
from sluicegate.topology.topics import Topics
from tests.unit.test_codec import RECORD_CLASSES, a_start_request, records_of


class MemoryRegistry:
    """Ids as a Schema Registry gives them: one per distinct schema text, kept forever."""

    def __init__(self) -> None:
        self.schemas: dict[int, Schema] = {}
        self.subjects: dict[str, list[int]] = {}
        self.fetches: list[int] = []
        self.down = False

    def register_schema(self, subject_name: str, schema: Schema) -> int:
        if self.down:
            raise ConnectionError("connection refused")
        same = [i for i, known in self.schemas.items()
                if (known.schema_str, known.schema_type) == (schema.schema_str, schema.schema_type)]
        schema_id = same[0] if same else len(self.schemas) + 1
        self.schemas[schema_id] = schema
        versions = self.subjects.setdefault(subject_name, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def get_schema(self, schema_id: int) -> Schema:
        self.fetches.append(schema_id)
        if self.down:
            raise ConnectionError("connection refused")
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return self.schemas[schema_id]


@pytest.fixture
def registry() -> MemoryRegistry:
    return MemoryRegistry()


@pytest.fixture
def framed(registry: MemoryRegistry) -> Codec:
    return Codec(RegistryFraming(registry, source="http://registry.test"))


def older_start_request_schema() -> dict[str, Any]:
    """StartRequest as a producer built against an older .avsc writes it: no `wait`."""
    current = RECORD_TYPES[StartRequest].schema
    return {**current, "fields": [f for f in current["fields"] if f["name"] != "wait"]}


def body_of(schema: dict[str, Any], record: Any) -> bytes:
    out = io.BytesIO()
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    fastavro.schemaless_writer(out, parse_writer_schema(schema), fields)
    return out.getvalue()


def a_run_row() -> RunRow:
    return RunRow(execution_id="e1", workflow="w", status=RunStatus.running, payload=b"{}",
                  declaration_version="v1", admitted_at_ms=1, updated_at_ms=2, slots=[],
                  keys={})


# -- writing ----------------------------------------------------------------------------


def test_every_type_is_registered_under_its_full_name_and_framed_with_that_id(
        registry: MemoryRegistry) -> None:
    framing = RegistryFraming(registry)
    for rs in RECORD_TYPES.values():
        (schema_id,) = registry.subjects[rs.full_name]
        assert framing.header(rs) == b"\x00" + schema_id.to_bytes(4, "big")
        assert json.loads(registry.schemas[schema_id].schema_str) == rs.schema
    framed = Codec(framing)
    frame = framed.encode(a_start_request())
    assert frame[:5] == framing.header(RECORD_TYPES[StartRequest])
    assert framed.decode(StartRequest, frame) == a_start_request()
    assert registry.fetches == []  # our own schemas are never fetched back


def test_topic_subjects_hold_each_public_topics_record_type_under_the_same_id(
        registry: MemoryRegistry) -> None:
    framing = RegistryFraming(registry)
    framing.register_subjects(topic_subjects(Topics(Settings(namespace="acme."))))
    assert registry.subjects["acme.ledger-value"] == registry.subjects["io.sluicegate.LedgerRecord"]
    assert registry.subjects["acme.starts-value"] == registry.subjects["io.sluicegate.StartRequest"]
    acme = {s for s in registry.subjects if s.startswith("acme.")}
    assert acme == set(topic_subjects(Topics(Settings(namespace="acme."))).values())
    assert not any(".stage." in s or ".changelog." in s for s in acme)  # internal topics


@pytest.mark.parametrize("cls", RECORD_CLASSES, ids=lambda c: c.__name__)
@given(data=st.data())
@settings(max_examples=30)
def test_every_record_type_round_trips_in_registry_framing(cls: Any, data: Any) -> None:
    framed = Codec(RegistryFraming(MemoryRegistry()))
    record = data.draw(records_of(cls))
    assert framed.decode(cls, framed.encode(record)) == record


# -- reading both framings --------------------------------------------------------------


def test_single_object_frames_written_before_the_registry_still_decode(framed: Codec) -> None:
    before = Codec().encode(a_start_request(wait=True))
    assert before[:2] == b"\xc3\x01"
    assert framed.decode(StartRequest, before) == a_start_request(wait=True)


def test_a_topic_of_several_types_reads_both_framings(framed: Codec) -> None:
    release = Release(stage="concurrency", key="k", execution_id="e1", workflow="w",
                      kind=ReleaseKind.ended, at_ms=5)
    kinds = (PendingStart, Release, CancelSweep)
    assert framed.decode_one_of(kinds, Codec().encode(release)) == release
    assert framed.decode_one_of(kinds, framed.encode(release)) == release
    with pytest.raises(DecodeError, match=r"expected .*PendingStart or .*Release or "
                                          r".*CancelSweep, found io.sluicegate.RunRow"):
        framed.decode_one_of(kinds, framed.encode(a_run_row()))


def test_an_unknown_id_is_fetched_once_and_resolved_against_our_schema(
        registry: MemoryRegistry, framed: Codec) -> None:
    older = older_start_request_schema()
    older_id = registry.register_schema("other-team-value", Schema(json.dumps(older), "AVRO"))
    frame = b"\x00" + older_id.to_bytes(4, "big") + body_of(older, a_start_request())
    assert framed.decode(StartRequest, frame) == a_start_request(wait=False)
    assert framed.decode(StartRequest, frame) == a_start_request(wait=False)
    assert registry.fetches == [older_id]
    assert framed.decode_one_of((StartRequest,), frame) == a_start_request()


def test_our_schema_registered_by_someone_else_with_other_docs_reads_as_ours(
        registry: MemoryRegistry, framed: Codec) -> None:
    ours = RECORD_TYPES[LedgerRecord].schema
    redocumented = {**ours, "doc": "the same fields, another producer's words"}
    other_id = registry.register_schema("x", Schema(json.dumps(redocumented), "AVRO"))
    row = LedgerRecord(request_id="r", workflow="w", outcome=Outcome.queued,
                       requested_at_ms=1, decided_at_ms=2, key="k")
    frame = b"\x00" + other_id.to_bytes(4, "big") + framed.encode(row)[5:]
    assert framed.decode(LedgerRecord, frame) == row


# -- refusing -------------------------------------------------------------------------


def test_a_frame_of_another_type_is_refused_naming_both(framed: Codec) -> None:
    frame = framed.encode(a_start_request())
    with pytest.raises(DecodeError, match=r"expected io.sluicegate.RunRow, found "
                                          r"io.sluicegate.StartRequest \(schema id \d+\)"):
        framed.decode(RunRow, frame)


def test_an_id_the_registry_never_gave_is_refused_and_asked_about_once(
        registry: MemoryRegistry, framed: Codec) -> None:
    frame = b"\x00\x00\x00\x03\xe7" + framed.encode(a_start_request())[5:]
    for _ in range(3):
        with pytest.raises(DecodeError, match=r"schema id 999, which http://registry\.test does"
                                              r" not have"):
            framed.decode(StartRequest, frame)
    assert registry.fetches == [999]


def test_a_registry_that_does_not_answer_is_a_registry_error_not_bad_input(
        registry: MemoryRegistry, framed: Codec) -> None:
    registry.down = True
    frame = b"\x00\x00\x00\x03\xe7" + framed.encode(a_start_request())[5:]
    with pytest.raises(RegistryError, match=r"no schema registry answers at http://registry\.test"):
        framed.decode(StartRequest, frame)
    registry.down = False
    with pytest.raises(DecodeError):  # the outage was not remembered as a missing id
        framed.decode(StartRequest, frame)


def test_a_schema_that_is_not_an_avro_record_is_refused(
        registry: MemoryRegistry, framed: Codec) -> None:
    json_id = registry.register_schema("j", Schema('{"type": "object"}', "JSON"))
    enum_id = registry.register_schema("e", Schema('{"type": "enum", "name": "E", "symbols":'
                                                   ' ["a"]}', "AVRO"))
    body = framed.encode(a_start_request())[5:]
    with pytest.raises(DecodeError, match="a JSON schema, not Avro"):
        framed.decode(StartRequest, b"\x00" + json_id.to_bytes(4, "big") + body)
    with pytest.raises(DecodeError, match="not an Avro record schema"):
        framed.decode(StartRequest, b"\x00" + enum_id.to_bytes(4, "big") + body)


def test_a_frame_in_neither_framing_or_cut_short_is_refused_saying_what_was_expected(
        framed: Codec) -> None:
    with pytest.raises(DecodeError, match=r"framed as 00 \+ a schema id .* found bytes"
                                          r" starting 7b 22"):
        framed.decode(StartRequest, b'{"request_id": "r"}')
    with pytest.raises(DecodeError, match="3 bytes, shorter than the 5-byte header"):
        framed.decode(StartRequest, b"\x00\x00\x01")


@pytest.mark.parametrize("cls", [StartRequest, LedgerRecord, PendingStart, RunRow],
                         ids=lambda c: c.__name__)
@given(garbage=st.binary(max_size=64))
@settings(max_examples=200)
def test_random_bytes_only_ever_raise_decode_error(cls: Any, garbage: bytes) -> None:
    framed = Codec(RegistryFraming(MemoryRegistry()))
    with pytest.raises(DecodeError):
        framed.decode(cls, garbage)
    with pytest.raises(DecodeError):
        framed.decode(cls, b"\x00" + garbage)


# -- registering ------------------------------------------------------------------------


class RefusingRegistry(MemoryRegistry):
    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__()
        self.error = SchemaRegistryError(status, code, message)

    def register_schema(self, subject_name: str, schema: Schema) -> int:
        raise self.error


def test_a_subject_holding_an_incompatible_schema_is_named_with_what_to_do() -> None:
    store = RefusingRegistry(409, 409, "Schema being registered is incompatible")
    with pytest.raises(RegistryError, match=r"refused io.sluicegate.\w+ as a new version of"
                                            r" subject 'io.sluicegate.\w+'.*delete"):
        RegistryFraming(store, source="http://r")


def test_a_refused_login_says_which_setting_to_check() -> None:
    with pytest.raises(RegistryError, match="SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO"):
        RegistryFraming(RefusingRegistry(401, 40101, "Unauthorized"), source="http://r")


# -- configuring the process ------------------------------------------------------------


def test_settings_pass_registry_client_settings_through_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_SCHEMA_REGISTRY_URL", "http://r:8081")
    monkeypatch.setenv("SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO", "ann:s3cret")
    monkeypatch.setenv("SLUICEGATE_SCHEMA_REGISTRY_SSL_CA_LOCATION", "/etc/ca.pem")
    s = Settings()
    assert s.schema_registry_url == "http://r:8081"
    assert s.registry_config() == {"url": "http://r:8081", "basic.auth.user.info": "ann:s3cret",
                                   "ssl.ca.location": "/etc/ca.pem"}


def test_configuring_a_registry_installs_its_framing_once_per_process(
        monkeypatch: pytest.MonkeyPatch, restore_codec: None) -> None:
    store = MemoryRegistry()
    made: list[Settings] = []

    def client(settings: Settings) -> MemoryRegistry:
        made.append(settings)
        return store

    monkeypatch.setattr("sluicegate.topology.framing.registry_client", client)
    plain = Settings(schema_registry_url="", schema_registry={})
    assert configure_codec(plain) is codec.default()  # no registry: single-object, as before
    assert codec.encode(a_start_request())[:2] == b"\xc3\x01"

    with_registry = plain.with_(schema_registry_url="http://r:8081", namespace="acme.")
    installed = configure_codec(with_registry)
    assert codec.default() is installed
    assert codec.encode(a_start_request())[:1] == b"\x00"
    assert "acme.ledger-value" in store.subjects
    assert configure_codec(with_registry) is installed
    assert configure_codec(with_registry.with_(namespace="other.")) is installed
    assert "other.ledger-value" in store.subjects
    assert len(made) == 1

    with pytest.raises(RegistryError, match="already frames records for the schema registry at"
                                            " http://r:8081; settings without"):
        configure_codec(plain)
    with pytest.raises(RegistryError, match="these settings name http://elsewhere:8081"):
        configure_codec(with_registry.with_(schema_registry_url="http://elsewhere:8081"))


def test_basic_auth_reaches_the_registry_and_a_refusal_is_one_clear_error(
        restore_codec: None) -> None:
    seen: list[str | None] = []

    class Refuse(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = b'{"error_code": 40101, "message": "Unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        s = Settings(schema_registry_url=url,
                     schema_registry={"basic.auth.user.info": "ann:s3cret"})
        with pytest.raises(RegistryError,
                           match=f"{url} refused to register .*HTTP 401.*BASIC_AUTH_USER_INFO"):
            configure_codec(s)
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] == "Basic " + base64.b64encode(b"ann:s3cret").decode()
    assert codec.default().framing.__class__.__name__ == "SingleObjectFraming"
