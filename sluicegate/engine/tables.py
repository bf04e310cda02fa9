"""A stage's state as named, typed tables (docs/decisions/typed-tables.md).

A stage declares its tables (`Stage.tables`): each a name, the key prefix its rows sit
under in the stage's store, and a codec for its keys and one for its values. The stage
reaches a table through its context (`ctx.table("queue")`) and reads and writes keys and
values, never bytes: the codecs are the only code that knows how a row is laid out, as
Kafka Streams names its stores in the topology and gives each its serdes.

The tables of a stage share its store and its changelog, each under its own prefix: a
changelog record's key is the table's prefix and the row's key. A table marked
`derived` is one whose rows are computed from the others' (counters, indexes): kept for
reads, never logged, made again at restore (docs/decisions/derived-rows.md).

Values are encoded by a codec of the stage's choosing: `Fields` (a compact struct of a
dataclass's fields, below), the project's Avro codec (given by the stage), or `RAW`.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, Union

from sluicegate.engine.held import HeldTable, Holder
from sluicegate.engine.store import StoreTransaction

V = TypeVar("V")
K = TypeVar("K")
R = TypeVar("R")


class Codec(Protocol[V]):
    """Bytes to a value and back. `decode(encode(v)) == v`."""

    def encode(self, value: V, /) -> bytes: ...
    def decode(self, raw: bytes, /) -> V: ...


class _Raw:
    """Bytes as they are."""

    def encode(self, value: bytes) -> bytes:
        return value

    def decode(self, raw: bytes) -> bytes:
        return raw


class _Text:
    """Text as UTF-8: its byte order is its code points' order, so a table keyed by text
    reads in text order."""

    def encode(self, value: str) -> bytes:
        return value.encode()

    def decode(self, raw: bytes) -> str:
        return raw.decode()


class _Integer:
    """A signed 64-bit integer, big-endian with its sign bit flipped: byte order is
    numeric order."""

    _S = struct.Struct(">Q")

    def encode(self, value: int) -> bytes:
        return self._S.pack(value + (1 << 63))

    def decode(self, raw: bytes) -> int:
        return int(self._S.unpack(raw)[0]) - (1 << 63)


class Decimal:
    """A non-negative integer as zero-padded decimal text of `width` digits: byte order is
    numeric order."""

    def __init__(self, width: int) -> None:
        self.width = width

    def encode(self, value: int) -> bytes:
        return str(value).encode().rjust(self.width, b"0")

    def decode(self, raw: bytes) -> int:
        return int(raw)


class Joined:
    """A key of several parts, each encoded by its codec, separated by 0x1f: read in order
    of its first part, then its second, as long as no part but the last holds a byte at or
    below the separator (text keys, hex, decimal)."""

    SEP = b"\x1f"

    def __init__(self, *parts: Codec[Any]) -> None:
        self.parts = parts

    def encode(self, value: tuple[Any, ...]) -> bytes:
        return self.SEP.join(c.encode(v) for c, v in zip(self.parts, value, strict=True))

    def decode(self, raw: bytes) -> tuple[Any, ...]:
        pieces = raw.split(self.SEP, len(self.parts) - 1)
        return tuple(c.decode(p) for c, p in zip(self.parts, pieces, strict=True))

    def head(self, *values: Any) -> bytes:
        """The encoded start of every key whose first parts are `values`: for `items`."""
        return b"".join(c.encode(v) + self.SEP for c, v in zip(self.parts, values, strict=False))


class Sized:
    """A key of two texts, the first preceded by its length (4 bytes), so that one first
    part's rows never start with another's: `head(first)` is where the rows of `first`
    start, read in order of the second part."""

    _LEN = struct.Struct(">I")

    def encode(self, value: tuple[str, str]) -> bytes:
        return self.head(value[0]) + value[1].encode()

    def decode(self, raw: bytes) -> tuple[str, str]:
        (size,) = self._LEN.unpack_from(raw)
        return raw[4:4 + size].decode(), raw[4 + size:].decode()

    @staticmethod
    @functools.lru_cache(maxsize=65_536)
    def head(first: str) -> bytes:
        raw = first.encode()
        return Sized._LEN.pack(len(raw)) + raw


class SizedText:
    """A text preceded by its length (4 bytes): the first part of a `Sized` key alone."""

    def encode(self, value: str) -> bytes:
        return SIZED.head(value)

    def decode(self, raw: bytes) -> str:
        return raw[4:].decode()


class Coded(Generic[R]):
    """A value of a class that codes itself: `value.encode()`, `cls.decode(raw)` (a binary
    layout of its own, such as a rate limit's window of admission times)."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls

    def encode(self, value: R) -> bytes:
        data: bytes = value.encode()  # type: ignore[attr-defined]
        return data

    def decode(self, raw: bytes) -> R:
        value: R = self.cls.decode(raw)
        return value


class Many(Generic[V]):
    """A tuple of values, each encoded by `item` and preceded by its length."""

    _LEN = struct.Struct(">I")

    def __init__(self, item: Codec[V]) -> None:
        self.item = item

    def encode(self, value: tuple[V, ...]) -> bytes:
        pack, encode = self._LEN.pack, self.item.encode
        parts = []
        for v in value:
            data = encode(v)
            parts.append(pack(len(data)))
            parts.append(data)
        return b"".join(parts)

    def decode(self, raw: bytes) -> tuple[V, ...]:
        unpack, decode = self._LEN.unpack_from, self.item.decode
        out = []
        at = 0
        while at < len(raw):
            (n,) = unpack(raw, at)
            at += 4
            out.append(decode(raw[at:at + n]))
            at += n
        return tuple(out)


RAW: Codec[bytes] = _Raw()
SIZED = Sized()
SIZED_TEXT = SizedText()
TEXT: Codec[str] = _Text()
INTEGER: Codec[int] = _Integer()
# The codecs a table calls as the built-in functions they amount to (no Python frame).
_FAST_ENCODE: dict[int, Callable[[Any], bytes]] = {id(RAW): bytes, id(TEXT): str.encode}
_FAST_DECODE: dict[int, Callable[[bytes], Any]] = {id(RAW): bytes, id(TEXT): bytes.decode}


# A `Fields` field's type: its struct format, or the codec of what follows the struct.
_IN_STRUCT: dict[Any, str] = {bool: "?", int: "q", float: "d"}
_AFTER_STRUCT: dict[Any, Codec[Any]] = {str: TEXT, bytes: RAW}


class Fields(Generic[R]):
    """A compact struct codec for a dataclass: its integer, boolean and float fields in one
    fixed-size struct, its text and bytes fields after it, each with its length in the
    struct, and a bit per optional field that is None. A field of another type is encoded
    by the codec given for it in `nested` (another `Fields`, the project's Avro codec).

    The first byte says the layout (`VERSION`). A row whose first byte is anything else
    was written before tables were typed; `legacy` decodes it, and `legacy_encode` writes
    rows that way while a deployment rolls from such a release
    (docs/decisions/typed-tables.md).
    """

    VERSION = 1
    # Written out per dataclass at construction (`_compile`).
    encode: Callable[[R], bytes]
    decode: Callable[[bytes], R]

    def __init__(self, cls: type[R], *, nested: dict[str, Codec[Any]] | None = None,
                 legacy: Callable[[bytes], R] | None = None,
                 legacy_encode: Callable[[R], bytes] | None = None) -> None:
        self.cls = cls
        self.legacy = legacy
        self.legacy_encode = legacy_encode
        nested = nested or {}
        hints = typing.get_type_hints(cls)
        self._names: list[str] = []
        # Per field: (kind, optional, codec); kind is "n" (in the struct) or "v" (after it).
        self._kinds: list[tuple[str, bool, Codec[Any] | None, str]] = []
        fixed = ">B"
        optional = 0
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            base, is_optional = _unwrap_optional(hint)
            if is_optional:
                optional += 1
            self._names.append(f.name)
            if f.name in nested:
                self._kinds.append(("v", is_optional, nested[f.name], ""))
                fixed += "I"
            elif base in _IN_STRUCT:
                self._kinds.append(("n", is_optional, None, _IN_STRUCT[base]))
                fixed += _IN_STRUCT[base]
            elif base in _AFTER_STRUCT:
                self._kinds.append(("v", is_optional, _AFTER_STRUCT[base], ""))
                fixed += "I"
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: a field of type {hint} needs a "
                                f"codec in `nested`")
        if optional > 64:
            raise TypeError(f"{cls.__name__}: more than 64 optional fields")
        # The None bits: as few bytes as the optional fields need.
        self._bitmap = "" if not optional else "BBHHIIIIQ"[(optional + 7) // 8]
        self._fixed = struct.Struct(fixed + self._bitmap)
        self.encode, self.decode = self._compile()

    @property
    def field_names(self) -> list[str]:
        return list(self._names)

    @property
    def kinds(self) -> list[str]:
        """Per field, its struct format ("q", "?", "d"), or "" for one after the struct."""
        return [fmt for _, _, _, fmt in self._kinds]

    def _compile(self) -> tuple[Callable[[R], bytes], Callable[[bytes], R]]:
        """An encoder and a decoder written out for this dataclass's fields (one struct
        call, no loop over the fields at each row: a row is read or written at every
        start through a stage)."""
        env: dict[str, Any] = {"_pack": self._fixed.pack, "_unpack": self._fixed.unpack_from,
                               "_size": self._fixed.size, "_cls": self.cls, "_self": self}
        enc = ["def encode(v):", "    nulls = 0"]
        numbers, tails = [str(self.VERSION)], []
        dec = ["def decode(raw):",
               f"    if not raw or raw[0] != {self.VERSION}:",
               "        return _self._old(raw)"]
        unpacked = ["_"]
        args = []
        bit = 1
        at_var = False
        for i, ((kind, optional, codec, _), name) in enumerate(
                zip(self._kinds, self._names, strict=True)):
            enc.append(f"    f{i} = v.{name}")
            if codec is TEXT:
                coder, reader = f"f{i}.encode()", "raw[at:end].decode()"
            elif codec is RAW:
                coder, reader = f"f{i}", "raw[at:end]"
            elif codec is not None:
                env[f"_e{i}"], env[f"_d{i}"] = codec.encode, codec.decode
                coder, reader = f"_e{i}(f{i})", f"_d{i}(raw[at:end])"
            if kind == "n":
                if optional:
                    enc.append(f"    if f{i} is None:\n        nulls |= {bit}\n        f{i} = 0")
                numbers.append(f"f{i}")
                unpacked.append(f"n{i}")
                args.append(f"None if nulls & {bit} else n{i}" if optional else f"n{i}")
            else:
                if optional:
                    enc.append(f"    if f{i} is None:\n        nulls |= {bit}\n        d{i} = b''"
                               f"\n    else:\n        d{i} = {coder}")
                else:
                    enc.append(f"    d{i} = {coder}")
                numbers.append(f"len(d{i})")
                tails.append(f"d{i}")
                unpacked.append(f"n{i}")
                if not at_var:
                    dec_at = ["    at = _size"]
                    at_var = True
                else:
                    dec_at = []
                read = f"None if nulls & {bit} else {reader}" if optional else reader
                dec.extend([*dec_at, f"    end = at + n{i}", f"    v{i} = {read}", "    at = end"])
                args.append(f"v{i}")
            if optional:
                bit <<= 1
        if self._bitmap:
            numbers.append("nulls")
            unpacked.append("nulls")
        else:
            dec.insert(3, "    nulls = 0")
        enc.append(f"    return _pack({', '.join(numbers)})"
                   + "".join(f" + {t}" for t in tails))
        dec.insert(3, f"    {', '.join(unpacked)}, = _unpack(raw)")
        dec.append(f"    return _cls({', '.join(args)})")
        exec(compile("\n".join(enc) + "\n\n" + "\n".join(dec), f"<fields {self.cls.__name__}>",
                     "exec"), env)
        return env["encode"], env["decode"]

    def _old(self, raw: bytes) -> R:
        if self.legacy is None:
            raise ValueError(f"not a {self.cls.__name__} row: {raw[:32]!r}")
        return self.legacy(raw)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


@dataclass(frozen=True, slots=True)
class TableSpec(Generic[K, V]):
    """A table a stage declares: its name, the prefix of its rows' keys in the stage's
    store (under STATE_PREFIX), and its codecs. `derived`: its rows are computed from the
    other tables' and made again at restore, never logged. `held`: derived, and a memory
    store holds its rows as the values written, not as rows (engine.held): for a table
    read by key only, whose rows are as few as the live runs (an ordered read of it sorts
    its keys). `values`: a logged table that a memory store keeps in a structure of its own
    (engine.held.Holder), made by `values(spec, undo log)`, its rows still logged: the
    queues, read in order at every start (docs/decisions/queues-held-as-values.md)."""

    name: str
    prefix: bytes
    key: Codec[K]
    value: Codec[V]
    derived: bool = False
    held: bool = False
    values: Callable[[TableSpec[Any, Any], list[Any]], Holder] | None = None

    def __post_init__(self) -> None:
        if self.held and not self.derived:
            raise ValueError(f"table {self.name}: only a derived table is held as values")
        if self.values is not None and (self.held or self.derived):
            raise ValueError(f"table {self.name}: a table in a structure of its own is logged")

    def row(self, key: K, value: V) -> tuple[bytes, bytes]:
        """The store row of (key, value): for a stage's `derive`, which returns rows."""
        return self.prefix + self.key.encode(key), self.value.encode(value)

    def read(self, store: StoreReader) -> Iterator[tuple[K, V]]:
        """Every row of the table in `store` (a restored one, for `derive`), in key order."""
        cut = len(self.prefix)
        decode_key, decode = self.key.decode, self.value.decode
        return ((decode_key(k[cut:]), decode(v)) for k, v in store.items(self.prefix))


class StoreReader(Protocol):
    """The reads a stage's `derive` makes of its restored store."""

    def get(self, key: bytes, /) -> bytes | None: ...
    def items(self, prefix: bytes, start: bytes | None = None,
              /) -> Iterator[tuple[bytes, bytes]]: ...


class StateTable(Generic[K, V]):
    """One table of one stage on one task, over the cycle's transaction. `legacy_rows`:
    values are written as a release before typed tables wrote them (a rolling upgrade:
    SLUICEGATE_LOG_DERIVED), when the value codec knows how."""

    __slots__ = ("_decode", "_delete", "_encode", "_get", "_key", "_key_decode", "_prefix",
                 "_put", "_tx", "name")

    def __init__(self, spec: TableSpec[K, V], tx: StoreTransaction,
                 legacy_rows: bool = False) -> None:
        self.name = spec.name
        self._tx = tx
        # Bound once: a table is read and written at every start through its stage.
        self._get, self._put, self._delete = tx.get, tx.put, tx.delete
        self._prefix = spec.prefix
        self._key = _FAST_ENCODE.get(id(spec.key), spec.key.encode)
        self._key_decode = _FAST_DECODE.get(id(spec.key), spec.key.decode)
        self._decode = _FAST_DECODE.get(id(spec.value), spec.value.decode)
        encode = _FAST_ENCODE.get(id(spec.value), spec.value.encode)
        if legacy_rows and getattr(spec.value, "legacy_encode", None) is not None:
            encode = spec.value.legacy_encode  # type: ignore[attr-defined]
        self._encode = encode

    def get(self, key: K) -> V | None:
        raw = self._get(self._prefix + self._key(key))
        return None if raw is None else self._decode(raw)

    def __contains__(self, key: K) -> bool:
        return self._get(self._prefix + self._key(key)) is not None

    def put(self, key: K, value: V) -> None:
        self._put(self._prefix + self._key(key), self._encode(value))

    def delete(self, key: K) -> None:
        self._delete(self._prefix + self._key(key))

    # The same, for a key encoded once by the caller (`encode_key`), who reads and writes
    # it in several tables that share its key codec.

    def encode_key(self, key: K) -> bytes:
        return self._key(key)

    def get_encoded(self, raw: bytes) -> V | None:
        found = self._get(self._prefix + raw)
        return None if found is None else self._decode(found)

    def has_encoded(self, raw: bytes) -> bool:
        return self._get(self._prefix + raw) is not None

    def put_encoded(self, raw: bytes, value: V) -> None:
        self._put(self._prefix + raw, self._encode(value))

    def delete_encoded(self, raw: bytes) -> None:
        self._delete(self._prefix + raw)

    def items(self, start: bytes = b"", after: bytes | None = None) -> Iterator[tuple[K, V]]:
        """Rows in key order whose encoded key starts with `start` (every row: b""), from
        the encoded key `after` on (inclusive) when given."""
        prefix = self._prefix + start
        cut = len(self._prefix)
        decode_key, decode = self._key_decode, self._decode
        rows = self._tx.items(prefix, None if after is None else self._prefix + after)
        return ((decode_key(k[cut:]), decode(v)) for k, v in rows)

    def keys(self, start: bytes = b"") -> Iterator[K]:
        cut = len(self._prefix)
        decode_key = self._key_decode
        return (decode_key(k[cut:]) for k, _ in self._tx.items(self._prefix + start))


class HeldStateTable(Generic[K, V]):
    """A held table (`TableSpec.held`) of a stage on a memory store: `StateTable`'s calls,
    over the values the store holds (engine.held.HeldTable) rather than the transaction's
    rows. A value put is kept as it is: the stages never change a value after writing it
    (they write a changed copy)."""

    __slots__ = ("_delete", "_key", "_key_decode", "_put", "_rows", "_table", "name")

    def __init__(self, spec: TableSpec[K, V], table: HeldTable) -> None:
        self.name = spec.name
        self._table = table
        self._rows = table.rows
        self._put, self._delete = table.put, table.delete
        self._key = _FAST_ENCODE.get(id(spec.key), spec.key.encode)
        self._key_decode = _FAST_DECODE.get(id(spec.key), spec.key.decode)

    def get(self, key: K) -> V | None:
        value: V | None = self._rows.get(self._key(key))
        return value

    def __contains__(self, key: K) -> bool:
        return self._key(key) in self._rows

    def put(self, key: K, value: V) -> None:
        self._put(self._key(key), value)

    def delete(self, key: K) -> None:
        self._delete(self._key(key))

    def encode_key(self, key: K) -> bytes:
        return self._key(key)

    def get_encoded(self, raw: bytes) -> V | None:
        value: V | None = self._rows.get(raw)
        return value

    def has_encoded(self, raw: bytes) -> bool:
        return raw in self._rows

    def put_encoded(self, raw: bytes, value: V) -> None:
        self._put(raw, value)

    def delete_encoded(self, raw: bytes) -> None:
        self._delete(raw)

    def items(self, start: bytes = b"", after: bytes | None = None) -> Iterator[tuple[K, V]]:
        decode_key = self._key_decode
        return ((decode_key(k), v) for k, v in self._table.ordered(start, after))

    def keys(self, start: bytes = b"") -> Iterator[K]:
        decode_key = self._key_decode
        return (decode_key(k) for k, _ in self._table.ordered(start))


def derived_prefixes(*specs: TableSpec[Any, Any]) -> tuple[bytes, ...]:
    """The key prefixes of the derived tables among `specs` (a stage's `derived`)."""
    return tuple(spec.prefix for spec in specs if spec.derived)


class Floors:
    """Per prefix, a key below which the prefix has no row: where an ordered read of an
    index deleted from its front (timers, a queue) starts, so the rows deleted before it
    (in this cycle, or tombstones in RocksDB) are not stepped over again. The prefix itself
    when none is known. Kept in the transaction's cache for `owner`
    (`StoreTransaction.cache`): a commit keeps them, any other change of the view drops
    them (docs/decisions/store-buffer-index.md).

    The one writer of a prefix's rows keeps its floor true: it raises the floor past a row
    it deletes at the floor, and lowers it to a row it puts below it."""

    __slots__ = ("_owner", "_tx")

    # Floors kept per owner at most (one per queue or index read in order): a floor
    # forgotten only costs its next read a longer walk.
    MAX = 65_536

    def __init__(self, tx: StoreTransaction, owner: str) -> None:
        self._tx = tx
        self._owner = owner

    def floor(self, prefix: bytes) -> bytes:
        floor: bytes = self._tx.cache(self._owner).get(prefix, prefix)
        return floor

    def set_floor(self, prefix: bytes, key: bytes) -> None:
        """Declare that `prefix` has no row below `key`."""
        floors = self._tx.cache(self._owner)
        if len(floors) >= self.MAX and prefix not in floors:
            floors.clear()
        floors[prefix] = key

    def put(self, prefix: bytes, row: bytes, value: bytes) -> None:
        """Put a row of the prefix, lowering its floor to it when it goes below."""
        tx = self._tx
        tx.put(row, value)
        floors = tx.cache(self._owner)
        if row < floors.get(prefix, prefix):
            floors[prefix] = row

    def first(self, prefix: bytes) -> bytes | None:
        """The prefix's first row, read from its floor (which it raises to that row)."""
        floor = self.floor(prefix)
        for row, _ in self._tx.items(prefix, floor):
            if row != floor:
                self.set_floor(prefix, row)
            return row
        return None

    def holds(self) -> list[str]:
        """What is wrong with the floors (none: empty): a prefix with a row below its
        floor. For tests and debugging: it reads every row of every prefix."""
        problems = []
        for prefix, floor in self._tx.cache(self._owner).items():
            first = next(iter(self._tx.items(prefix)), None)
            if first is not None and first[0] < floor:
                problems.append(f"{self._owner}: {prefix!r} has row {first[0]!r} below its "
                                f"floor {floor!r}")
        return problems
