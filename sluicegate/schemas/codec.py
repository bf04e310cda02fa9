"""Avro codec for every sluicegate record: the bytes on every topic and in every store.

A value is framed in Avro single-object encoding: ``C3 01``, the 8-byte
little-endian CRC-64-AVRO fingerprint of the writer schema's parsing canonical
form, then the Avro binary body. Readers also take the schemas earlier releases wrote
(`avro/history/`, resolved into the current classes) and refuse any other fingerprint
as written by a newer version. The framing is pluggable (`Framing`): with a
schema registry configured, `sluicegate.schemas.registry` installs Confluent
Schema Registry framing as the process default (`use`). Keys are plain UTF-8
strings; payloads are compact JSON. See docs/wire-format.md.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from functools import partial
from importlib.resources import files
from importlib.resources.abc import Traversable
from io import BytesIO
from types import ModuleType
from typing import Any, Protocol, TypeVar, get_args

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from sluicegate.schemas import native, records
from sluicegate.schemas.records import Record

NAMESPACE = "io.sluicegate"
_BUFFER_REPR = re.compile(r" from <_io\.BytesIO object at 0x[0-9a-fA-F]+>")
SINGLE_OBJECT_MARKER = b"\xc3\x01"
REGISTRY_MAGIC = b"\x00"  # Confluent Schema Registry framing: 00 + 4-byte big-endian id

R = TypeVar("R", bound=Record)


class DecodeError(ValueError):
    """Bytes that are not the record, key or payload the reader expected."""


class EncodeError(ValueError):
    """A record whose field values do not fit its schema."""


def schema_fingerprint(canonical_form: str) -> bytes:
    """CRC-64-AVRO (Rabin) of a parsing canonical form, as the 8 little-endian bytes
    that single-object encoding carries."""
    return bytes.fromhex(_fastavro_fingerprint(canonical_form, "CRC-64-AVRO"))


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class RecordSchema:
    """One record type's schema, in every form the codec needs."""

    cls: type[Record]
    full_name: str
    schema: dict[str, Any]  # self-contained: named types it uses are inlined
    canonical_form: str
    fingerprint: bytes
    parsed: Any  # fastavro's parsed form, timestamps read as plain ints
    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[dict[str, Any]], Any]


# -- loading the .avsc files -------------------------------------------------------


_AVRO = files(__package__).joinpath("avro")


def _load_avsc(folder: Traversable = _AVRO) -> dict[str, dict[str, Any]]:
    """Every .avsc directly in `folder`, by full name (not the history below it)."""
    by_name: dict[str, dict[str, Any]] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            schema = json.loads(entry.read_text(encoding="utf-8"))
            full_name = f"{schema['namespace']}.{schema['name']}"
            if entry.name != f"{full_name}.avsc":
                raise RuntimeError(f"{entry.name} defines {full_name}; name it {full_name}.avsc")
            by_name[full_name] = schema
    return by_name


def _inline(node: Any, defs: Mapping[str, dict[str, Any]], seen: set[str]) -> Any:
    """Replace references to our named types by their definition at first use, so
    the result is one self-contained writer schema (as canonical form requires)."""
    if isinstance(node, str):
        if node not in defs:
            return node
        if node in seen:
            return node
        seen.add(node)
        return _inline(defs[node], defs, seen)
    if isinstance(node, list):
        return [_inline(branch, defs, seen) for branch in node]
    if isinstance(node, dict):
        out = dict(node)
        if node.get("type") == "record":
            seen.add(f"{node['namespace']}.{node['name']}")
            out["fields"] = [{**f, "type": _inline(f["type"], defs, seen)} for f in node["fields"]]
        elif node.get("type") == "array":
            out["items"] = _inline(node["items"], defs, seen)
        elif node.get("type") == "map":
            out["values"] = _inline(node["values"], defs, seen)
        elif isinstance(node.get("type"), str | list | dict):
            out["type"] = _inline(node["type"], defs, seen)
        return out
    return node


def _without_timestamp_logical_type(node: Any) -> Any:
    """The published schemas mark instants as timestamp-millis for other languages;
    Python keeps them as ms ints. Canonical form ignores logicalType, so the
    fingerprint and the bytes are the same either way."""
    if isinstance(node, list):
        return [_without_timestamp_logical_type(n) for n in node]
    if isinstance(node, dict):
        return {
            k: _without_timestamp_logical_type(v)
            for k, v in node.items()
            if not (k == "logicalType" and v == "timestamp-millis")
        }
    return node


def parse_writer_schema(schema: Any) -> Any:
    """Parse a writer schema (a self-contained .avsc as JSON data) for the codec.

    A `Framing` that fetches writer schemas (from a registry, say) parses them with
    this: fastavro applies the *writer's* logical types when it resolves, and
    sluicegate keeps timestamps as ms ints."""
    return parse_schema(_without_timestamp_logical_type(schema), named_schemas={})


def _python_type(full_name: str) -> type:
    simple = full_name.removeprefix(f"{NAMESPACE}.")
    cls = getattr(records, simple, None)
    if not isinstance(cls, type):
        raise RuntimeError(f"schema {full_name} has no class {simple} in {records.__name__}")
    return cls


def _check_pairing(full_name: str, schema: dict[str, Any], cls: type) -> None:
    """Fail at import if a schema and its Python class drift apart."""
    if schema["type"] == "enum":
        symbols = [m.value for m in cls] if issubclass(cls, Enum) else None
        if symbols != schema["symbols"]:
            raise RuntimeError(f"{full_name}: symbols {schema['symbols']} != {cls.__name__}")
        return
    py_fields = dataclasses.fields(cls)
    avro_names = [f["name"] for f in schema["fields"]]
    if [f.name for f in py_fields] != avro_names:
        raise RuntimeError(f"{full_name} fields {avro_names} != {cls.__name__} dataclass fields")
    for py, avro in zip(py_fields, schema["fields"], strict=True):
        py_default = py.default if py.default is not dataclasses.MISSING else "<none>"
        if avro.get("default", "<none>") != py_default:
            raise RuntimeError(
                f"{full_name}.{py.name}: Avro default {avro.get('default', '<none>')!r}"
                f" != dataclass default {py_default!r}"
            )


# -- record <-> dict -----------------------------------------------------------------
#
# Written per class from the schema at import: asdict() deep-copies and costs
# several times more. Enum members are str subclasses, which fastavro writes
# as-is, so encoding only has to turn nested Slot records into dicts.


def _converters(
    cls: type, schema: dict[str, Any], defs: Mapping[str, dict[str, Any]]
) -> tuple[Callable[[Any], dict[str, Any]], Callable[[dict[str, Any]], Any]]:
    names = tuple(f["name"] for f in schema["fields"])
    enum_fields: list[tuple[str, dict[str, Enum]]] = []
    record_list_fields: list[tuple[str, type, tuple[str, ...]]] = []
    for f in schema["fields"]:
        ftype = f["type"]
        if isinstance(ftype, list) and any(isinstance(b, str) and b in defs for b in ftype):
            raise RuntimeError(f"{cls.__name__}.{f['name']}: optional named types need a converter")
        if isinstance(ftype, str) and defs.get(ftype, {}).get("type") == "enum":
            enum_cls = _python_type(ftype)
            enum_fields.append((f["name"], {m.value: m for m in enum_cls}))  # type: ignore[attr-defined]
        elif isinstance(ftype, dict) and ftype["type"] == "array" and str(ftype["items"]) in defs:
            item = defs[ftype["items"]]
            item_names = tuple(i["name"] for i in item["fields"])
            record_list_fields.append((f["name"], _python_type(ftype["items"]), item_names))

    def to_avro(record: Any) -> dict[str, Any]:
        out = {name: getattr(record, name) for name in names}
        for name, _, item_names in record_list_fields:
            out[name] = [{n: getattr(i, n) for n in item_names} for i in out[name]]
        return out

    def from_avro(data: dict[str, Any]) -> Any:
        for name, members in enum_fields:
            data[name] = members[data[name]]
        for name, item_cls, _ in record_list_fields:
            data[name] = [item_cls(**i) for i in data[name]]
        return cls(**data)

    return to_avro, from_avro


def _build_registry() -> tuple[dict[type, RecordSchema], dict[str, type]]:
    defs = _load_avsc()
    named: dict[str, type] = {}
    types: dict[type, RecordSchema] = {}
    for full_name, schema in defs.items():
        cls = _python_type(full_name)
        _check_pairing(full_name, schema, cls)
        named[full_name] = cls
        if schema["type"] != "record":
            continue
        standalone = _inline(full_name, defs, set())
        canonical = to_parsing_canonical_form(standalone)
        to_avro, from_avro = _converters(cls, schema, defs)
        types[cls] = RecordSchema(
            cls=cls,
            full_name=full_name,
            schema=standalone,
            canonical_form=canonical,
            fingerprint=schema_fingerprint(canonical),
            parsed=parse_writer_schema(standalone),
            to_avro=to_avro,
            from_avro=from_avro,
        )
    missing = set(get_args(Record)) - set(types)
    if missing:
        raise RuntimeError(f"no .avsc for {sorted(c.__name__ for c in missing)}")
    return types, named


_TYPES, _NAMED = _build_registry()

RECORD_TYPES: Mapping[type, RecordSchema] = _TYPES
"""Record class -> its schema (full name, parsed schema, fingerprint)."""

NAMED_TYPES: Mapping[str, type] = _NAMED
"""Avro full name -> Python class, for every .avsc (records and enums)."""


def fingerprint(cls: type[Record]) -> bytes:
    """The 8-byte fingerprint a record of this type carries in its frame."""
    return _TYPES[cls].fingerprint


# -- released schemas ------------------------------------------------------------------
#
# avro/history/<release>/ holds every .avsc as that release shipped it. A record written
# by an earlier release (a row in a store, a start parked on a stage topic before a
# rolling upgrade) names its writer schema by fingerprint; the reader finds that schema
# here and resolves the record into the current class by Avro's rules, a field the writer
# did not have taking its default. docs/decisions/schema-evolution.md.


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class ReleasedSchema:
    """An earlier schema of a record type, as a release wrote it."""

    cls: type[Record]
    full_name: str
    release: str  # the first release in the history that has it
    fingerprint: bytes
    parsed: Any


def _release_order(name: str) -> tuple[int, ...]:
    # Numerically: 0.10.0 came after 0.9.0.
    return tuple(int(n) for n in re.findall(r"\d+", name))


def _load_history(types: Iterable[RecordSchema]) -> dict[bytes, ReleasedSchema]:
    current = {rs.full_name: rs for rs in types}
    released: dict[bytes, ReleasedSchema] = {}
    history = _AVRO.joinpath("history")
    if not history.is_dir():
        return released
    folders = sorted((e for e in history.iterdir() if e.is_dir()),
                     key=lambda e: _release_order(e.name))
    for folder in folders:
        # A release's files inline one another, as the current ones do: an older record
        # is read with the enums and Slot of its own release.
        defs = _load_avsc(folder)
        for full_name, schema in defs.items():
            rs = current.get(full_name)
            if schema["type"] != "record" or rs is None:
                continue  # a type no longer kept has no class to read into
            standalone = _inline(full_name, defs, set())
            fp = schema_fingerprint(to_parsing_canonical_form(standalone))
            if fp == rs.fingerprint or fp in released:
                continue
            released[fp] = ReleasedSchema(rs.cls, full_name, folder.name, fp,
                                          parse_writer_schema(standalone))
    return released


RELEASED: Mapping[bytes, ReleasedSchema] = _load_history(_TYPES.values())
"""Fingerprint -> every released schema that is no longer its record type's current one."""


# -- compiled fast paths ---------------------------------------------------------------
#
# fastavro's schemaless_writer/reader cost ~9-10 µs per record (a BytesIO, a dict per
# record, a generic walk of the parsed schema), which is most of what the identity stage
# spends on a passthrough start. For every record type whose schema uses only the types
# below, a specialised Python encoder and decoder are generated from the schema at
# import (so they cannot drift from the .avsc), producing and accepting exactly
# fastavro's bytes (tests/unit/test_codec_fast.py proves it against fastavro on random
# records). They only ever take the plain cases: a value of an unexpected type, bytes
# that do not decode, or any other surprise raises inside them, and the codec then
# redoes the work through fastavro, so every error (and every odd value fastavro
# accepts) behaves exactly as before.

_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class _NotFast(Exception):
    """The fast path does not take this value or these bytes: fastavro decides."""


_VARINTS: dict[int, bytes] = {}  # longs written lately: timestamps repeat within a batch


def _long(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    if n.__class__ is not int:  # before the lookup: True and 1.0 hash as 1
        raise _NotFast
    out = _VARINTS.get(n)
    if out is not None:
        return out
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise _NotFast
    z = (n << 1) ^ (n >> 63)
    groups = []
    while z >= 0x80:
        groups.append((z & 0x7F) | 0x80)
        z >>= 7
    groups.append(z)
    out = bytes(groups)
    if len(_VARINTS) >= 4096:
        _VARINTS.clear()
    _VARINTS[n] = out
    return out


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    z = b & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise _NotFast
    if z >> 64:
        raise _NotFast
    return (z >> 1) ^ -(z & 1), pos


class _Compiler:
    """Generates the source of one record's encoder and decoder from its schema."""

    def __init__(self) -> None:
        self.names: dict[str, dict[str, Any]] = {}  # named types seen so far
        self.env: dict[str, Any] = {
            "_long": _long, "_read_long": _read_long, "_NotFast": _NotFast,
            "_LENGTHS": [bytes((2 * n,)) for n in range(64)],
            "_pack_double": struct.Struct("<d").pack,
            "_unpack_double": struct.Struct("<d").unpack_from,
        }
        self.lines: list[str] = []
        self._n = 0

    def fresh(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def resolve(self, t: Any) -> Any:
        if isinstance(t, str) and t in self.names:
            return self.names[t]
        if isinstance(t, dict) and t.get("type") in ("record", "enum"):
            self.names[f"{t['namespace']}.{t['name']}"] = t
        if isinstance(t, dict) and t.get("type") in ("long", "string", "bytes", "boolean",
                                                     "double"):
            return t["type"]  # a primitive with a logicalType: timestamps stay ints
        return t

    @staticmethod
    def length(b: str, ind: str) -> list[str]:
        # Most strings are shorter than 64 bytes: their length is one byte, from a table.
        n = f"n_{b}"
        return [f"{ind}{n} = len({b})", f"{ind}a(_LENGTHS[{n}] if {n} < 64 else _long({n}))"]

    # Each emitter writes code that encodes the Python value named `v` (appending to
    # `a`), or decodes one value into `v` from `data` at `pos`.

    def enc(self, t: Any, v: str, ind: str) -> list[str]:
        t = self.resolve(t)
        if t == "long":
            return [f"{ind}a(_long({v}))"]
        if t == "string":
            b = self.fresh("b")
            return [f"{ind}if {v}.__class__ is not str: raise _NotFast",
                    f"{ind}{b} = {v}.encode()", *self.length(b, ind), f"{ind}a({b})"]
        if t == "bytes":
            return [f"{ind}if {v}.__class__ is not bytes: raise _NotFast",
                    *self.length(v, ind), f"{ind}a({v})"]
        if t == "double":
            return [f"{ind}if {v}.__class__ is not float: raise _NotFast",
                    f"{ind}a(_pack_double({v}))"]
        if t == "boolean":
            return [f"{ind}if {v} is True: a(b'\\x01')",
                    f"{ind}elif {v} is False: a(b'\\x00')",
                    f"{ind}else: raise _NotFast"]
        if isinstance(t, list):
            if len(t) != 2 or t[0] != "null":
                raise _NotFast
            inner = self.enc(t[1], v, ind + "    ")
            return [f"{ind}if {v} is None: a(b'\\x00')", f"{ind}else:",
                    f"{ind}    a(b'\\x02')", *inner]
        if isinstance(t, dict) and t["type"] == "enum":
            table = self.fresh("_enum")
            self.env[table] = {s: _long(i) for i, s in enumerate(t["symbols"])}
            return [f"{ind}if not isinstance({v}, str): raise _NotFast",
                    f"{ind}a({table}[{v}])"]
        if isinstance(t, dict) and t["type"] == "array":
            item = self.fresh("i")
            return [f"{ind}if {v}.__class__ is not list: raise _NotFast",
                    f"{ind}if {v}:",
                    f"{ind}    a(_long(len({v})))",
                    f"{ind}    for {item} in {v}:",
                    *self.enc(t["items"], item, ind + "        "),
                    f"{ind}a(b'\\x00')"]
        if isinstance(t, dict) and t["type"] == "map":
            key, value = self.fresh("k"), self.fresh("x")
            return [f"{ind}if {v}.__class__ is not dict: raise _NotFast",
                    f"{ind}if {v}:",
                    f"{ind}    a(_long(len({v})))",
                    f"{ind}    for {key}, {value} in {v}.items():",
                    *self.enc("string", key, ind + "        "),
                    *self.enc(t["values"], value, ind + "        "),
                    f"{ind}a(b'\\x00')"]
        if isinstance(t, dict) and t["type"] == "record":
            cls = self.fresh("_cls")
            self.env[cls] = _python_type(f"{t['namespace']}.{t['name']}")
            out = [f"{ind}if {v}.__class__ is not {cls}: raise _NotFast"]
            for f in t["fields"]:
                fv = self.fresh("f")
                out.append(f"{ind}{fv} = {v}.{f['name']}")
                out += self.enc(f["type"], fv, ind)
            return out
        raise _NotFast  # maps, doubles, fixed, ...: fastavro only

    @staticmethod
    def read_long(v: str, ind: str) -> list[str]:
        # One-byte varints (lengths under 64, small numbers) inline; longer ones call.
        return [f"{ind}{v} = data[pos]",
                f"{ind}if {v} < 0x80:",
                f"{ind}    {v} = ({v} >> 1) ^ -({v} & 1)",
                f"{ind}    pos += 1",
                f"{ind}else:",
                f"{ind}    {v}, pos = _read_long(data, pos)"]

    def dec(self, t: Any, v: str, ind: str) -> list[str]:
        t = self.resolve(t)
        if t == "long":
            return self.read_long(v, ind)
        if t in ("string", "bytes"):
            n = self.fresh("n")
            out = [*self.read_long(n, ind),
                   f"{ind}if {n} < 0 or pos + {n} > len(data): raise _NotFast",
                   f"{ind}{v} = data[pos:pos + {n}]"]
            if t == "string":
                out[-1] += ".decode()"
            return [*out, f"{ind}pos += {n}"]
        if t == "double":
            return [f"{ind}{v}, = _unpack_double(data, pos)", f"{ind}pos += 8"]
        if t == "boolean":
            return [f"{ind}{v} = data[pos]", f"{ind}pos += 1",
                    f"{ind}if {v} > 1: raise _NotFast", f"{ind}{v} = {v} == 1"]
        if isinstance(t, list):
            if len(t) != 2 or t[0] != "null":
                raise _NotFast
            return [f"{ind}if data[pos] == 0:", f"{ind}    pos += 1", f"{ind}    {v} = None",
                    f"{ind}elif data[pos] == 2:", f"{ind}    pos += 1",
                    *self.dec(t[1], v, ind + "    "),
                    f"{ind}else: raise _NotFast"]
        if isinstance(t, dict) and t["type"] == "enum":
            members = self.fresh("_members")
            enum_cls = _python_type(f"{t['namespace']}.{t['name']}")
            self.env[members] = [enum_cls(s) for s in t["symbols"]]
            k = self.fresh("k")
            return [f"{ind}{k}, pos = _read_long(data, pos)",
                    f"{ind}if {k} < 0: raise _NotFast",
                    f"{ind}{v} = {members}[{k}]"]
        if isinstance(t, dict) and t["type"] == "array":
            count, item = self.fresh("c"), self.fresh("i")
            return [f"{ind}{v} = []",
                    f"{ind}while True:",
                    f"{ind}    {count}, pos = _read_long(data, pos)",
                    f"{ind}    if {count} == 0: break",
                    f"{ind}    if {count} < 0: raise _NotFast",
                    f"{ind}    for _ in range({count}):",
                    *self.dec(t["items"], item, ind + "        "),
                    f"{ind}        {v}.append({item})"]
        if isinstance(t, dict) and t["type"] == "map":
            count, key, value = self.fresh("c"), self.fresh("k"), self.fresh("x")
            return [f"{ind}{v} = {{}}",
                    f"{ind}while True:",
                    f"{ind}    {count}, pos = _read_long(data, pos)",
                    f"{ind}    if {count} == 0: break",
                    f"{ind}    if {count} < 0: raise _NotFast",
                    f"{ind}    for _ in range({count}):",
                    *self.dec("string", key, ind + "        "),
                    *self.dec(t["values"], value, ind + "        "),
                    f"{ind}        {v}[{key}] = {value}"]
        if isinstance(t, dict) and t["type"] == "record":
            cls = self.fresh("_cls")
            self.env[cls] = _python_type(f"{t['namespace']}.{t['name']}")
            names = []
            out = []
            for f in t["fields"]:
                fv = self.fresh("f")
                names.append(fv)
                out += self.dec(f["type"], fv, ind)
            return [*out, f"{ind}{v} = {cls}({', '.join(names)})"]
        raise _NotFast


def _compile(rs: RecordSchema) -> tuple[Callable[[Any], bytes], Callable[[bytes, int], Any]]:
    """The fast encoder (record -> Avro body) and decoder ((data, body offset) -> record
    ending exactly at the end of data) of one record type; _NotFast if its schema has a
    type they do not handle."""
    c = _Compiler()
    enc = c.enc(rs.schema, "r", "    ")
    c.names.clear()
    dec = c.dec(rs.schema, "r", "    ")
    source = "\n".join([
        "def encode(r):", "    parts = []", "    a = parts.append", *enc,
        "    return b''.join(parts)",
        "def decode(data, pos):", *dec,
        "    if pos != len(data): raise _NotFast", "    return r",
    ])
    namespace = dict(c.env)
    exec(compile(source, f"<sluicegate fast codec {rs.full_name}>", "exec"), namespace)
    return namespace["encode"], namespace["decode"]


def _compile_all() -> dict[type, tuple[Callable[[Any], bytes], Callable[[bytes, int], Any]]]:
    fast = {}
    for cls, rs in _TYPES.items():
        try:
            fast[cls] = _compile(rs)
        except _NotFast:
            continue
    return fast


_FAST = _compile_all()


# -- the same fast paths in C ----------------------------------------------------------
#
# sluicegate/schemas/_speedups.c walks a tree built from the schema, taking exactly the
# cases the generated Python takes and writing and reading exactly its bytes (the tests
# compare all three with one another); a few times faster again. The Python paths stay
# as the reference and for an install without the extension (schemas/native.py).

_speedups: ModuleType | None = native.speedups

_PRIMITIVES = ("long", "string", "bytes", "boolean", "double")


def _native_spec(t: Any, names: dict[str, Any]) -> tuple[Any, ...]:
    """The node tree `_speedups.Program` compiles: one tuple per type (see the C file);
    _NotFast for a type the generated Python does not handle either."""
    if isinstance(t, str) and t in names:
        t = names[t]
    if isinstance(t, dict) and t.get("type") in ("record", "enum"):
        names[f"{t['namespace']}.{t['name']}"] = t
    if isinstance(t, dict) and t.get("type") in _PRIMITIVES:
        t = t["type"]  # a primitive with a logicalType: timestamps stay ints
    if t in _PRIMITIVES:
        return (t,)
    if isinstance(t, list):
        if len(t) != 2 or t[0] != "null":
            raise _NotFast
        return ("optional", _native_spec(t[1], names))
    if not isinstance(t, dict):
        raise _NotFast
    if t["type"] == "enum":
        enum_cls = _python_type(f"{t['namespace']}.{t['name']}")
        return ("enum", {s: i for i, s in enumerate(t["symbols"])},
                [enum_cls(s) for s in t["symbols"]])
    if t["type"] == "array":
        return ("array", _native_spec(t["items"], names))
    if t["type"] == "map":
        return ("map", _native_spec(t["values"], names))
    if t["type"] == "record":
        return ("record", _python_type(f"{t['namespace']}.{t['name']}"),
                tuple(f["name"] for f in t["fields"]),
                tuple(_native_spec(f["type"], names) for f in t["fields"]))
    raise _NotFast


def _native_specs() -> dict[type, tuple[Any, ...]]:
    specs = {}
    for cls, rs in _TYPES.items():
        try:
            specs[cls] = _native_spec(rs.schema, {})
        except _NotFast:
            continue
    return specs


NATIVE = _speedups is not None
"""Whether the C fast paths are in use (else the codec takes the generated Python)."""
_NATIVE_SPECS = _native_specs() if NATIVE else {}


# -- framing ---------------------------------------------------------------------


class Framing(Protocol):
    """How a record's Avro body is wrapped so a reader can find its writer schema.

    `SingleObjectFraming` below; `sluicegate.schemas.registry.RegistryFraming` for
    Confluent Schema Registry framing (``00`` + 4-byte big-endian schema id), which
    registers every `RECORD_TYPES` schema when constructed so `header` is a lookup.
    """

    def header(self, rs: RecordSchema) -> bytes:
        """The bytes written before the body of every record of this type."""
        ...

    def writer_schema(self, expected: RecordSchema, data: bytes) -> tuple[Any, int]:
        """The parsed writer schema of ``data`` and the offset its body starts at.

        Return ``expected.parsed`` itself when the writer schema is the reader's
        own (the codec then skips schema resolution); parse any other writer
        schema with `parse_writer_schema`. Raise `DecodeError` when the header is
        not one for ``expected``'s type.
        """
        ...

    def record_type(self, data: bytes) -> type | None:
        """The record class ``data``'s header names, or None when it names none this
        reader knows (a topic carrying several record types is read by this)."""
        ...


class SingleObjectFraming:
    """Avro single-object encoding; reads the current schema of every record type and
    every released one (`RELEASED`), and refuses any other fingerprint."""

    header_size = len(SINGLE_OBJECT_MARKER) + 8

    def __init__(self, types: Iterable[RecordSchema],
                 released: Iterable[ReleasedSchema] | None = None) -> None:
        known = tuple(types)
        self._by_fingerprint = {rs.fingerprint: rs for rs in known}
        self._headers = {rs.cls: SINGLE_OBJECT_MARKER + rs.fingerprint for rs in known}
        older = RELEASED.values() if released is None else released
        self._released = {r.fingerprint: r for r in older}

    def header(self, rs: RecordSchema) -> bytes:
        return SINGLE_OBJECT_MARKER + rs.fingerprint

    def record_type(self, data: bytes) -> type | None:
        if not data.startswith(SINGLE_OBJECT_MARKER):
            return None
        found = data[2 : self.header_size]
        known = self._by_fingerprint.get(found) or self._released.get(found)
        return None if known is None else known.cls

    def writer_schema(self, expected: RecordSchema, data: bytes) -> tuple[Any, int]:
        if data.startswith(self._headers[expected.cls]):
            return expected.parsed, self.header_size
        wanted = f"{expected.full_name} (fingerprint {expected.fingerprint.hex()})"
        if data.startswith(REGISTRY_MAGIC) and len(data) >= 5:
            # A process with a schema registry configured wrote it; only a reader that
            # knows that registry can tell which schema the id names.
            raise DecodeError(
                f"expected {wanted} in single-object encoding, found Schema Registry framing"
                f" (schema id {int.from_bytes(data[1:5], 'big')}): this process has no schema"
                " registry configured (SLUICEGATE_SCHEMA_REGISTRY_URL)"
            )
        if len(data) < self.header_size:
            raise DecodeError(
                f"expected {wanted} in single-object encoding, found {len(data)} bytes,"
                f" shorter than the {self.header_size}-byte header"
            )
        if not data.startswith(SINGLE_OBJECT_MARKER):
            raise DecodeError(
                f"expected {wanted} starting with marker c3 01, found {data[:2].hex(' ')}"
            )
        found = data[2 : self.header_size]
        released = self._released.get(found)
        if released is not None and released.cls is expected.cls:
            return released.parsed, self.header_size  # resolved into the current class
        other = self._by_fingerprint.get(found) or released
        if other is not None:
            raise DecodeError(f"expected {wanted}, found {other.full_name} ({found.hex()})")
        raise DecodeError(unknown_writer(expected.full_name, found))


def unknown_writer(expected: str, found: bytes) -> str:
    """Why a single-object frame with a fingerprint this reader does not know is refused:
    most likely a newer release wrote it (during a rolling upgrade, say)."""
    return (f"written by a newer version (or an unknown writer): expected {expected},"
            f" unknown schema fingerprint {found.hex()}; a process of the release that wrote"
            " it reads it (upgrade this one)")


def _with_header(header: bytes, encode_body: Callable[[Any], bytes], record: Any) -> bytes:
    return header + encode_body(record)


class Codec:
    """Encodes and decodes records with one framing. Build once; share freely."""

    def __init__(self, framing: Framing | None = None, *, fast: bool = True,
                 native: bool = True) -> None:
        self._framing = framing if framing is not None else SingleObjectFraming(_TYPES.values())
        self._headers = {cls: self._framing.header(rs) for cls, rs in _TYPES.items()}
        # Per record type: (record -> header + body, (data, body offset) -> record), in C
        # when built, else the generated Python; fast=False: fastavro only (the reference
        # the fast paths are tested against).
        self._fast: dict[type, tuple[Callable[[Any], bytes], Callable[[bytes, int], Any]]]
        self._fast = {}
        if fast and native and _speedups is not None:
            for cls, spec in _NATIVE_SPECS.items():
                program = _speedups.Program(spec, self._headers[cls])
                self._fast[cls] = (program.encode, program.decode)
        elif fast:
            for cls, (enc, dec) in _FAST.items():
                self._fast[cls] = (partial(_with_header, self._headers[cls], enc), dec)
        # A record framed with its type's current header needs nothing of the framing: the
        # body follows the header (the first test in `decode`).
        self._current: dict[type, tuple[bytes, int, Callable[[bytes, int], Any]]] = {
            cls: (self._headers[cls], len(self._headers[cls]), dec)
            for cls, (_enc, dec) in self._fast.items()}

    @property
    def framing(self) -> Framing:
        return self._framing

    def header_of(self, cls: type[Record]) -> bytes:
        """What every `cls` record this codec writes begins with (its framing, its schema)."""
        return self._headers[cls]

    def encode(self, record: Record) -> bytes:
        fast = self._fast.get(record.__class__)
        if fast is not None:
            try:
                return fast[0](record)
            except Exception:  # not a plain case: fastavro decides below
                pass
        rs = _TYPES.get(type(record))
        if rs is None:
            raise TypeError(f"{type(record).__name__} is not a sluicegate record type")
        buf = BytesIO()
        buf.write(self._headers[rs.cls])
        try:
            schemaless_writer(buf, rs.parsed, rs.to_avro(record))
        except Exception as e:  # fastavro's errors are not a stable contract
            raise EncodeError(f"cannot encode {rs.full_name}: {type(e).__name__}: {e}") from e
        return buf.getvalue()

    def decode(self, cls: type[R], data: bytes | None) -> R:
        """``data`` may be a Kafka value as it comes (None for a tombstone): anything
        that is not a well-formed ``cls`` raises `DecodeError`, never another error."""
        current = self._current.get(cls)
        tried = False
        if current is not None and data.__class__ is bytes and data.startswith(current[0]):
            tried = True
            try:
                return current[2](data, current[1])
            except Exception:  # not a plain case: the framing and fastavro decide below
                pass
        rs = _TYPES.get(cls)
        if rs is None:
            raise TypeError(f"{getattr(cls, '__name__', cls)!r} is not a sluicegate record type")
        if not isinstance(data, bytes):
            if data is None:
                raise DecodeError(f"expected {rs.full_name}, found no value (a tombstone)")
            if not isinstance(data, bytearray | memoryview):
                raise DecodeError(f"expected {rs.full_name} bytes, found {type(data).__name__}")
            data = bytes(data)
        writer, offset = self._framing.writer_schema(rs, data)
        if writer is rs.parsed and not tried:
            fast = self._fast.get(cls)
            if fast is not None:
                try:
                    return fast[1](data, offset)
                except Exception:  # not a plain case: fastavro decides below
                    pass
        buf = BytesIO(data)
        buf.seek(offset)
        try:
            if writer is rs.parsed:
                fields = schemaless_reader(buf, writer, None)
            else:
                fields = schemaless_reader(buf, writer, rs.parsed)
            record: R = rs.from_avro(fields)  # type: ignore[arg-type]
        except Exception as e:  # any failure inside fastavro means the body is not ours
            # fastavro names the buffer it read ("... from <_io.BytesIO object at 0x..>"),
            # an address that tells a reader nothing and differs from call to call.
            why = _BUFFER_REPR.sub("", str(e))
            raise DecodeError(
                f"expected an Avro body of {rs.full_name}, found bytes that do not decode"
                f" ({type(e).__name__}: {why})"
            ) from e
        if buf.tell() != len(data):
            raise DecodeError(
                f"expected {rs.full_name} to end after {buf.tell()} bytes,"
                f" found {len(data) - buf.tell()} more after it"
            )
        return record

    def decode_one_of(self, classes: tuple[type[Any], ...], data: bytes | None) -> Any:
        """Decode a record that may be any of `classes` (a topic carrying several kinds),
        chosen by the type its frame names."""
        named = None
        if isinstance(data, bytes):
            for cls in classes:
                if data.startswith(self._headers[cls]):
                    return self.decode(cls, data)
            # Not this process's own header: a record of an older framing or writer
            # schema, whose header only the framing can read.
            named = self._framing.record_type(data)
            if named in classes:
                return self.decode(named, data)
        names = " or ".join(_TYPES[c].full_name for c in classes)
        if (named is None and isinstance(data, bytes) and data.startswith(SINGLE_OBJECT_MARKER)
                and len(data) >= SingleObjectFraming.header_size):
            # A complete single-object header whose type no framing knows: a fingerprint
            # neither current nor released, as decode says of it.
            raise DecodeError(unknown_writer(names, data[2:SingleObjectFraming.header_size]))
        if data is None:
            found = "no value (a tombstone)"
        elif named is not None:
            found = _TYPES[named].full_name
        else:
            found = f"bytes {bytes(data[:10]).hex(' ')}"
        raise DecodeError(f"expected {names}, found {found}")


# The process's codec. Callers go through the module (`codec.encode(...)`), so `use`
# can swap it once at process start without a wrapper call on every record.
_default = Codec()
encode = _default.encode
decode = _default.decode
decode_one_of = _default.decode_one_of


def default() -> Codec:
    """The codec `encode`, `decode` and `decode_one_of` use."""
    return _default


def use(codec: Codec) -> Codec:
    """Make `codec` the process's codec; returns the one it replaces.

    `sluicegate.topology.framing.configure_codec` calls this where a process starts;
    nothing else should need to."""
    global _default, encode, decode, decode_one_of
    previous = _default
    _default = codec
    encode, decode, decode_one_of = codec.encode, codec.decode, codec.decode_one_of
    return previous


# -- what can be read of a record that does not decode ------------------------------


def leading_fields(cls: type[Record], data: bytes | None) -> dict[str, Any]:
    """The leading fields of a `cls` that can still be read from `data` when it does not
    decode: the body read by the current schema, field by field, up to the first field
    that does not read (or whose type this reader does not walk: records, arrays, maps).
    Only for a rejection that names what it can (docs/wire-format.md): nothing here is
    trusted beyond that.

    The body is read behind a single-object header whose fingerprint is `cls`'s (current
    or released: the body is damaged further on) or unknown (a newer release, which only
    adds fields last, or a writer that computed another fingerprint), and behind a
    registry header; never behind another record type's fingerprint, or no header."""
    rs = _TYPES.get(cls)
    if rs is None or data is None or data.__class__ is not bytes:
        return {}
    if data.startswith(SINGLE_OBJECT_MARKER) and len(data) >= 10:
        found = data[2:10]
        known = next((t.cls for t in _TYPES.values() if t.fingerprint == found), None)
        released = RELEASED.get(found)
        if (known or (released.cls if released else cls)) is not cls:
            return {}
        pos = 10
    elif data.startswith(REGISTRY_MAGIC) and len(data) >= 5:
        pos = 5
    else:
        return {}
    read: dict[str, Any] = {}
    for field in rs.schema["fields"]:
        try:
            value, pos = _read_plain(field["type"], data, pos)
        except (_NotFast, IndexError, UnicodeDecodeError):
            break
        read[field["name"]] = value
    return read


def _read_plain(t: Any, data: bytes, pos: int) -> tuple[Any, int]:
    """One value of a primitive, enum or `["null", T]` type at `pos` (enum: the symbol)."""
    if isinstance(t, dict) and t.get("type") in _PRIMITIVES:
        t = t["type"]
    if t == "long":
        return _read_long(data, pos)
    if t in ("string", "bytes"):
        n, pos = _read_long(data, pos)
        if n < 0 or pos + n > len(data):
            raise _NotFast
        raw = data[pos:pos + n]
        return (raw.decode("utf-8") if t == "string" else raw), pos + n
    if t == "boolean":
        if data[pos] > 1:
            raise _NotFast
        return data[pos] == 1, pos + 1
    if isinstance(t, dict) and t.get("type") == "enum":
        k, pos = _read_long(data, pos)
        if not 0 <= k < len(t["symbols"]):
            raise _NotFast
        return t["symbols"][k], pos
    if isinstance(t, list) and len(t) == 2 and t[0] == "null":
        branch, pos = _read_long(data, pos)
        if branch == 0:
            return None, pos
        if branch != 1:
            raise _NotFast
        return _read_plain(t[1], data, pos)
    raise _NotFast


# -- keys and payloads ----------------------------------------------------------------


def encode_key(key: str) -> bytes:
    """Topic keys are plain UTF-8 (execution id, request id, control key), so that
    any client's partitioner puts them where ours does."""
    return key.encode("utf-8")


def decode_key(data: bytes | None) -> str:
    if data is None:
        raise DecodeError("expected a UTF-8 record key, found no key")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"expected a UTF-8 record key, found {bytes(data)[:32]!r}: {e}") from e


def dump_payload(obj: Any) -> bytes:
    """Compact UTF-8 JSON, keys in the caller's order (not sorted): the payload is
    the caller's document, passed to the engine as written, and nothing in
    sluicegate compares payload bytes. NaN and infinities are refused (not JSON)."""
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise EncodeError(f"payload is not JSON-serialisable: {e}") from e


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_payload(data: bytes) -> Any:
    try:
        return json.loads(bytes(data).decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DecodeError(f"expected a UTF-8 JSON payload, found {bytes(data)[:64]!r}: {e}") from e
