"""A memory store's derived tables and derived timers held as values, beside its rows
(docs/decisions/derived-state-held-as-values.md), and the logged tables a stage keeps in a
structure of its own there (`TableSpec.values`: the queues,
docs/decisions/queues-held-as-values.md).

A derived row (a run's backstop, a slot holder made from a run's row, a lease's timer) is
never logged and is made again at every restore: in a memory store it has no reason to be
bytes. A table marked `held` (`TableSpec.held`) keeps its rows here as the values the
stage wrote, in a dict by encoded key, and the stage's derived timers are kept in a heap:
a read is a dict lookup, a write a dict store and an entry in an undo log, with no codec,
no transaction buffer, no commit write and no merge into the packed blocks.

The undo log is the transaction's: what a cycle wrote is kept when it commits and undone
when it aborts (or when a new transaction starts over a store whose last one neither
committed nor aborted: a worker's crash, as the test driver plays it). Bytes still reach
these rows through the store's own `get`, `items` and `write` (a restore's `derive`, a
test), encoded and decoded by the table's codecs there.

A logged table held so (`Holder`) is written the same way, at once and undone with the
rest; its rows still go to the changelog, through the transaction (`StoreTransaction.log`),
and a restore's replay writes them here (`write_row`).

A RocksDB store keeps these rows as rows: its derived rows outlive the process and are
not made again when it is reopened, so they are kept where it reads them.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from sluicegate.engine.timerkeys import (
    DERIVED_TIMER_PREFIX,
    check_due,
    parse_timer_key,
    timer_key,
)

if TYPE_CHECKING:
    from sluicegate.engine.tables import TableSpec

_ABSENT: Any = object()
# How many of a key's first bytes name its table (0x00, 'S' and the table's letter).
_FAMILY = 3
# A heap of timers is compacted once it holds this many entries more than twice its live
# timers (a timer cancelled stays in the heap until it comes to the top, or until then).
_COMPACT_SLACK = 1024


class Holder(Protocol):
    """What holds one table's rows in a memory store as values (a `HeldTable`, or a
    logged table's own structure, `TableSpec.values`): the store reads and writes its rows
    as bytes through it, and an aborted transaction's writes are undone by it, last first
    (`undo`, given each entry it put in the undo log as (itself, at, old))."""

    prefix: bytes

    def __len__(self) -> int: ...
    def get_row(self, key: bytes) -> bytes | None: ...
    def items(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]: ...
    def write_row(self, key: bytes, value: bytes | None) -> None: ...
    def undo(self, at: Any, old: Any) -> None: ...
    def keep(self) -> None: ...
    def clear(self) -> None: ...


class HeldTable:
    """One derived table's rows as values, by encoded key (without the table's prefix)."""

    __slots__ = ("_undo", "prefix", "rows", "spec")

    def __init__(self, spec: TableSpec[Any, Any], undo: list[Any]) -> None:
        self.spec = spec
        self.prefix = spec.prefix
        self.rows: dict[bytes, Any] = {}
        self._undo = undo

    def put(self, raw: bytes, value: Any) -> None:
        rows = self.rows
        self._undo.append((rows, raw, rows.get(raw, _ABSENT)))
        rows[raw] = value

    def delete(self, raw: bytes) -> None:
        old = self.rows.pop(raw, _ABSENT)
        if old is not _ABSENT:
            self._undo.append((self.rows, raw, old))

    def __len__(self) -> int:
        return len(self.rows)

    def undo(self, at: Any, old: Any) -> None:
        # Its undo entries are (its rows, key, old value): `Held.rollback` undoes them.
        raise AssertionError("a held table's writes are undone by Held.rollback")

    def keep(self) -> None:
        pass

    def clear(self) -> None:
        self.rows.clear()

    def ordered(self, start: bytes = b"", after: bytes | None = None
                ) -> Iterator[tuple[bytes, Any]]:
        """Rows in key order whose key starts with `start`, from `after` (inclusive) on. A
        sort of the matching keys: for the rare ordered read of a derived table (a test,
        an inspection), not for a start's path."""
        keys = sorted(k for k in self.rows if k.startswith(start))
        if after is not None:
            keys = keys[bisect_left(keys, after):]
        rows = self.rows
        return ((k, rows[k]) for k in keys if k in rows)

    # -- as bytes, for the store's own reads and writes ------------------------------

    def get_row(self, key: bytes) -> bytes | None:
        value = self.rows.get(key[len(self.prefix):], _ABSENT)
        return None if value is _ABSENT else self.spec.value.encode(value)

    def items(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows under `prefix` from `start` on, as the store's rows, in key order."""
        mine, encode = self.prefix, self.spec.value.encode
        own = prefix[len(mine):] if prefix.startswith(mine) else b""
        rows = ((mine + k, v) for k, v in self.ordered(own))
        return ((k, encode(v)) for k, v in rows if k >= start and k.startswith(prefix))

    def write_row(self, key: bytes, value: bytes | None) -> None:
        """A row written to the store (a restore's): not undone. One that does not decode
        (a changelog of a release that logged its derived rows in a layout this one no
        longer reads) is left out: the restore's rebuild makes every derived row again."""
        raw = key[len(self.prefix):]
        if value is None:
            self.rows.pop(raw, None)
            return
        try:
            self.rows[raw] = self.spec.value.decode(value)
        except Exception:  # any codec's own error: the row is derived, and made again
            self.rows.pop(raw, None)


class HeldTimers:
    """A stage's derived timers on one memory store: (due, key) -> value, and a heap of
    the (due, key) pairs for the earliest. The same calls as `engine.timers.TimerIndex`."""

    __slots__ = ("_heap", "_live", "_undo")

    def __init__(self, undo: list[Any]) -> None:
        self._live: dict[tuple[int, bytes], bytes] = {}
        # Every live timer, and cancelled ones not yet popped (or compacted away).
        self._heap: list[tuple[int, bytes]] = []
        self._undo = undo

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, due_ms: int, key: bytes, value: bytes = b"") -> None:
        check_due(due_ms)
        at = (due_ms, key)
        live = self._live
        old = live.get(at, _ABSENT)
        self._undo.append((self, at, old))
        if old is _ABSENT:
            heapq.heappush(self._heap, at)
        live[at] = value

    def cancel(self, due_ms: int, key: bytes) -> None:
        at = (due_ms, key)
        old = self._live.pop(at, _ABSENT)
        if old is _ABSENT:
            return
        self._undo.append((self, at, old))
        heap = self._heap
        if len(heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._heap = list(self._live)
            heapq.heapify(self._heap)

    def undo(self, at: tuple[int, bytes], old: Any) -> None:
        """One write of this transaction undone: the timer `at` as it was (`old` its value,
        or absent), back in the heap if an undone cancel makes it live again."""
        live = self._live
        if old is _ABSENT:
            live.pop(at, None)
            return
        if at not in live:
            heapq.heappush(self._heap, at)
        live[at] = old

    def clear(self) -> None:
        self._live.clear()
        self._heap.clear()

    def due(self, now_ms: int, limit: int = 1000) -> list[tuple[int, bytes, bytes]]:
        """Timers due at or before `now_ms`, earliest first; the caller cancels each it
        handles."""
        heap, live = self._heap, self._live
        taken: list[tuple[int, bytes]] = []
        fired: list[tuple[int, bytes, bytes]] = []
        while heap and heap[0][0] <= now_ms and len(fired) < limit:
            at = heapq.heappop(heap)
            if at in live and (not taken or taken[-1] != at):
                taken.append(at)
                fired.append((at[0], at[1], live[at]))
        for at in taken:
            heapq.heappush(heap, at)
        return fired

    @property
    def next_due(self) -> int | None:
        heap, live = self._heap, self._live
        while heap and heap[0] not in live:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def reload(self) -> None:
        pass

    def rebind(self, tx: object) -> None:
        pass

    # -- as rows, for the store's own reads and writes -------------------------------

    def get_row(self, key: bytes) -> bytes | None:
        return self._live.get(parse_timer_key(key, DERIVED_TIMER_PREFIX))

    def items(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The timers under `prefix` from `start` on, as the store's rows, in key order."""
        rows = sorted((timer_key(due, key, DERIVED_TIMER_PREFIX), value)
                      for (due, key), value in self._live.items())
        return (row for row in rows if row[0] >= start and row[0].startswith(prefix))

    def write_row(self, key: bytes, value: bytes | None) -> None:
        at = parse_timer_key(key, DERIVED_TIMER_PREFIX)
        if value is None:
            self._live.pop(at, None)
        else:
            if at not in self._live:
                heapq.heappush(self._heap, at)
            self._live[at] = value


class Held:
    """What a memory store holds as values: its held tables by prefix, its derived timers,
    and the undo log of the transaction writing them."""

    __slots__ = (
        "_keepers",
        "_short",
        "_under",
        "_undo",
        "active",
        "families",
        "short",
        "tables",
        "timers",
    )

    def __init__(self) -> None:
        self._undo: list[Any] = []
        self.tables: dict[bytes, Holder] = {}
        # The tables by their prefix's first `_FAMILY` bytes, and those of a shorter prefix
        # or of a family another table took first.
        self.families: dict[bytes, Holder] = {}
        self._short: list[Holder] = []
        # The logged tables' holders, told when a transaction commits (`keep`).
        self._keepers: list[Holder] = []
        # `under`'s answers by prefix (the stores' ordered reads ask it at every read):
        # dropped when a table or the timers join.
        self._under: dict[bytes, list[Holder | HeldTimers]] = {}
        self.timers: HeldTimers | None = None
        # Whether anything is held: a store of a stage with no held table asks no more.
        self.active = False
        # Only a key whose first `_FAMILY` bytes are among `families`, or that starts with
        # one of `short` (the timers' prefix, a table's shorter than that), can be held:
        # the store asks `holder` about no other, so a miss of a row it keeps (a run's
        # row, a spent key) costs no call here.
        self.short: tuple[bytes, ...] = ()

    def table(self, spec: TableSpec[Any, Any]) -> Holder:
        found = self.tables.get(spec.prefix)
        if found is None:
            if spec.values is not None:
                found = spec.values(spec, self._undo)
                self._keepers.append(found)
            else:
                found = HeldTable(spec, self._undo)
            self.tables[spec.prefix] = found
            self._under.clear()
            family = spec.prefix[:_FAMILY]
            if len(spec.prefix) < _FAMILY:
                self._short.append(found)
                self.short += (spec.prefix,)
            elif family in self.families:
                self._short.append(found)
            else:
                self.families[family] = found
            self.active = True
        return found

    def held_timers(self) -> HeldTimers:
        if self.timers is None:
            self.timers = HeldTimers(self._undo)
            self._under.clear()
            self.short += (DERIVED_TIMER_PREFIX,)
            self.active = True
        return self.timers

    @property
    def writing(self) -> bool:
        """Whether the transaction wrote here since it last committed or aborted."""
        return bool(self._undo)

    def count(self) -> int:
        """The rows held, timers included."""
        return (sum(len(t) for t in self.tables.values())
                + (len(self.timers) if self.timers is not None else 0))

    def under(self, prefix: bytes) -> list[Holder | HeldTimers]:
        """What holds rows whose keys may start with `prefix`."""
        found = self._under.get(prefix)
        if found is None:
            found = [t for p, t in self.tables.items()
                     if p.startswith(prefix) or prefix.startswith(p)]
            if self.timers is not None and (DERIVED_TIMER_PREFIX.startswith(prefix)
                                            or prefix.startswith(DERIVED_TIMER_PREFIX)):
                found.append(self.timers)
            if len(self._under) >= 4096:
                self._under.clear()
            self._under[prefix] = found
        return found

    def holder(self, key: bytes) -> Holder | HeldTimers | None:
        """Which of these holds the row of `key`, if any: asked at a miss of the store's
        reads of a key that may be held (`families`, `short`), so first by the key's first
        `_FAMILY` bytes (a table's prefix)."""
        found = self.families.get(key[:_FAMILY])
        if found is not None and key.startswith(found.prefix):
            return found
        if key.startswith(DERIVED_TIMER_PREFIX):
            return self.timers
        for table in self._short:
            if key.startswith(table.prefix):
                return table
        return None

    def keep(self) -> None:
        """The transaction committed: what it wrote stays."""
        self._undo.clear()
        for holder in self._keepers:
            holder.keep()

    def rollback(self) -> None:
        """The transaction aborted (or never ended): what it wrote is undone, last first."""
        undo = self._undo
        for rows, at, old in reversed(undo):
            if type(rows) is not dict:
                rows.undo(at, old)  # the timers, a logged table's holder
            elif old is _ABSENT:
                rows.pop(at, None)
            else:
                rows[at] = old
        undo.clear()

    def clear(self) -> None:
        self._undo.clear()
        for table in self.tables.values():
            table.clear()
        if self.timers is not None:
            self.timers.clear()
