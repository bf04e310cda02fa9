"""The pending queue: starts a control parked, ordered by priority, in the stage's store.

Every deferring control (debounce output, batch, throttle, concurrency, pause, delayed
starts) parks into one of these, so priority orders all of them the same way (SPEC.md
section 3, step 7):

- `strict` (default): higher priority first, ties by arrival, so all-default is FIFO;
- `age`: the priority is seconds of extra waiting time, so the rank is the arrival time
  minus the priority.

Rows live under the queue's name and a sortable rank, so the head is the first key of a
prefix scan. A start that came with Kafka headers keeps them in a row beside its own, to
send them on with it when it leaves (docs/decisions/record-headers.md). A `FairQueue`
keeps one such queue per lane (a tenant, a key) inside one shared budget, and serves
lanes round-robin among the best-priority heads, so one lane's backlog cannot starve the
others; in age mode the heads go by waiting time, boost included, across lanes too
(docs/decisions/fairness-across-keys.md).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from sluicegate.admission.queue_values import QueueValues
from sluicegate.declare import Workflow
from sluicegate.engine.stage import Headers, StoreReader
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.tables import RAW, Decimal, Floors, TableSpec, derived_prefixes
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.records import PendingStart, record

_QUEUE = STATE_PREFIX + b"Q"
_COUNT = STATE_PREFIX + b"N"
_SEQ = STATE_PREFIX + b"S"
_LANES = STATE_PREFIX + b"L"
_LAST = STATE_PREFIX + b"Z"
_TOTAL = STATE_PREFIX + b"M"
_TURN = STATE_PREFIX + b"R"
# A parked start's headers, under its row's key. The row of a start that has them ends in
# `_WITH_HEADERS` (one byte past rank and sequence), so one without costs no lookup.
_HEADERS = STATE_PREFIX + b"P"
_WITH_HEADERS = b"h"
_RANK_AND_SEQ = 16


def _sortable(value: float) -> bytes:
    """Big-endian bytes of a double that sort in the number's order."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", value))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits & (1 << 63) else bits | (1 << 63)
    return struct.pack(">Q", bits)


def priority_mode(wf: Workflow | None) -> str:
    """How a workflow's pending starts rank: its declared mode, `strict` by default."""
    return wf.priority.mode if wf is not None and wf.priority is not None else "strict"


def rank(start: PendingStart, mode: str) -> float:
    """Smaller goes first."""
    if mode == "age":
        return start.arrived_at_ms / 1000.0 - start.priority
    return -start.priority


def rank_key(start: PendingStart, mode: str) -> bytes:
    """The rank as bytes that sort like it, for keys ordered by priority."""
    return _sortable(rank(start, mode))


def _name(name: bytes) -> bytes:
    # Length-prefixed, so one queue's name is never a prefix of another's.
    return struct.pack(">H", len(name)) + name


def pack_headers(headers: Headers) -> bytes:
    """Headers as bytes for a store row: per header, its name's length (2 bytes), the
    name, its value's length (4 bytes) and the value."""
    out = bytearray()
    for name, value in headers:
        raw = name.encode()
        data = value.encode() if isinstance(value, str) else value or b""
        out += struct.pack(">H", len(raw)) + raw + struct.pack(">I", len(data)) + data
    return bytes(out)


class HeadersCodec:
    """Headers as a table's value (`pack_headers`)."""

    def encode(self, value: Headers) -> bytes:
        return pack_headers(value)

    def decode(self, raw: bytes) -> Headers:
        return unpack_headers(raw)


def unpack_headers(raw: bytes) -> Headers:
    headers: Headers = []
    at = 0
    while at < len(raw):
        (n,) = struct.unpack_from(">H", raw, at)
        name = raw[at + 2:at + 2 + n].decode()
        at += 2 + n
        (m,) = struct.unpack_from(">I", raw, at)
        headers.append((name, raw[at + 4:at + 4 + m]))
        at += 4 + m
    return headers


# The queues' tables, in the store of each stage that parks starts (its `tables`). A
# queue's name is length-prefixed (`_name`), a fair queue's lane queue named `budget 0x1f
# lane`. Only this module reads and writes them, through the transaction, since it keeps
# an index beside them (below).
#  - queue: (name, rank, sequence[, "h"]) -> the start's Avro record, encoded once;
#  - headers: a queue row's key -> the headers its start came with;
#  - lanes: (budget, lane) -> the lane's marker, "turn" or "turn:turns in a row";
#  - turn: budget -> the round's counter.
# And its bookkeeping: a queue's count, its sequence and its last row, a fair queue's
# total. Each follows from the queues' rows (`derive`), so none is logged
# (docs/decisions/derived-rows.md); a stage whose queues these are lists them among its
# `derived` prefixes.
TABLES: tuple[TableSpec[Any, Any], ...] = (
    TableSpec("queue", _QUEUE, RAW, RAW, values=QueueValues),
    TableSpec("queue.headers", _HEADERS, RAW, RAW),
    TableSpec("queue.lanes", _LANES, RAW, RAW),
    TableSpec("queue.turn", _TURN, RAW, Decimal(1)),
    TableSpec("queue.count", _COUNT, RAW, Decimal(1), derived=True),
    TableSpec("queue.seq", _SEQ, RAW, Decimal(1), derived=True),
    TableSpec("queue.last", _LAST, RAW, RAW, derived=True),
    TableSpec("queue.total", _TOTAL, RAW, Decimal(1), derived=True),
)
DERIVED = derived_prefixes(*TABLES)


def agrees(kept: dict[bytes, bytes], derived: dict[bytes, bytes]) -> bool:
    """Whether bookkeeping rows kept up to date as starts came and went do what the rows
    `derive` made would: the same rows, but for a sequence, which the queue keeps at the
    last it gave out (kept while the queue is empty, so a refill's rows sort past the
    rows taken before) and `derive` at the highest its rows hold, if any (the next start
    gets a higher one either way); and a last row, which a queue whose last start was
    removed (not served: a cancel, an expiry) keeps at that start's row, above the rows
    left (`park` reads it as a bound: a newcomer past it is last either way)."""
    if kept.keys() - derived.keys() - {key for key in kept if key.startswith(_SEQ)}:
        return False
    return all(kept.get(key) == value or (key.startswith(_SEQ) and key in kept
                                          and int(kept[key]) >= int(value))
               or (key.startswith(_LAST) and key in kept and kept[key] > value)
               for key, value in derived.items())


def derive(store: StoreReader) -> dict[bytes, bytes]:
    """The bookkeeping rows of every queue in `store`, from the queues' rows: per queue its
    count, the highest sequence it holds and its last row (its rows are read in order, so
    the last read is the last), and per fair queue the count of all its lanes. A store
    that holds its queues as values (`HeldQueue`) gets the fair queues' counts only: a
    held queue's count, sequence and last row are its own."""
    rows: dict[bytes, bytes] = {}
    counts: dict[bytes, int] = {}
    held = getattr(store, "held", None)
    if held is not None and isinstance(held.tables.get(_QUEUE), QueueValues):
        lanes: dict[bytes, Any] = held.tables[_QUEUE].lanes
        counts = {name[len(_QUEUE):]: len(lane) for name, lane in lanes.items()}
        return _totals(store, counts)
    named = b""
    n = 0
    last = b""
    seq = 0
    for key, _ in store.items(_QUEUE):
        if not named or not key.startswith(named, len(_QUEUE)):
            if named:
                counts[named] = n
                rows[_COUNT + named], rows[_SEQ + named] = str(n).encode(), str(seq).encode()
                rows[_LAST + named] = last
            (size,) = struct.unpack_from(">H", key, len(_QUEUE))
            named = key[len(_QUEUE):len(_QUEUE) + 2 + size]
            n = seq = 0
        n += 1
        last = key
        at = len(_QUEUE) + len(named) + 8
        seq = max(seq, struct.unpack_from(">Q", key, at)[0])
    if named:
        counts[named] = n
        rows[_COUNT + named], rows[_SEQ + named] = str(n).encode(), str(seq).encode()
        rows[_LAST + named] = last
    rows.update(_totals(store, counts))
    return rows


def _totals(store: StoreReader, counts: dict[bytes, int]) -> dict[bytes, bytes]:
    """Each fair queue's count of all its lanes, from the queues' counts (by their
    length-prefixed names)."""
    totals: dict[bytes, int] = {}
    for key, _ in store.items(_LANES):
        (size,) = struct.unpack_from(">H", key, len(_LANES))
        budget = key[len(_LANES) + 2:len(_LANES) + 2 + size]
        lane = key[len(_LANES) + 2 + size:]
        total = _TOTAL + _name(budget)
        totals[total] = totals.get(total, 0) + counts.get(_name(budget + b"\x1f" + lane), 0)
    return {key: str(total).encode() for key, total in totals.items() if total}


def lane_rows(store: StoreReader, budget: bytes) -> Iterator[tuple[str, bytes, bytes]]:
    """(lane, row key, row value) of every start waiting in the fair queue `budget`."""
    markers = _LANES + _name(budget)
    for marker, _ in list(store.items(markers)):
        lane = marker[len(markers):]
        for row, value in store.items(_QUEUE + _name(budget + b"\x1f" + lane)):
            yield lane.decode(), row, value


def queue_rows(store: StoreReader, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(row key, row value) of every start waiting in the queue `name`, in order."""
    return store.items(_QUEUE + _name(name))


# Where the queues' rows begin, and a queue's name as its rows' keys hold it (for tests).
ROW_PREFIX = _QUEUE


def queue_name(name: bytes) -> bytes:
    return _name(name)


def is_row(raw: bytes) -> bool:
    """Whether `raw` is a queue row's key (what `Parked.row` holds)."""
    return raw.startswith(_QUEUE)


def queue_of(row: bytes) -> bytes:
    """The name of the queue a row (`Parked.row`) belongs to."""
    (size,) = struct.unpack_from(">H", row, len(_QUEUE))
    return row[len(_QUEUE) + 2:len(_QUEUE) + 2 + size]


def fair_budgets(store: StoreReader) -> list[bytes]:
    """The fair queues of `store` with starts waiting (their budgets), in order."""
    budgets: list[bytes] = []
    for key, _ in store.items(_LANES):
        (size,) = struct.unpack_from(">H", key, len(_LANES))
        budget = key[len(_LANES) + 2:len(_LANES) + 2 + size]
        if not budgets or budgets[-1] != budget:
            budgets.append(budget)
    return budgets


def queue_names(tx: StoreTransaction) -> list[bytes]:
    """The names of the queues in `tx`'s store that have starts waiting."""
    held = _held(tx)
    if held is not None:
        return sorted(name[len(_QUEUE) + 2:] for name, lane in held.lanes.items() if len(lane))
    return [key[len(_COUNT) + 2:] for key, _ in tx.items(_COUNT)]


@record
class Parked:
    row: bytes
    start: PendingStart
    # The headers it came with, which go on with it (None: it came with none).
    headers: Headers | None = None


# The most starts counted ahead of one parked ahead of a queue's last: its position past
# them is not known (None), since counting reads every row ahead.
COUNTED = 50

# Rows a queue's head memo reads at once, and keeps at most.
_HEAD_ROWS = 4


class _Heads:
    """A queue's first rows, in order (the transaction's memo for the queue): `rows` are
    its first len(rows) rows, all of them when `complete`, each as (row key, its value
    still encoded, or the start parked there once decoded). The queue keeps it true
    through its own writes, so taking the head and reading the next costs a list
    operation, not an iterator over the store (docs/decisions/queue-head-memo.md)."""

    __slots__ = ("complete", "rows")

    def __init__(self, rows: list[tuple[bytes, bytes | Parked]], complete: bool) -> None:
        self.rows = rows
        self.complete = complete


# -- the queues' index: floors, first rows, lanes ----------------------------------------
#
# Beside its rows, a queue keeps in memory (in the transaction's cache, so that any change
# of the view but its own writes drops it: engine.store.StoreTransaction.cache) where its
# rows start (its floor: no row of the queue below it), its first rows (`_Heads`), and for
# a fair queue its lanes with their turns. Admission is only right while these agree with
# the rows, and only this module writes the rows they follow, keeping them true as it
# does: `index_problems` says whether they do (the queue tests assert it after every
# step, docs/decisions/queue-head-memo.md).

_FLOORS = "queues"
_MEMOS = "queue memos"
# Memos kept per transaction at most (a queue's first rows, a budget's lanes: a few KB at
# most each); the oldest goes, and is read again by its next use.
_MAX_MEMOS = 16_384


def _memo(tx: StoreTransaction, key: bytes) -> Any:
    return tx.cache(_MEMOS).get(key)


def _set_memo(tx: StoreTransaction, key: bytes, value: Any) -> None:
    memos = tx.cache(_MEMOS)
    if value is None:
        memos.pop(key, None)
        return
    if len(memos) >= _MAX_MEMOS and key not in memos:
        del memos[next(iter(memos))]
    memos[key] = value


def index_problems(tx: StoreTransaction) -> list[str]:
    """What is wrong with the queues' index in `tx` (none: empty): a queue with a row below
    its floor, first rows that are not the queue's first rows (or a complete memo that
    misses some), lanes that are not the markers' lanes and turns. It reads every row the
    index covers: for tests and debugging. Queues held as values: their own rule
    (`queue_values.Lane.problems`)."""
    problems = Floors(tx, _FLOORS).holds()
    held = _held(tx)
    if held is not None:
        problems += held.problems()
    for key, memo in tx.cache(_MEMOS).items():
        if key.startswith(_QUEUE):
            heads: _Heads = memo
            rows = [row for row, _ in tx.items(key)]
            kept = [row for row, _ in heads.rows]
            if kept != rows[:len(kept)] or (heads.complete and len(rows) != len(kept)):
                problems.append(f"queue {key!r}: its memo holds {kept!r} "
                                f"({'complete' if heads.complete else 'first rows'}), its "
                                f"rows begin {rows[:len(kept) + 1]!r}")
        elif key.startswith(_LANES):
            lanes = {row[len(key):].decode(): _turn(value)[0] for row, value in tx.items(key)}
            if memo != lanes:
                problems.append(f"fair queue {key!r}: its memo holds lanes {memo!r}, its "
                                f"markers {lanes!r}")
    return problems


def _held(tx: StoreTransaction) -> QueueValues | None:
    """The queues of `tx`'s store held as values, if it holds them so (a memory store)."""
    held = tx.held
    if held is None:
        return None
    found = held.tables.get(_QUEUE)
    return found if isinstance(found, QueueValues) else None


class PendingQueue:
    """One priority-ordered queue of starts under `name` in a stage's store: its rows in
    the store, or, in a store that holds its queues as values, a `HeldQueue` (made by
    this class, as `pathlib.Path` makes the path of its system)."""

    __slots__ = ("_count_key", "_floors", "_last_key", "_prefix", "_row_len", "_seq_key", "tx")

    def __new__(cls, tx: StoreTransaction, name: bytes) -> PendingQueue:
        if cls is PendingQueue and _held(tx) is not None:
            return object.__new__(HeldQueue)
        return object.__new__(cls)

    def __init__(self, tx: StoreTransaction, name: bytes) -> None:
        self.tx = tx
        self._floors = Floors(tx, _FLOORS)
        named = _name(name)
        self._prefix = _QUEUE + named
        self._row_len = len(self._prefix) + _RANK_AND_SEQ
        self._count_key = _COUNT + named
        self._seq_key = _SEQ + named
        self._last_key = _LAST + named

    def __len__(self) -> int:
        return self.tx.count(self._count_key) or 0

    def _set_count(self, n: int) -> None:
        if n:
            self.tx.set_count(self._count_key, n)
        else:
            self.tx.set_count(self._count_key, None)
            self.tx.delete(self._last_key)

    def push(self, start: PendingStart, mode: str = "strict",
             headers: Headers | None = None) -> int | None:
        """Park `start`; returns its position (0 = next out; None: more than `COUNTED`
        ahead of it)."""
        return self.park(start, mode, headers)[1]

    def park(self, start: PendingStart, mode: str = "strict",
             headers: Headers | None = None,
             encoded: bytes | None = None) -> tuple[Parked, int | None]:
        """Park `start` (with the headers it came with); returns its row (to remove it
        later) and its position: exact behind the last start (a FIFO queue, whatever its
        depth), counted up to `COUNTED` starts ahead of it otherwise, None past them
        (docs/decisions/queue-position-bound.md). `encoded`: `start` as this process's
        codec encodes it, when the caller has it (the record it was handed over with),
        so it is not encoded a second time (docs/decisions/encoded-once-per-hop.md)."""
        last_seq = self.tx.count(self._seq_key)
        seq = 0 if last_seq is None else last_seq + 1
        self.tx.set_count(self._seq_key, seq)
        row = self._prefix + rank_key(start, mode) + struct.pack(">Q", seq)
        if headers:
            row += _WITH_HEADERS
            self.tx.put(_HEADERS + row, pack_headers(headers))
        else:
            headers = None
        self._floors.put(self._prefix, row,
                         codec.encode(start) if encoded is None else encoded)
        parked = Parked(row, start, headers)
        heads: _Heads | None = _memo(self.tx, self._prefix)
        near: int | None = None  # its place, when among the memo's first rows
        if heads is not None and (heads.complete or row < heads.rows[-1][0]):
            # Among the first rows the memo holds: it goes in at its place.
            rows = heads.rows
            at = len(rows)
            while at and rows[at - 1][0] > row:
                at -= 1
            rows.insert(at, (row, parked))
            near = at
            if len(rows) > _HEAD_ROWS:
                del rows[_HEAD_ROWS:]
                heads.complete = False
        count = len(self)
        self._set_count(count + 1)
        # The last row ever pushed bounds the queue from above (removals only lower the
        # real maximum), so a newcomer past it is last without a scan: the FIFO case.
        last = self.tx.get(self._last_key)
        if count == 0 or last is None or row > last:
            self.tx.put(self._last_key, row)
            return parked, count
        if near is not None:
            return parked, near
        # Ahead of the last (a priority that ranks it so): counted from the head, but no
        # further than COUNTED rows, or a park into a queue a million deep reads a
        # million rows.
        position = 0
        for key, _ in self._rows():
            if key >= row:
                return parked, position
            position += 1
            if position > COUNTED:
                return parked, None
        return parked, position

    def _parked(self, row: bytes, value: bytes) -> Parked:
        headers = None
        if len(row) > self._row_len:
            raw = self.tx.get(_HEADERS + row)
            headers = unpack_headers(raw) if raw is not None else None
        return Parked(row, codec.decode(PendingStart, value), headers)

    def at(self, row: bytes) -> Parked | None:
        """The start parked at `row` (a row this queue handed out), if it still is."""
        value = self.tx.get(row)
        return None if value is None else self._parked(row, value)

    def _rows(self) -> Iterator[tuple[bytes, bytes]]:
        """The queue's rows in order, from its floor: the rows taken from its head are not
        stepped over again (docs/decisions/store-buffer-index.md)."""
        return self.tx.items(self._prefix, self._floors.floor(self._prefix))

    def peek(self) -> Parked | None:
        if not self.tx.count(self._count_key):
            # Empty: a point read of its count, not an iterator over the store.
            return None
        return self.head()

    def head(self) -> Parked | None:
        """`peek` for a queue known to hold starts (a fair queue's listed lane): read
        from its memo, else from its floor (its first rows, kept in the memo), without
        looking at its count first."""
        tx = self.tx
        heads: _Heads | None = _memo(tx, self._prefix)
        if heads is None:
            floor = self._floors.floor(self._prefix)
            rows: list[tuple[bytes, bytes | Parked]] = []
            for key, value in tx.items(self._prefix, floor):
                if not rows and key != floor:
                    self._floors.set_floor(self._prefix, key)
                # Decoded when it becomes the head: a start removed before never is.
                rows.append((key, value))
                if len(rows) == _HEAD_ROWS:
                    break
            heads = _Heads(rows, len(rows) < _HEAD_ROWS)
            _set_memo(tx, self._prefix, heads)
        if not heads.rows:
            return None
        row, item = heads.rows[0]
        if isinstance(item, Parked):
            return item
        parked = self._parked(row, item)
        heads.rows[0] = (row, parked)
        return parked

    def _delete(self, row: bytes) -> None:
        tx = self.tx
        tx.delete(row)
        if len(row) > self._row_len:
            tx.delete(_HEADERS + row)
        heads: _Heads | None = _memo(tx, self._prefix)
        if heads is not None:
            rows = heads.rows
            for at, (key, _) in enumerate(rows):
                if key == row:
                    del rows[at]
                    break
            if rows:
                # Its first row is the queue's head: nothing is left below it.
                self._floors.set_floor(self._prefix, rows[0][0])
                return
            if not heads.complete:
                # Read again from the floor once what it held is taken.
                _set_memo(tx, self._prefix, None)
        if row == self._floors.floor(self._prefix):
            # Its head, taken: nothing is left below the key just after it.
            self._floors.set_floor(self._prefix, row + b"\x00")

    def remove(self, parked: Parked) -> None:
        self._delete(parked.row)
        self._set_count(len(self) - 1)

    def pop(self) -> Parked | None:
        head = self.peek()
        if head is None:
            return None
        self.remove(head)
        return head

    def __iter__(self) -> Iterator[Parked]:
        floor = self._floors.floor(self._prefix)
        rows = iter(self.tx.items(self._prefix, floor))
        for key, value in rows:
            if key != floor:
                # The head: what was walked over to reach it is not walked again.
                self._floors.set_floor(self._prefix, key)
            yield self._parked(key, value)
            break
        for key, value in rows:
            yield self._parked(key, value)

    def forget(self) -> None:
        """An empty queue that may not be used again (a key gone idle) drops its last
        row, its sequence. Should it fill again, its rows start from the sequence's
        beginning, below the rows taken before: those are read over once more."""
        if len(self) == 0 and self.tx.count(self._seq_key) is not None:
            # Only when it has one: a key that never queued would write a delete.
            self.tx.set_count(self._seq_key, None)

    def clear(self) -> None:
        rows = [key for key, _ in self._rows()]
        for key in rows:
            self._delete(key)
        if rows:
            # Empty now: nothing below the last row taken either. (A queue emptied at once,
            # a batch's items, was read again from its first row ever at each take.)
            self._floors.set_floor(self._prefix, rows[-1] + b"\x00")
        self._set_count(0)


class HeldQueue(PendingQueue):
    """A `PendingQueue` whose rows a memory store holds as values (admission/queue_values.py):
    each write goes to them at once and to the changelog at the commit."""

    __slots__ = ("_held",)

    def __init__(self, tx: StoreTransaction, name: bytes) -> None:
        self.tx = tx
        held = _held(tx)
        assert held is not None
        self._held = held
        self._prefix = _QUEUE + _name(name)
        self._row_len = len(self._prefix) + _RANK_AND_SEQ

    def __len__(self) -> int:
        lane = self._held.lanes.get(self._prefix)
        return 0 if lane is None else len(lane)

    def park(self, start: PendingStart, mode: str = "strict",
             headers: Headers | None = None,
             encoded: bytes | None = None) -> tuple[Parked, int | None]:
        held = self._held
        lane = held.lanes.get(self._prefix)
        row = (self._prefix + rank_key(start, mode)
               + struct.pack(">Q", 0 if lane is None else lane.seq + 1))
        if headers:
            row += _WITH_HEADERS
            self.tx.put(_HEADERS + row, pack_headers(headers))
        else:
            headers = None
        value = codec.encode(start) if encoded is None else encoded
        self.tx.log(row, value)
        position = held.put(self._prefix, row, value, COUNTED)
        parked = Parked(row, start, headers)
        if position == 0:
            held.lanes[self._prefix].head = parked
        return parked, position

    def at(self, row: bytes) -> Parked | None:
        lane = self._held.lanes.get(self._prefix)
        value = None if lane is None else lane.value(row)
        if value is None:
            return None
        assert lane is not None
        if lane.head is not None and lane.head.row == row:
            return lane.head
        return self._parked(row, value)

    def peek(self) -> Parked | None:
        return self.head()

    def head(self) -> Parked | None:
        held = self._held
        lane = held.lanes.get(self._prefix)
        if lane is None:
            return None
        row = held.first(lane)
        if row is None:
            return None
        parked = lane.head
        if parked is None or parked.row != row:
            value = lane.value(row)
            assert value is not None
            parked = lane.head = self._parked(row, value)
        return parked

    def _delete(self, row: bytes) -> None:
        self.tx.log(row, None)
        self._held.delete(self._prefix, row)
        if len(row) > self._row_len:
            self.tx.delete(_HEADERS + row)

    def remove(self, parked: Parked) -> None:
        self._delete(parked.row)

    def __iter__(self) -> Iterator[Parked]:
        lane = self._held.lanes.get(self._prefix)
        if lane is None:
            return
        for row in lane.rows():
            value = lane.value(row)
            if value is not None:
                yield self._parked(row, value)

    def forget(self) -> None:
        self._held.forget(self._prefix)

    def clear(self) -> None:
        lane = self._held.lanes.get(self._prefix)
        for row in list(lane.rows()) if lane is not None else ():
            self._delete(row)


def _turn(raw: bytes) -> tuple[int, int]:
    """A lane's marker: the turn it was last moved to the back at, and the turns it has
    had in a row since (`turn` alone when none: every lane of weight 1)."""
    turn, _, used = raw.partition(b":")
    return int(turn), int(used or 0)


class FairQueue:
    """Queues per lane inside one budget, served in the order priority gives, then
    round-robin (a lane of weight w takes w turns in a row before it goes to the back).

    Within a lane the queue's rank decides (strict or age). Across lanes, in `strict` mode
    the heads compete by their priority value, then by the turn their lane was last
    served (round-robin among equals); in `age` mode the priority is waiting time, so the
    head that arrived first once its boost is counted goes first, whatever its lane, with
    real arrival and then the round deciding ties (docs/decisions/fairness-across-keys.md).
    With a declared fairness key (`fair`) the round comes before the age of a start:
    priority in age mode orders a lane only (docs/decisions/fairness-option.md).
    """

    __slots__ = ("_lane_queues", "_lanes_prefix", "_total_key", "_turn_key", "budget", "fair",
                 "mode", "tx")

    def __init__(self, tx: StoreTransaction, budget: bytes, mode: str = "strict",
                 fair: bool = False) -> None:
        self.tx = tx
        self.budget = budget
        self.mode = mode
        # A declared fairness key (`Concurrency.fair_by`): the round decides across lanes,
        # after priority in strict mode; in age mode the priority orders a lane only.
        self.fair = fair
        named = _name(budget)
        self._lanes_prefix = _LANES + named
        self._total_key = _TOTAL + named
        self._turn_key = _TURN + named
        # The lanes' queues asked for through this object (serving a start asks for its
        # lane's twice: its head, then its removal).
        self._lane_queues: dict[str, PendingQueue] = {}

    def lane(self, lane: str) -> PendingQueue:
        queue = self._lane_queues.get(lane)
        if queue is None:
            queue = self._lane_queues[lane] = PendingQueue(
                self.tx, self.budget + b"\x1f" + lane.encode())
        return queue

    def push(self, lane: str, start: PendingStart,
             headers: Headers | None = None) -> int | None:
        """Park `start` in its lane; returns its position in that lane (None: more than
        `COUNTED` ahead of it)."""
        return self.park(lane, start, headers)[1]

    def park(self, lane: str, start: PendingStart, headers: Headers | None = None,
             encoded: bytes | None = None) -> tuple[Parked, int | None]:
        """Park `start` (with the headers it came with, and `encoded` as
        `PendingQueue.park` takes it) in its lane; returns its row and its position in
        that lane."""
        # Whether the lane has a marker: its memo of the lanes when it has one (true while
        # kept), else the marker's row.
        lanes: dict[str, int] | None = _memo(self.tx, self._lanes_prefix)
        if (lane not in lanes if lanes is not None
                else self.tx.get(self._lanes_prefix + lane.encode()) is None):
            # A new lane joins the round behind every lane already waiting, as if served
            # just now (a turn of its own, so lanes that join together keep their order):
            # a lane that empties and refills cannot jump the queue.
            raw = self.tx.get(self._turn_key)
            turn = int(raw) + 1 if raw else 1
            self.tx.put(self._turn_key, str(turn).encode())
            self._set_marker(lane, turn, str(turn).encode())
        self._add(1)
        return self.lane(lane).park(start, self.mode, headers, encoded)

    def lanes(self) -> list[tuple[str, int]]:
        """(lane, last served turn) for every lane with starts waiting, in the lanes'
        order."""
        return sorted(self._lanes().items())

    def _lanes(self) -> dict[str, int]:
        """The lanes and their turns, read from their markers once and then kept in the
        transaction's memo, which this queue, the markers' one writer, keeps true: a
        release no longer opens an iterator over the markers (whose range the lanes
        emptied before have left with tombstones) to find the one lane a budget has."""
        lanes: dict[str, int] | None = _memo(self.tx, self._lanes_prefix)
        if lanes is None:
            lanes = {key[len(self._lanes_prefix):].decode(): _turn(value)[0]
                     for key, value in self.tx.items(self._lanes_prefix)}
            _set_memo(self.tx, self._lanes_prefix, lanes)
        return lanes

    def _alone(self, lane: str) -> bool:
        """Whether `lane` is the only lane waiting, and has not begun a run of turns in a
        row (a weight above 1 it was served under before)."""
        lanes = self._lanes()
        if len(lanes) != 1 or lane not in lanes:
            return False
        return b":" not in (self.tx.get(self._lanes_prefix + lane.encode()) or b":")

    def _set_marker(self, lane: str, turn: int, raw: bytes) -> None:
        self.tx.put(self._lanes_prefix + lane.encode(), raw)
        lanes: dict[str, int] | None = _memo(self.tx, self._lanes_prefix)
        if lanes is not None:
            lanes[lane] = turn

    def __len__(self) -> int:
        return self.tx.count(self._total_key) or 0

    def _add(self, n: int) -> None:
        total = len(self) + n
        if total:
            self.tx.set_count(self._total_key, total)
        else:
            self.tx.set_count(self._total_key, None)
            self.tx.delete(self._turn_key)

    def next(self, among: Callable[[str], bool] | None = None) -> tuple[str, Parked] | None:
        """The start to serve next: in `strict` mode the head with the highest priority,
        among equal priorities the lane served least recently; in `age` mode the head
        with the earliest arrival less its boost, then the earliest arrival, then the lane
        served least recently. With `among`, only the lanes it accepts (a floor's)."""
        if not self.tx.count(self._total_key):
            # Nothing waits: one point read, where listing the lanes is an iterator over a
            # range that the lanes emptied before have left with tombstones. A key that
            # keeps up with its arrivals asks this at every release.
            return None
        age = self.mode == "age"
        fair = self.fair
        best: tuple[float, int, int, str, Parked] | None = None
        for name, turn in self.lanes():
            if among is not None and not among(name):
                continue
            # A lane is listed only while it holds starts.
            head = self.lane(name).head()
            if head is None:
                continue
            start = head.start
            if age and not fair:
                candidate = (rank(start, "age"), start.arrived_at_ms, turn, name, head)
            else:
                candidate = (0.0 if age else -start.priority, 0, turn, name, head)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
        if best is None:
            return None
        return best[3], best[4]

    def take(self, lane: str, parked: Parked, weight: int = 1) -> None:
        """Remove a served start; its lane goes to the back of the round once it has had
        `weight` turns in a row."""
        if weight == 1 and self._alone(lane):
            # The only lane waiting has nobody to take turns with: its marker and the
            # round's counter stay as they are. A lane that joins later still gets a turn
            # past every marker, so it is served after this one, as when each take moved
            # this lane to the back (docs/decisions/queue-head-memo.md).
            self._remove(lane, parked)
            return
        raw = self.tx.get(self._turn_key)
        turn = int(raw) + 1 if raw else 1
        self.tx.put(self._turn_key, str(turn).encode())
        if not self._remove(lane, parked):
            return
        if weight > 1:
            kept, used = _turn(self.tx.get(self._lanes_prefix + lane.encode()) or b"0")
            if used + 1 < weight:
                # More turns in a row: its place in the round stays.
                self._set_marker(lane, kept, f"{kept}:{used + 1}".encode())
                return
        self._set_marker(lane, turn, str(turn).encode())

    def remove(self, lane: str, parked: Parked) -> None:
        """Remove a start that was not served (it expired, its workflow went away): its
        lane keeps its place in the round."""
        self._remove(lane, parked)

    def _remove(self, lane: str, parked: Parked) -> bool:
        """Whether the lane still has starts waiting after removing `parked`."""
        queue = self.lane(lane)
        queue.remove(parked)
        self._add(-1)
        if len(queue) == 0:
            self.tx.delete(self._lanes_prefix + lane.encode())
            lanes: dict[str, int] | None = _memo(self.tx, self._lanes_prefix)
            if lanes is not None:
                lanes.pop(lane, None)
            return False
        return True
