"""Per-partition state in memory: the working copy in a dict and an ordered index of its
keys, the changelog the only durable copy.

Nothing is kept on disk, so nothing can be stale: a task's store starts empty at every
assignment and is filled by replaying its logs (as Kafka Streams' in-memory stores are).
It answers every read a `PartitionStore` answers, the same way, so stages and the
runtime cannot tell the two apart (docs/decisions/state-backends.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Self

from sortedcontainers import SortedList

_NO_OFFSET = -1
# Keys written since the last ordered read that a write lets wait at most, for a store
# that is seldom read in order, before it merges them into the order (MemoryStore).
_MERGE_AT = 4096


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
    `mark_synced` does nothing: there is no copy that outlives the process to prove."""

    persistent = False

    def __init__(self) -> None:
        self._rows: dict[bytes, bytes] = {}
        # The keys in order, for reads by prefix (queues, timers), but for the keys written
        # since the last ordered read: those wait in `_unsorted` and join it at the next
        # one, or once they are a quarter as many as the keys in order, all at once (a
        # restore writes a million keys before its first ordered read: a few merges of
        # sorted runs, not a million inserts; a store read only by key, a debounce's,
        # keeps at most a quarter of its keys in the set).
        self._keys = SortedList()
        self._unsorted: set[bytes] = set()
        self._offset = _NO_OFFSET
        self._tables: dict[str, int] = {}
        self._closed = False
        # Bumped by every write and wipe, so anything caching a view of the store (the
        # timer index, a transaction's floors and memos) can tell it changed.
        self.revision = 0

    @property
    def synced_at_ms(self) -> int | None:
        return None

    def mark_synced(self, at_ms: int) -> None:
        pass

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes) -> bytes | None:
        return self._rows.get(key)

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Rows whose key starts with `prefix`, ascending, from `start` (inclusive). The
        store is written only at a commit or a restore, not while a cycle reads it; an
        iteration that outlives a write goes on from its last row over the rows as they
        are then (a RocksDB store's keeps the rows as of the call)."""
        if self._closed:
            raise RuntimeError("store is closed")
        from_key = prefix if start is None or start < prefix else start
        return self._walk(prefix, from_key)

    def _sorted(self) -> SortedList:
        """The keys in order, the keys written since the last ordered read included."""
        if self._unsorted:
            self._keys.update(self._unsorted)
            self._unsorted = set()
        return self._keys

    def _walk(self, prefix: bytes, from_key: bytes) -> Iterator[tuple[bytes, bytes]]:
        revision = self.revision
        keys = self._sorted().irange(from_key)
        while True:
            key = next(keys, None)
            if key is None or not key.startswith(prefix):
                return
            yield key, self._rows[key]
            if self.revision != revision:
                # Written meanwhile: the index changed under the iterator.
                revision = self.revision
                keys = self._sorted().irange(key, inclusive=(False, True))

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
        for key, value in changes.items():
            if value is None:
                if rows.pop(key, None) is not None:
                    if key in unsorted:
                        unsorted.discard(key)
                    else:
                        self._keys.remove(key)
            else:
                if key not in rows:
                    unsorted.add(key)
                rows[key] = value
        if len(unsorted) > _MERGE_AT and len(unsorted) * 4 >= len(self._keys):
            self._sorted()
        if changelog_offset is not None:
            self._offset = changelog_offset
        if tables:
            self._tables.update(tables)
        self.revision += 1

    def wipe(self) -> None:
        self._rows = {}
        self._keys = SortedList()
        self._unsorted = set()
        self._offset = _NO_OFFSET
        self._tables = {}
        self.revision += 1

    def close(self, synced: bool = False) -> None:
        """Drop the rows: the next owner of the partition replays its logs."""
        self._rows = {}
        self._keys = SortedList()
        self._unsorted = set()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
