"""Confluent Schema Registry framing.

With `Settings.schema_registry_url` set, every value is framed as ``00``, the schema's
4-byte big-endian registry id, then the same Avro body as before: the framing ksqlDB's
AVRO format, Kafka Connect's AvroConverter and every Confluent deserializer read.
Readers keep reading single-object frames (``C3 01`` + fingerprint), so a deployment
that starts using a registry still reads what its topics and stores already hold.

Subjects (docs/decisions/schema-registry-subjects.md): every record type is registered
under its full name (`io.sluicegate.LedgerRecord`, RecordNameStrategy), which needs no
topic, as the codec encodes without knowing one; the public topics whose values are of
one type also get TopicNameStrategy's `<topic>-value` (`sg.ledger-value`), the subject
ksqlDB and Connect look a topic's schema up by. A registry gives one schema one id
whatever the subject, so the id a frame carries is the same either way.

Which framing a process uses is picked by `sluicegate.topology.framing.configure_codec`,
which knows the topics; everything else keeps calling `codec.encode` / `codec.decode`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fastavro.schema import to_parsing_canonical_form

from sluicegate.config import Settings
from sluicegate.schemas.codec import (
    NAMED_TYPES,
    RECORD_TYPES,
    REGISTRY_MAGIC,
    SINGLE_OBJECT_MARKER,
    DecodeError,
    RecordSchema,
    SingleObjectFraming,
    parse_writer_schema,
)

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema

HEADER_SIZE = len(REGISTRY_MAGIC) + 4
_MAX_MISSING = 10_000  # ids the registry said it does not have, remembered (bad input repeats)


class RegistryError(RuntimeError):
    """The schema registry refused a request or did not answer: not the record's fault.

    A worker that meets it while decoding aborts the cycle and tries it again, rather
    than dead-lettering a record that may be fine (engine/runtime.py)."""


class SchemaStore(Protocol):
    """What the framing needs of a registry client (`SchemaRegistryClient` has it)."""

    def register_schema(self, subject_name: str, schema: Schema) -> int: ...

    def get_schema(self, schema_id: int) -> Schema: ...


def record_subject(rs: RecordSchema) -> str:
    """RecordNameStrategy: the subject of a record type, whatever topic carries it."""
    return rs.full_name


@dataclass(frozen=True, slots=True)
class _Writer:
    full_name: str
    parsed: Any


class RegistryFraming:
    """``00`` + 4-byte big-endian schema id + Avro body; reads single-object frames too.

    Registers every record type's schema when constructed (so `header` is a lookup and
    decoding our own records never calls the registry); a schema id it has not seen is
    fetched once and cached, so records written by other producers with another
    version of a schema are resolved against ours, as single-object readers cannot.
    """

    header_size = HEADER_SIZE

    def __init__(self, store: SchemaStore, *, source: str = "the schema registry",
                 key: tuple[Any, ...] = ()) -> None:
        self.source = source  # said in errors: where the registry is
        self.key = key  # the settings it was made from (configure_codec compares them)
        self._store = store
        self._types = tuple(RECORD_TYPES.values())
        self._single = SingleObjectFraming(self._types)
        self._headers: dict[type, bytes] = {}
        self._writers: dict[int, _Writer] = {}
        self._missing: set[int] = set()
        self._subjects: set[str] = set()
        self._lock = threading.Lock()  # registration from a Client's and a worker's threads
        for rs in self._types:
            schema_id = self._register(record_subject(rs), rs)
            self._headers[rs.cls] = REGISTRY_MAGIC + schema_id.to_bytes(4, "big")

    # -- registering ---------------------------------------------------------------

    def register_subjects(self, subjects: Mapping[type, str]) -> None:
        """Register each record type's schema under the subject given for it (a public
        topic's `<topic>-value`), once each."""
        for cls, subject in subjects.items():
            if subject not in self._subjects:
                self._register(subject, RECORD_TYPES[cls])

    def _register(self, subject: str, rs: RecordSchema) -> int:
        from confluent_kafka.schema_registry import Schema, SchemaRegistryError

        with self._lock:
            try:
                schema_id = self._store.register_schema(
                    subject, Schema(json.dumps(rs.schema), "AVRO"))
            except SchemaRegistryError as exc:
                raise RegistryError(_refusal(self.source, subject, rs, exc)) from exc
            except Exception as exc:  # the HTTP client's own errors (its name varies by version)
                raise RegistryError(
                    f"no schema registry answers at {self.source} (registering {rs.full_name}"
                    f" under {subject!r}: {type(exc).__name__}: {exc}); check"
                    " SLUICEGATE_SCHEMA_REGISTRY_URL") from exc
            self._subjects.add(subject)
            # A registry keeps one id per schema whatever the subject; one that does not
            # (Apicurio's legacy id mode) still names our schema with each id it returns.
            self._writers[schema_id] = _Writer(rs.full_name, rs.parsed)
            return schema_id

    # -- Framing ---------------------------------------------------------------------

    def header(self, rs: RecordSchema) -> bytes:
        return self._headers[rs.cls]

    def record_type(self, data: bytes) -> type | None:
        if data.startswith(SINGLE_OBJECT_MARKER):
            return self._single.record_type(data)
        if len(data) < HEADER_SIZE or not data.startswith(REGISTRY_MAGIC):
            return None
        try:
            writer = self._writer(int.from_bytes(data[1:HEADER_SIZE], "big"))
        except DecodeError:
            return None
        return NAMED_TYPES.get(writer.full_name)

    def writer_schema(self, expected: RecordSchema, data: bytes) -> tuple[Any, int]:
        if data.startswith(self._headers[expected.cls]):
            return expected.parsed, HEADER_SIZE
        if data.startswith(SINGLE_OBJECT_MARKER):
            return self._single.writer_schema(expected, data)  # written before the registry
        if not data.startswith(REGISTRY_MAGIC):
            raise DecodeError(
                f"expected {expected.full_name} framed as 00 + a schema id (or c3 01 + a"
                f" fingerprint), found bytes starting {data[:2].hex(' ') or '(none)'}")
        if len(data) < HEADER_SIZE:
            raise DecodeError(
                f"expected {expected.full_name} in Schema Registry framing, found"
                f" {len(data)} bytes, shorter than the {HEADER_SIZE}-byte header")
        schema_id = int.from_bytes(data[1:HEADER_SIZE], "big")
        writer = self._writer(schema_id)
        if writer.full_name != expected.full_name:
            raise DecodeError(
                f"expected {expected.full_name}, found {writer.full_name} (schema id"
                f" {schema_id})")
        return writer.parsed, HEADER_SIZE

    def _writer(self, schema_id: int) -> _Writer:
        writer = self._writers.get(schema_id)
        if writer is not None:
            return writer
        if schema_id in self._missing:
            raise DecodeError(f"found schema id {schema_id}, which {self.source} does not have")
        from confluent_kafka.schema_registry import SchemaRegistryError

        try:
            schema = self._store.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise RegistryError(
                    f"{self.source} refused schema id {schema_id}: {exc}") from exc
            if len(self._missing) >= _MAX_MISSING:
                self._missing.clear()
            self._missing.add(schema_id)
            raise DecodeError(
                f"found schema id {schema_id}, which {self.source} does not have: not a"
                " record written with this registry") from exc
        except Exception as exc:  # the HTTP client's own errors (its name varies by version)
            raise RegistryError(
                f"no schema registry answers at {self.source} (fetching schema id"
                f" {schema_id}: {type(exc).__name__}: {exc})") from exc
        writer = _parse_fetched(schema_id, schema)
        self._writers[schema_id] = writer
        return writer


def _parse_fetched(schema_id: int, schema: Schema) -> _Writer:
    """A fetched writer schema, parsed for the codec; DecodeError if it cannot be one."""
    what = f"schema id {schema_id}"
    if (schema.schema_type or "AVRO") != "AVRO":
        raise DecodeError(f"found {what}, a {schema.schema_type} schema, not Avro")
    if schema.references:
        raise DecodeError(f"found {what}, which references other schemas: sluicegate reads"
                          " self-contained schemas only")
    try:
        body = json.loads(schema.schema_str or "")
        if not isinstance(body, dict) or body.get("type") != "record":
            raise ValueError("not a record schema")
        full_name = body["name"] if "." in body["name"] else (
            f"{body.get('namespace', '')}.{body['name']}".lstrip("."))
        rs = RECORD_TYPES.get(NAMED_TYPES.get(full_name, object))
        if rs is not None and to_parsing_canonical_form(body) == rs.canonical_form:
            # Our schema, registered by someone else (other docs, other whitespace): the
            # codec then reads it without resolution, on its fast path.
            return _Writer(full_name, rs.parsed)
        return _Writer(full_name, parse_writer_schema(body))
    except Exception as exc:
        raise DecodeError(f"found {what}, which is not an Avro record schema sluicegate can"
                          f" read ({type(exc).__name__}: {exc})") from exc


def _refusal(source: str, subject: str, rs: RecordSchema, exc: Any) -> str:
    status = exc.http_status_code
    if status in (401, 403):
        return (f"{source} refused to register {rs.full_name} under {subject!r} (HTTP"
                f" {status}: {exc.error_message}); check basic.auth.user.info"
                " (SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO) and that the user may"
                " write that subject")
    if status == 409:
        return (f"{source} refused {rs.full_name} as a new version of subject {subject!r}:"
                f" incompatible with the version it holds ({exc.error_message}). That"
                " subject holds a schema sluicegate did not write (a ksqlDB CREATE STREAM"
                " run before any sluicegate process registered it does that); delete the"
                " subject's versions, or set its compatibility to NONE, and start again")
    return (f"{source} refused to register {rs.full_name} under {subject!r} (HTTP {status},"
            f" error {exc.error_code}: {exc.error_message})")


# -- the process's framing --------------------------------------------------------------


def registry_key(settings: Settings) -> tuple[Any, ...]:
    """What makes two settings name the same registry with the same credentials."""
    return tuple(sorted(settings.registry_config().items()))


def registry_client(settings: Settings) -> Any:
    """A `SchemaRegistryClient` for these settings (imported here: it costs a quarter
    of a second, which processes without a registry do not pay)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    try:
        return SchemaRegistryClient(settings.registry_config())
    except Exception as exc:  # a setting the client does not know, a malformed URL
        raise RegistryError(f"cannot make a schema registry client for"
                            f" {settings.schema_registry_url}: {exc}") from exc

