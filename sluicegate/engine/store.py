"""Per-partition state, and the buffered writes of one commit cycle.

Two backends answer the `Store` interface: RocksDB (`PartitionStore`, here), for state
larger than memory, and memory (`engine.memstore.MemoryStore`), the default
(docs/decisions/state-backends.md). A RocksDB store is trusted only up to the changelog
offset written with its data, so the data and that offset always move together in one
WriteBatch (docs/decisions/state-store-layout.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)
from sortedcontainers import SortedList

from sluicegate.engine.held import Held
from sluicegate.engine.memstore import LogOffsets, MemoryStore

# The offsets live in their own column family so that user keys can be any bytes.
META_CF = "meta"
_OFFSET_KEY = b"changelog_offset"
# A table the stage publishes (rows under a prefix, logged to a topic of their own instead
# of the changelog): the offset of its topic, under this prefix and the table's name.
_TABLE_OFFSET_KEY = b"table_offset:"
# The last wall-clock time (epoch ms) at which the store was known to hold everything its
# logs held: every record after its offsets was written later, so a tombstone the log
# cleaner may have removed since is one written after it (docs/decisions/stale-stores.md).
_SYNCED_KEY = b"synced_at"
_OFFSET = struct.Struct(">q")
_NO_OFFSET = -1

log = logging.getLogger(__name__)

# Every store of a process shares one block cache (as Kafka Streams' bounded-memory
# setup does), so the memory it takes does not grow with the number of stores. It fills
# as blocks are read; making it reserves nothing.
_BLOCK_CACHE = Cache(64 * 1024 * 1024)


def _options() -> Options:
    """Options for a store read by point lookups, most of which miss: the stages ask
    "is there a row for this run / key / mark?" far more often than the answer is yes.
    See docs/decisions/store-point-lookups.md."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    table = BlockBasedOptions()
    # A Bloom filter per table file (10 bits a key, ~1% false positives): a miss skips
    # the file's blocks instead of reading them.
    table.set_bloom_filter(10, False)
    table.set_block_cache(_BLOCK_CACHE)
    # Each table file's index and filter stay in memory with the file, not in the cache:
    # with a million keys parked, data blocks read once turned them over in the 64 MiB
    # cache, and every lookup read them again (a debounce fire cost 1.3x what it costs
    # with 100,000). They take a few MiB per million keys (docs/decisions/
    # store-point-lookups.md).
    table.set_cache_index_and_filter_blocks(False)
    opts.set_block_based_table_factory(table)
    # And one over the whole keys of the memtable, where a commit cycle's rows are
    # first looked for: a miss there costs a hash, not a skiplist walk. Its bits are
    # allocated with each memtable, so it is kept small (~130 KiB a store).
    opts.set_memtable_whole_key_filtering(True)
    opts.set_memtable_prefix_bloom_ratio(0.002)
    # Rows are small: compressing the table files a flush writes costs more CPU than the
    # disk it saves (Kafka Streams' stores do not compress either).
    opts.set_compression_type(DBCompressionType.none())
    # There is no write-ahead log (_write_options): what a crash keeps is what the last
    # memtable flush wrote, and an atomic flush writes both column families together, so
    # a batch's rows and the offsets written with them survive, or vanish, together
    # (docs/decisions/store-writes.md).
    opts.set_atomic_flush(True)
    return opts


def _write_options() -> WriteOptions:
    """No write-ahead log: a store is recovered from its changelog (and its tables' topics)
    from the offsets it holds, never from RocksDB's own log, as in Kafka Streams."""
    opts = WriteOptions()
    # A property at run time (rocksdict's stub declares it a method).
    opts.disable_wal = True  # type: ignore[method-assign,assignment]
    return opts


class StoreUnwritable(Exception):
    """A store's disk has no room: RocksDB could not write (a flush, a close's last flush,
    an open's files), or the runtime found too little free space to commit. Nothing is
    wrong with the store's rows; it is rebuilt from its logs once there is room."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason} ({format_bytes(free_bytes(path))} free)")


def free_bytes(path: Path) -> int:
    """Free space for an unprivileged writer on the filesystem of `path` (or of its
    nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            st = os.statvfs(candidate)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return 0


def format_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = n / 1024
    for unit in ("KiB", "MiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def _out_of_space(exc: BaseException) -> bool:
    text = str(exc)
    return "No space left on device" in text or "Disk quota exceeded" in text


class Store(Protocol):
    """What the runtime and a cycle's transaction need of a partition's store."""

    persistent: bool
    revision: int

    @property
    def changelog_offset(self) -> int: ...
    def table_offset(self, table: str) -> int: ...
    @property
    def holds_rows(self) -> bool: ...
    @property
    def synced_at_ms(self) -> int | None: ...
    def mark_synced(self, at_ms: int) -> None: ...
    def get(self, key: bytes) -> bytes | None: ...
    def items(self, prefix: bytes,
              start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]: ...
    def write(self, changes: Mapping[bytes, bytes | None], changelog_offset: int | None,
              tables: Mapping[str, int] | None = None, synced: bool = False) -> None: ...
    def wipe(self) -> None: ...
    def close(self, synced: bool = False) -> None: ...


BACKENDS = ("memory", "rocksdb")


def open_store(backend: str, path: Path, clock: Callable[[], int] | None = None) -> Store:
    """The store of one (stage, partition): in memory, or RocksDB at `path`."""
    if backend == "memory":
        return MemoryStore()
    if backend == "rocksdb":
        return PartitionStore(path, clock)
    raise ValueError(f"no state backend {backend!r}: it is one of {', '.join(BACKENDS)}")


class PartitionStore(LogOffsets):
    """One RocksDB (raw bytes) per (stage, partition) at `path`. `clock` (epoch ms) stamps
    the time a commit's write or a clean close leaves the store in step with its logs."""

    persistent = True

    def __init__(self, path: Path, clock: Callable[[], int] | None = None) -> None:
        self.path = Path(path)
        self._clock = clock
        # Bumped by every write and wipe, so anything caching a view of the
        # store (the timer index) can tell the store changed underneath it.
        self.revision = 0
        if self.path.exists():
            self._open()
        else:
            # Nothing was ever written here: RocksDB is opened (and its files made) by the
            # first write. A task's stores of stages its workflows never use then cost
            # nothing when the task is assigned, where an open costs ~9 ms (its fsyncs).
            self._db: Rdict | _Closed | _Unopened = _Unopened()
            self._offset = _NO_OFFSET
            self._tables: dict[str, int] = {}
            self._synced_at: int | None = None

    def _open(self) -> None:
        """Open the RocksDB at `path`. One that cannot be opened (a truncated table file,
        garbage in CURRENT or the MANIFEST) is moved aside, kept for inspection, and an
        empty store opened in its place, which the restore then fills from its logs
        (docs/decisions/runtime-faults.md); a disk with no room raises StoreUnwritable."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            db = self._rdict()
        except OSError as exc:
            if exc.errno in (28, 122):  # ENOSPC, EDQUOT
                raise StoreUnwritable(self.path, f"cannot be opened: {exc}") from exc
            raise
        except Exception as exc:  # rocksdict raises a bare Exception with RocksDB's status
            if _out_of_space(exc):
                raise StoreUnwritable(self.path, f"cannot be opened: {exc}") from exc
            aside = self.path.with_name(
                f"{self.path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}")
            self.path.rename(aside)
            log.warning("store %s cannot be opened (%s): moved aside to %s for inspection; "
                        "it is rebuilt from its logs", self.path, exc, aside.name)
            self.path.mkdir(parents=True)
            db = self._rdict()
        self._db = db
        self._db.set_write_options(_write_options())
        self._meta = self._db.get_column_family_handle(META_CF)
        meta = self._db.get_column_family(META_CF)
        raw = meta.get(_OFFSET_KEY)
        synced = meta.get(_SYNCED_KEY)
        self._synced_at = None if synced is None else _OFFSET.unpack(synced)[0]
        rows: Any = meta.items(from_key=_TABLE_OFFSET_KEY)
        self._tables = {
            key[len(_TABLE_OFFSET_KEY):].decode(): _OFFSET.unpack(value)[0]
            for key, value in _with_prefix(rows, _TABLE_OFFSET_KEY)
        }
        del rows
        # A column-family Rdict keeps the database open: drop it right away.
        meta.close()
        self._offset = _NO_OFFSET if raw is None else _OFFSET.unpack(raw)[0]

    def _rdict(self) -> Rdict:
        return Rdict(str(self.path), _options(),
                     column_families={META_CF: Options(raw_mode=True)})

    def _write(self, batch: WriteBatch) -> None:
        try:
            self._db.write(batch)  # type: ignore[union-attr]
        except Exception as exc:
            if _out_of_space(exc):
                raise StoreUnwritable(self.path, f"a write failed: {exc}") from exc
            raise

    @property
    def synced_at_ms(self) -> int | None:
        """When the store was last known to hold everything its logs held (epoch ms); None
        if never said (a store of an earlier release, or one being rebuilt)."""
        return self._synced_at

    def mark_synced(self, at_ms: int) -> None:
        """The store holds everything its logs held at `at_ms` (a restore reached the ends it
        read then, or the owner closes it after a commit)."""
        if not isinstance(self._db, Rdict):
            return
        batch = WriteBatch(raw_mode=True)
        batch.put(_SYNCED_KEY, _OFFSET.pack(at_ms), self._meta)
        self._write(batch)
        self._synced_at = at_ms

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Rows whose key starts with `prefix`, ascending, from `start` (inclusive).

        The RocksDB iterator is created by this call, so the rows are those of
        the store as of the call even if it is written while iterating.
        """
        from_key = prefix if start is None or start < prefix else start
        bound = prefix_end(prefix)
        if bound is None:
            return _with_prefix(self._db.items(from_key=from_key), prefix)
        # Bounded: an iterator that finds no live row in the range would otherwise step
        # over every tombstone after it until it met a live row of some other prefix (an
        # emptied queue, with the queues emptied after it: 1.5 ms, against 4 us bounded).
        read = ReadOptions()
        read.set_iterate_upper_bound(bound)
        return _bounded(self._db.items(from_key=from_key, read_opt=read), read)

    def write(self, changes: Mapping[bytes, bytes | None], changelog_offset: int | None,
              tables: Mapping[str, int] | None = None, synced: bool = False) -> None:
        """Apply puts and deletes (None) and record the offsets they bring the logs to, all
        atomically: `changelog_offset` for the changelog (None: no changelog record), and
        per published table the offset of its topic. `synced`: the offsets are the ends of
        the logs now (the owner's commit, which nobody else writes after), so the store is
        in step with them as of its clock's now."""
        logs = [] if changelog_offset is None else [(_OFFSET_KEY, self._offset,
                                                     changelog_offset, "changelog")]
        for table, offset in (tables or {}).items():
            logs.append((_TABLE_OFFSET_KEY + table.encode(), self.table_offset(table), offset,
                         f"table {table}"))
        for _, current, offset, log in logs:
            if offset < current:
                raise ValueError(
                    f"store {self.path} already reflects {log} offset {current}; "
                    f"refusing to move it back to {offset}"
                )
        if self._db.__class__ is _Unopened:
            self._open()
        batch = WriteBatch(raw_mode=True)
        # In key order: the memtable's skiplist takes a sorted run of keys about a quarter
        # faster than the same keys in arrival order (each key is in `changes` once).
        for key in sorted(changes):
            value = changes[key]
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        for key, _, offset, _ in logs:
            batch.put(key, _OFFSET.pack(offset), self._meta)
        synced_at = self._clock() if synced and self._clock is not None else None
        if synced_at is not None:
            batch.put(_SYNCED_KEY, _OFFSET.pack(synced_at), self._meta)
        self._write(batch)
        if synced_at is not None:
            self._synced_at = synced_at
        if changelog_offset is not None:
            self._offset = changelog_offset
        self._tables.update(tables or {})
        self.revision += 1

    def wipe(self) -> None:
        """Drop all rows and the offset (e.g. the changelog topic was recreated).

        Iterators from items() keep RocksDB open: drop them before wiping.
        """
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._open()
        self.revision += 1

    def close(self, synced: bool = False) -> None:
        """`synced`: the store is in step with its logs (its owner committed and gives it
        up), which it records with its clock's now before it closes. Closed whatever
        happens; a disk with no room for the last flush raises StoreUnwritable after (the
        rows it could not write are in the logs, replayed at the next restore)."""
        db, self._db = self._db, _Closed(self.path)
        if not isinstance(db, Rdict):
            return
        try:
            if synced and self._clock is not None:
                batch = WriteBatch(raw_mode=True)
                batch.put(_SYNCED_KEY, _OFFSET.pack(self._clock()), self._meta)
                db.write(batch)
            db.close()
        except Exception as exc:
            if _out_of_space(exc):
                raise StoreUnwritable(self.path, f"closing it failed: {exc}") from exc
            raise
        finally:
            # Every reference dropped: RocksDB releases its files and its lock even when
            # its close failed, so the store can be opened again in this process.
            del self._meta, db

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _Unopened:
    """Takes the place of the Rdict of a store never written: it has no rows."""

    def get(self, key: bytes) -> None:
        return None

    def items(self, from_key: bytes | None = None,
              read_opt: ReadOptions | None = None) -> Iterator[tuple[bytes, bytes]]:
        return iter(())


class _Closed:
    """Takes the place of the Rdict once closed, so reads need no open-check of their own."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"store {self._path} is closed")


def prefix_end(prefix: bytes) -> bytes | None:
    """The least key above every key that starts with `prefix` (None: there is none, the
    prefix being empty or all 0xff)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes((stripped[-1] + 1,))


def _bounded(rows: Any, read: ReadOptions) -> Iterator[tuple[bytes, bytes]]:
    """The rows of an iterator made with `read`, which holds the bound the iterator reads
    (rocksdict does not keep it alive: freed, the bound is garbage and so are the rows)."""
    yield from rows
    del read


def _with_prefix(rows: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    for key, value in rows:
        if not key.startswith(prefix):
            return
        yield key, value


_ABSENT = object()
# How many counts read a transaction keeps at most (`StoreTransaction.count`; a forgotten
# one is read again).
_MAX_COUNTS = 4_096
# How many of a key's first bytes decide which ordered reads may need it indexed (a
# stage's table prefix: 0x00, 'S' and its letter).
_FAMILY = 3
# What a record's framing on the wire may add to its key and value (librdkafka counts it
# against message.max.bytes).
RECORD_OVERHEAD_BYTES = 512


class RowTooLarge(ValueError):
    """A row too large to be written to its log."""


class StoreTransaction:
    """The writes of one commit cycle over one PartitionStore.

    Reads see the buffer first. The runtime produces `changes` to the changelog
    inside the Kafka transaction, then `commit`s them with the highest offset
    produced once that transaction has committed, or `discard`s them on abort.

    What a reader derives from the view and keeps beside it (a queue's floor and first
    rows) is the reader's, kept in `cache`.

    Ordered reads (`items`) find the buffered rows of a prefix through a sorted index of
    the buffer's keys, built at the cycle's first ordered read: a queue's head costs the
    same with 10 or 100,000 rows written in the cycle (docs/decisions/store-buffer-index.md).
    A cycle that never reads in order (the passthrough) never builds it. A key written
    after it is built joins it at the next ordered read of a prefix its first `_FAMILY`
    bytes (its table's prefix) may hold: the rows no one reads in order (a run's row, a
    count, a holder) are not added to it one by one as they are written.
    """

    def __init__(self, store: Store, max_record_bytes: int | None = None) -> None:
        self.store = store
        self._buffer: dict[bytes, bytes | None] = {}
        # The buffer's keys in order, or None until an ordered read asks for it; and the
        # keys new to the buffer since, not in it yet, by their first `_FAMILY` bytes.
        self._index: SortedList | None = None
        self._unindexed: defaultdict[bytes, list[bytes]] = defaultdict(list)
        self._discards = 0
        self._commits = 0
        # Per owner (the timers, the queues), what it derived from the view: dropped when
        # the view changes other than through this transaction's commit (see cache()).
        self._caches: dict[str, dict[Any, Any]] = {}
        self._cached_at = self.revision
        # A row is also a record of its log: one too large to be written there is refused
        # when it is put, so the failure belongs to the record being processed, not to a
        # commit that could never succeed.
        self._max_row = (None if max_record_bytes is None
                         else max_record_bytes - RECORD_OVERHEAD_BYTES)
        # Counters changed in this cycle (`set_count`), as ints, and the key prefixes
        # (`_FAMILY` bytes) they fall under: written to their rows once, when the cycle's
        # writes are read (`changes`), an ordered read may cover them, or it commits.
        self._counts: dict[bytes, int | None] = {}
        self._count_families: set[bytes] = set()
        # And the counts read, good while the store is at revision `_known_at` (a write to
        # it that is not this transaction's commit, a restore, drops them; so does an abort).
        self._known: dict[bytes, int | None] = {}
        self._known_at = store.revision
        # The derived rows a memory store holds as values (engine.held): written there at
        # once, undone if this transaction aborts. What an earlier transaction over the
        # store wrote and never committed (its worker crashed, as the test driver plays
        # it) is undone now.
        held = getattr(store, "held", None)
        self.held: Held | None = held if held is not None and held.active else None
        if held is not None:
            held.rollback()
        # The cycle's rows of the tables the store holds in structures of their own
        # (`TableSpec.values`), for the changelog only: written there at once (`log`).
        self.logged: dict[bytes, bytes | None] = {}

    @property
    def pending(self) -> bool:
        """Whether this cycle wrote anything to commit: rows, or values held."""
        return bool(self._buffer or self._counts or self.logged
                    or (self.held is not None and self.held.writing))

    def log(self, key: bytes, value: bytes | None) -> None:
        """A row of a table the store holds in a structure of its own, which its holder
        has already written (None: deleted): it goes to the changelog at the commit, and
        no further."""
        if (value is not None and self._max_row is not None
                and len(key) + len(value) > self._max_row):
            raise RowTooLarge(
                f"a store row of {len(key) + len(value)} bytes is over the "
                f"{self._max_row}-byte limit of its changelog records (message.max.bytes)")
        self.logged[key] = value

    def get(self, key: bytes) -> bytes | None:
        if self._counts:
            n = self._counts.get(key, _ABSENT)
            if n is not _ABSENT:
                return None if n is None else str(n).encode()
        value = self._buffer.get(key, _ABSENT)
        if value is _ABSENT:
            return self.store.get(key)
        return value  # type: ignore[return-value]

    # -- counters: a derived count read and changed many times a cycle ------------------

    def count(self, key: bytes) -> int | None:
        """The count in row `key` (its decimal text; None when there is no row), as
        `set_count` left it in this cycle, else as last read: a queue's length or a key's
        slots held, read and changed at every start, cost a dict lookup rather than a read
        of the store and a parse (docs/decisions/counts-written-once-a-cycle.md)."""
        n = self._counts.get(key, _ABSENT)
        if n is not _ABSENT:
            return n  # type: ignore[return-value]
        known = self._known
        if self._known_at != self.store.revision:
            known = self._known = {}
            self._known_at = self.store.revision
        n = known.get(key, _ABSENT)
        if n is _ABSENT:
            raw = self.get(key)
            n = None if raw is None else int(raw)
            if len(known) >= _MAX_COUNTS:
                known.clear()
            known[key] = n
        return n  # type: ignore[return-value]

    def set_count(self, key: bytes, n: int | None) -> None:
        """Set the count in row `key` (None deletes the row): the row is written once,
        when the cycle's writes are next read or committed."""
        if key not in self._counts:
            self._count_families.add(key[:_FAMILY])
        self._counts[key] = n

    def _write_counts(self) -> None:
        """The counters changed since they were last written, to their rows."""
        counts = self._counts
        self._counts = {}
        self._count_families.clear()
        known = self._known
        for key, n in counts.items():
            if n is None:
                self.delete(key)
            else:
                self.put(key, str(n).encode())
            known[key] = n

    def put(self, key: bytes, value: bytes) -> None:
        if self._max_row is not None and len(key) + len(value) > self._max_row:
            raise RowTooLarge(
                f"a store row of {len(key) + len(value)} bytes is over the "
                f"{self._max_row}-byte limit of its changelog records (message.max.bytes)")
        if self._index is not None and key not in self._buffer:
            self._unindexed[key[:_FAMILY]].append(key)
        self._buffer[key] = value

    def delete(self, key: bytes) -> None:
        if self._index is not None and key not in self._buffer:
            self._unindexed[key[:_FAMILY]].append(key)
        self._buffer[key] = None

    def items(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Buffer and store merged, ascending by key; the buffer wins, deletes are hidden.

        The stored rows are those of the store as of the call; the buffer is read as the
        iteration goes, so deleting or rewriting a row already yielded (e.g. cancelling
        fired timers) is safe. Rows put ahead of the iteration while it runs may or may
        not be seen: take a list first to write more than that.
        """
        if self._count_families and (prefix[:_FAMILY] in self._count_families
                                     or len(prefix) < _FAMILY):
            self._write_counts()
        lo = prefix if start is None or start < prefix else start
        stored = self.store.items(prefix, start)
        if not self._buffer:
            return stored
        index = self._index
        if index is None:
            index = self._index = SortedList(self._buffer)
        elif self._unindexed:
            self._index_family(index, prefix)
        at = index.bisect_left(lo)
        if at == len(index) or not index[at].startswith(prefix):
            return stored
        return self._merge(index[at], prefix, stored)

    def _index_family(self, index: SortedList, prefix: bytes) -> None:
        """The keys not yet in the index that `prefix` may hold join it."""
        unindexed = self._unindexed
        if len(prefix) >= _FAMILY:
            keys = unindexed.pop(prefix[:_FAMILY], None)
            if keys:
                index.update(keys)
            return
        for family in [f for f in unindexed if f.startswith(prefix)]:
            index.update(unindexed.pop(family))

    def _merge(self, first: bytes, prefix: bytes,
               stored: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        buffer = self._buffer
        index = self._index
        assert index is not None
        bkey: bytes | None = first
        skey, svalue = next(stored, _END)
        while bkey is not None or skey is not None:
            if bkey is not None and (skey is None or bkey <= skey):
                if bkey == skey:
                    skey, svalue = next(stored, _END)
                key, value = bkey, buffer.get(bkey)
                # The next buffered key after this one, found again in the index: the
                # caller may have written rows (and so moved positions) meanwhile.
                at = index.bisect_right(key)
                bkey = index[at] if at < len(index) else None
                if bkey is not None and not bkey.startswith(prefix):
                    bkey = None
                if value is not None:
                    yield key, value
            else:
                assert skey is not None
                key, value = skey, buffer.get(skey, svalue)
                skey, svalue = next(stored, _END)
                if value is not None:
                    yield key, value

    def cache(self, owner: str) -> dict[Any, Any]:
        """A place for what `owner` derived from this transaction's view of the store (a
        timer index's floor, a queue's first rows: engine.tables.Floors, the queue module's
        index). A commit keeps it (it does not change the view); a discard, or any other
        write to the store (a restore, a wipe), drops every owner's. Only its owner keeps
        it true, by updating it as it writes the rows it was derived from, and bounds its
        size."""
        # `revision`, written out: the queues and timers ask at every row they write.
        at = (self.store.revision - self._commits, self._discards)
        if at != self._cached_at:
            self._caches = {}
            self._cached_at = at
        cache = self._caches.get(owner)
        if cache is None:
            cache = self._caches[owner] = {}
        return cache

    @property
    def changes(self) -> dict[bytes, bytes | None]:
        """Last write per key, in first-write order (None = delete). Do not mutate."""
        if self._counts:
            self._write_counts()
        return self._buffer

    @property
    def revision(self) -> tuple[int, int]:
        """Changes whenever the view may have changed other than through this transaction:
        a discard, or a write to the store that is not this transaction's own commit (a
        restore, a wipe). A commit leaves the view as it was, and the revision too."""
        return (self.store.revision - self._commits, self._discards)

    def commit(self, changelog_offset: int | None,
               tables: Mapping[str, int] | None = None) -> None:
        if self.held is not None:
            self.held.keep()
        if self._counts:
            self._write_counts()
        if self._buffer:
            current = self._known_at == self.store.revision
            self.store.write(self._buffer, changelog_offset, tables, synced=True)
            self._commits += 1
            if current:
                self._known_at = self.store.revision
        # A new dict rather than clear(): a caller still holding `changes`
        # (e.g. to log what was committed) keeps an intact copy.
        self._buffer = {}
        self._index = None
        self._unindexed.clear()
        if self.logged:
            self.logged = {}

    def discard(self) -> None:
        if self.held is not None:
            self.held.rollback()
        if self.logged:
            self.logged = {}
        self._buffer = {}
        self._index = None
        self._unindexed.clear()
        self._counts = {}
        self._count_families.clear()
        self._known = {}
        self._discards += 1

    def __len__(self) -> int:
        return len(self.changes)


_END: tuple[None, None] = (None, None)
