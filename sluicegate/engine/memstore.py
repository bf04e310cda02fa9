"""Per-partition state in memory: the working copy in a dict of the rows written recently
and sorted blocks of packed rows, the changelog the only durable copy.

Nothing is kept on disk, so nothing can be stale: a task's store starts empty at every
assignment and is filled by replaying its logs (as Kafka Streams' in-memory stores are).
It answers every read a `PartitionStore` answers, the same way, so stages and the
runtime cannot tell the two apart (docs/decisions/state-backends.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Self

from sortedcontainers import SortedList

from sluicegate.engine.allocator import give_back_free_memory
from sluicegate.engine.held import Held
from sluicegate.engine.packed import BLOCK_ROWS, Packed

_NO_OFFSET = -1
# A store's recent rows are merged into its packed blocks once they are this many and at
# least a sixteenth as many as the packed rows (MemoryStore).
_PACK_AT = 32768
_PACK_SHARE = 16
# Keys whose packed row (or its absence) a store remembers at most (MemoryStore._seen).
_SEEN_AT = 4096
# Packed rows a merge makes again past which the memory it freed is handed back.
_TRIM_AFTER = 65536
# How many of a key's first bytes name the table it belongs to (0x00, 'S' and a stage
# table's letter; 0x00, 'T' or 't' and a timer's first byte): the keys of a table are
# indexed in order only when a read in order may need them.
_FAMILY = 3
_ABSENT = object()
_END: tuple[None, None] = (None, None)


class LogOffsets:
    """What a store holds of its logs: the offset of the last changelog record it reflects,
    and per published table the offset of the last record of the table's topic (each -1
    if none). Both backends keep them so."""

    _offset: int
    _tables: dict[str, int]

    @property
    def changelog_offset(self) -> int:
        """Offset of the last changelog record reflected in the store; -1 if none."""
        return self._offset

    def table_offset(self, table: str) -> int:
        """Offset of the last record of a published table's topic reflected here; -1 if none."""
        return self._tables.get(table, _NO_OFFSET)

    @property
    def holds_rows(self) -> bool:
        """Whether anything was ever written here (an offset of some log)."""
        return self._offset != _NO_OFFSET or any(o != _NO_OFFSET for o in self._tables.values())


class MemoryStore(LogOffsets):
    """The rows of one (stage, partition) in memory. `synced_at_ms` is always None and
    `mark_synced` does nothing: there is no copy that outlives the process to prove.

    Two tiers (docs/decisions/packed-memory-rows.md): the rows written recently in a dict
    (a delete of a packed row there is a None that hides it), and the rest packed into sorted
    blocks (`engine.packed.Packed`), a few bytes a row over its key and value. The dict is
    merged into the blocks in bulk once it holds `_PACK_AT` rows and a sixteenth as many
    as the blocks, so a row is rewritten a bounded number of times however many there
    are; a store smaller than that packs nothing and works as a dict and a sorted list."""

    persistent = False

    def __init__(self, pack_at: int = _PACK_AT, block_rows: int = BLOCK_ROWS) -> None:
        self._pack_at = pack_at
        self._block_rows = block_rows
        # The recent rows; None for a packed row deleted since the last merge.
        self._rows: dict[bytes, bytes | None] = {}
        # The recent keys in order, for reads by prefix (queues, timers), but for the keys
        # not read in order since they were written: those wait in `_unsorted`, by their
        # first `_FAMILY` bytes (their table), and join it at the next ordered read of a
        # prefix that may hold them. The rows only ever read by key (a run's row, a count,
        # a holder) are never put in order one by one.
        self._keys = SortedList()
        self._unsorted: dict[bytes, set[bytes]] = {}
        self._packed = Packed(block_rows, _FAMILY)
        # What reads found in the packed rows since the last merge (None: not there), up
        # to `_SEEN_AT` keys: the rows read at every start and seldom written (a lane's
        # marker, a key's counters) and the keys just looked for and not found (about to
        # be put) are not searched for in the blocks again and again.
        self._seen: dict[bytes, bytes | None] = {}
        # The recent keys known not to be packed (nothing was, or a read found none): a
        # delete of one drops it rather than leaving a None to hide a packed row.
        self._fresh: set[bytes] = set()
        self._offset = _NO_OFFSET
        self._tables: dict[str, int] = {}
        self._closed = False
        # Bumped by every write and wipe, so anything caching a view of the store (the
        # timer index, a transaction's floors and memos) can tell it changed.
        self.revision = 0
        # The derived tables and timers held as values (engine.held), once a task says
        # which: their rows are never in `_rows` or the blocks.
        self.held = Held()

    @property
    def synced_at_ms(self) -> int | None:
        return None

    def mark_synced(self, at_ms: int) -> None:
        pass

    def __len__(self) -> int:
        packed = self._packed
        count = len(packed) + self.held.count()
        for key, value in self._rows.items():
            count += (value is not None) - (packed.get(key) is not None)
        return count

    def get(self, key: bytes) -> bytes | None:
        value = self._rows.get(key, _ABSENT)
        if value is _ABSENT:
            found = self._packed_get(key) if self._packed.count else None
            held = self.held
            if found is None and held.active and (key[:_FAMILY] in held.families or (
                    held.short and key.startswith(held.short))):
                holder = held.holder(key)
                return None if holder is None else holder.get_row(key)
            return found
        return value  # type: ignore[return-value]

    def _packed_get(self, key: bytes) -> bytes | None:
        """The packed row of `key` (not the recent one), through `_seen`; asked only of a
        store with rows packed."""
        seen = self._seen
        value = seen.get(key, _ABSENT)
        if value is _ABSENT:
            if len(seen) >= _SEEN_AT:
                seen = self._seen = {}
            value = seen[key] = self._packed.get(key)
        return value  # type: ignore[return-value]

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Rows whose key starts with `prefix`, ascending, from `start` (inclusive). The
        store is written only at a commit or a restore, not while a cycle reads it; an
        iteration that outlives a write goes on from its last row over the rows as they
        are then (a RocksDB store's keeps the rows as of the call)."""
        if self._closed:
            raise RuntimeError("store is closed")
        from_key = prefix if start is None or start < prefix else start
        walk = self._walk(prefix, from_key)
        if self.held.active:
            held = self.held.under(prefix)
            if held:
                return heapq.merge(walk, *(h.items(prefix, from_key) for h in held))
        return walk

    def _sorted(self, prefix: bytes) -> SortedList:
        """The recent keys in order, those `prefix` may hold written since included."""
        unsorted = self._unsorted
        if unsorted:
            if len(prefix) >= _FAMILY:
                keys = unsorted.pop(prefix[:_FAMILY], None)
                if keys:
                    self._keys.update(keys)
            else:
                for family in [f for f in unsorted if f.startswith(prefix)]:
                    self._keys.update(unsorted.pop(family))
        return self._keys

    def _walk(self, prefix: bytes, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
        revision = self.revision
        after = False
        while not self._packed.count:
            # Nothing packed (a store of fewer than `_PACK_AT` rows): the recent rows only.
            keys = self._sorted(prefix).irange(from_key, inclusive=(not after, True))
            for key in keys:
                if not key.startswith(prefix):
                    return
                value = self._rows[key]
                if value is None:
                    continue  # a delete of a row packed before, left by a merge of deletes
                yield key, value
                if self.revision != revision:
                    revision = self.revision
                    from_key, after = key, True
                    break
            else:
                return
        while True:
            # The recent rows and the packed ones merged; a recent one (or its delete)
            # wins over a packed one of the same key.
            recent = self._sorted(prefix).irange(from_key, inclusive=(not after, True))
            packed = self._packed.rows(from_key, after)
            rows = self._rows
            rkey = next(recent, None)
            pkey, pvalue = next(packed, _END)
            while True:
                if rkey is not None and (pkey is None or rkey <= pkey):
                    key, value = rkey, rows[rkey]
                    if pkey == rkey:
                        pkey, pvalue = next(packed, _END)
                    rkey = next(recent, None)
                elif pkey is not None:
                    key, value = pkey, pvalue
                    pkey, pvalue = next(packed, _END)
                else:
                    return
                if not key.startswith(prefix):
                    return
                if value is None:
                    continue
                yield key, value
                if self.revision != revision:
                    # Written meanwhile: go on from this row over the rows as they are now.
                    revision = self.revision
                    from_key, after = key, True
                    break

    def write(self, changes: Mapping[bytes, bytes | None], changelog_offset: int | None,
              tables: Mapping[str, int] | None = None, synced: bool = False) -> None:
        """Apply puts and deletes (None), and record the offsets they bring the logs to."""
        if self._closed:
            raise RuntimeError("store is closed")
        if changelog_offset is not None and changelog_offset < self._offset:
            raise ValueError(f"store already reflects changelog offset {self._offset}; "
                             f"refusing to move it back to {changelog_offset}")
        for table, offset in (tables or {}).items():
            if offset < self.table_offset(table):
                raise ValueError(f"store already reflects table {table} offset "
                                 f"{self.table_offset(table)}; refusing to move it back to "
                                 f"{offset}")
        rows = self._rows
        unsorted = self._unsorted
        fresh = self._fresh
        seen = self._seen
        nothing_packed = not self._packed.count
        held_values = self.held if self.held.active else None
        families, short = self.held.families, self.held.short
        for key, value in changes.items():
            if held_values is not None and (key[:_FAMILY] in families
                                            or (short and key.startswith(short))):
                held = held_values.holder(key)
                if held is not None:
                    held.write_row(key, value)
                    continue
            if value is None:
                if nothing_packed:
                    # As when nothing is packed (a store of fewer than `_PACK_AT` rows).
                    if rows.pop(key, _ABSENT) is not _ABSENT:
                        self._unindex(key)
                    continue
                if key in fresh:
                    # Not packed: the row goes for good (a row put and deleted between two
                    # merges, a holder's or a waiting start's, never reaches the blocks).
                    fresh.discard(key)
                    del rows[key]
                    self._unindex(key)
                    continue
                # Maybe packed (finding out would cost a search): a None that hides it
                # until the next merge, which drops it.
            elif not nothing_packed and key not in rows and seen.get(key, _ABSENT) is None:
                fresh.add(key)
            if key not in rows:
                family = unsorted.get(key[:_FAMILY])
                if family is None:
                    unsorted[key[:_FAMILY]] = {key}
                else:
                    family.add(key)
            rows[key] = value
        # The rows of a commit's write are the likeliest to be read by the next cycles:
        # they stay recent at a merge, but for a write as large as a merge (a restore's
        # derived rows, written at once).
        keep = changes if len(changes) * 2 <= self._pack_at else {}
        older = len(rows) - len(keep)
        if older >= self._pack_at and older * _PACK_SHARE >= self._packed.count:
            self._pack(keep)
        if changelog_offset is not None:
            self._offset = changelog_offset
        if tables:
            self._tables.update(tables)
        self.revision += 1

    def _unindex(self, key: bytes) -> None:
        """A recent key whose row went for good leaves the index of the recent keys."""
        family = self._unsorted.get(key[:_FAMILY])
        if family is not None and key in family:
            family.discard(key)
        else:
            self._keys.remove(key)

    def _pack(self, keep: Mapping[bytes, bytes | None]) -> None:
        """Merge the recent rows (and deletes) into the packed blocks, but for those of
        `keep`, the write just made."""
        rows = self._rows
        kept = {key: rows[key] for key in keep if key in rows}
        # The recent keys in order: a sort of them all (in C) rather than the keys not read
        # in order yet joining the sorted list one by one.
        remade = self._packed.merge([(key, rows[key]) for key in sorted(rows)
                                     if key not in kept])
        if remade >= _TRIM_AFTER:
            # The old blocks freed are mostly kept by the allocator (the new ones are made
            # beside them): handed back, or RSS holds a merge's worth more than the rows.
            give_back_free_memory()
        self._seen = {}
        self._fresh = set()
        self._rows = kept
        self._keys = SortedList(kept)
        self._unsorted = {}

    def wipe(self) -> None:
        self.held.clear()
        self._rows = {}
        self._keys = SortedList()
        self._unsorted = {}
        self._packed = Packed(self._block_rows, _FAMILY)
        self._seen = {}
        self._fresh = set()
        self._offset = _NO_OFFSET
        self._tables = {}
        self.revision += 1

    def close(self, synced: bool = False) -> None:
        """Drop the rows: the next owner of the partition replays its logs."""
        self.held.clear()
        self._rows = {}
        self._keys = SortedList()
        self._unsorted = {}
        self._packed = Packed(self._block_rows, _FAMILY)
        self._seen = {}
        self._fresh = set()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
