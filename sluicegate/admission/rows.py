"""The codecs admission's tables use beside the engine's own (`engine.tables`): a record of
the project's Avro schemas as a table value, and the rows as releases before typed tables
wrote them.

Those releases wrote a stage's rows as text, its fields joined by 0x1f. A worker of this
release reads such rows wherever it meets them (a changelog of the release before, which
it restores when it takes a partition over), and writes them so while a deployment rolls
from that release (SLUICEGATE_LOG_DERIVED=1), so that a worker of the old release taking
a partition back reads what it finds (docs/decisions/typed-tables.md). These functions
are the only code that knows the old layout; they go once no deployment can roll from a
release before typed tables.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from sluicegate.engine.tables import Fields, Many
from sluicegate.schemas import codec
from sluicegate.schemas.records import PendingStart, Record

R = TypeVar("R")
A = TypeVar("A", bound=Record)

_SEP = "\x1f"


class Avro(Generic[A]):
    """A record of the project's Avro schemas (`schemas/avro`), encoded by its codec."""

    def __init__(self, cls: type[A]) -> None:
        self.cls = cls

    def encode(self, value: A) -> bytes:
        return codec.encode(value)

    def decode(self, raw: bytes) -> A:
        return codec.decode(self.cls, raw)


def text_fields(cls: type[R], *, nested: dict[str, Any] | None = None,
                parse: Sequence[Callable[[str], Any]] | None = None) -> Fields[R]:
    """A `Fields` codec for `cls` that also reads and (rolling) writes its rows as the
    releases before wrote them: each field as text (None as nothing), joined by 0x1f, in
    the dataclass's order. `parse`: per field, how its text is read (int by default for
    an integer field, the text itself for a text field)."""
    fields = Fields(cls, nested=nested)
    names = fields.field_names
    parsers = list(parse) if parse is not None else [_parser(kind) for kind in fields.kinds]

    def legacy(raw: bytes) -> R:
        parts = raw.decode().split(_SEP)
        if len(parts) != len(names):
            raise ValueError(f"not a {cls.__name__} row of a release before: {raw[:64]!r}")
        return cls(*(p(t) for p, t in zip(parsers, parts, strict=True)))

    def legacy_encode(value: R) -> bytes:
        return _SEP.join("" if v is None else str(v)
                         for v in (getattr(value, n) for n in names)).encode()

    fields.legacy = legacy
    fields.legacy_encode = legacy_encode
    return fields


def _parser(kind: str) -> Callable[[str], Any]:
    if kind == "q":
        return optional_int
    if kind == "?":
        return lambda text: text == "True"
    return lambda text: text


def optional_int(text: str) -> int | None:
    return int(text) if text else None


def optional_text(text: str) -> str | None:
    return text or None


def burst_fields(cls: type[R]) -> Fields[R]:
    """A debounce burst (last arrival, timer, rank, the carrier start): the releases
    before wrote `last \\x1f wake \\x1f rank as hex \\x1f` and the carrier's Avro record."""
    fields = Fields(cls, nested={"carrier": Avro(PendingStart)})

    def legacy(raw: bytes) -> R:
        last, wake, rank, carrier = raw.split(b"\x1f", 3)
        return cls(int(last), int(wake), bytes.fromhex(rank.decode()),  # type: ignore[call-arg]
                   codec.decode(PendingStart, carrier))

    def legacy_encode(row: Any) -> bytes:
        return (f"{row.last_ms}\x1f{row.wake_ms}\x1f{row.rank.hex()}\x1f".encode()
                + codec.encode(row.carrier))

    fields.legacy, fields.legacy_encode = legacy, legacy_encode
    return fields


def batch_header_fields(cls: type[R], batch: type[Any]) -> Fields[R]:
    """A batch key's header (its open batch, timer, rank and field): the releases before
    wrote `execution id \\x1f first \\x1f count \\x1f size \\x1f wake \\x1f rank as hex \\x1f
    last \\x1f field` (the last two missing from a header written before windows of
    events: a batch's, its last arrival unknown)."""
    fields = Fields(cls, nested={"batch": Fields(batch)})

    def legacy(raw: bytes) -> R:
        execution_id, first, count, size, wake, rank, *more = raw.decode().split(_SEP)
        last, field = (int(more[0]), more[1].encode()) if more else (int(first), b"items")
        return cls(batch(execution_id, int(first), int(count), int(size), last),  # type: ignore[call-arg]
                   int(wake), bytes.fromhex(rank), field)

    def legacy_encode(row: Any) -> bytes:
        b = row.batch
        return _SEP.join(str(v) for v in (
            b.execution_id, b.first_ms, b.count, b.size, row.wake_ms, row.rank.hex(),
            b.last_ms, row.field.decode())).encode()

    fields.legacy, fields.legacy_encode = legacy, legacy_encode
    return fields


def legacy(fields: Fields[R], decode: Callable[[list[str]], R],
           encode: Callable[[R], Sequence[Any]]) -> Fields[R]:
    """`fields`, also reading and (rolling) writing rows as the releases before did: the
    text of `encode(row)`'s values (None as nothing) joined by 0x1f, read back by `decode`
    from the texts."""

    def read(raw: bytes) -> R:
        return decode(raw.decode().split(_SEP))

    def write(row: R) -> bytes:
        return _SEP.join("" if v is None else str(v) for v in encode(row)).encode()

    fields.legacy, fields.legacy_encode = read, write
    return fields


def hold_fields(cls: type[R], claim: type[Any]) -> Fields[R]:
    """A singleton key's hold (its holder, the claims waiting, the next sequence number):
    the releases before wrote `next \\x1f holder's seq \\x1f holder's execution id` (both
    empty without one), then each claim's seq and execution id, joined by 0x1f; and the
    ones before those a JSON object."""
    fields = Fields(cls, nested={"holder": Fields(claim), "claims": Many(Fields(claim))})

    def read(raw: bytes) -> R:
        if raw[:1] == b"{":
            row = json.loads(raw)
            holder = None if row["holder"] is None else claim(*row["holder"])
            return cls(holder, tuple(claim(*c) for c in row["claims"]),  # type: ignore[call-arg]
                       row["next"])
        parts = raw.decode().split(_SEP)
        holder = claim(parts[2], int(parts[1])) if parts[1] else None
        claims = tuple(claim(parts[at + 1], int(parts[at])) for at in range(3, len(parts), 2))
        return cls(holder, claims, int(parts[0]))  # type: ignore[call-arg]

    def write(row: Any) -> bytes:
        holder = row.holder
        parts = [str(row.next_seq), "", ""] if holder is None else [
            str(row.next_seq), str(holder.seq), holder.execution_id]
        for c in row.claims:
            parts += (str(c.seq), c.execution_id)
        return _SEP.join(parts).encode()

    fields.legacy, fields.legacy_encode = read, write
    return fields
