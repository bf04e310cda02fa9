"""The pending queues of a memory store held as values (docs/decisions/queues-held-as-values.md).

A queue's rows (admission/pending.py: the queue's length-prefixed name, the start's rank
and a sequence, 8 bytes each, then "h" when it came with headers) are still the queue's
durable copy, in the stage's changelog. In a memory store, whose working copy is rebuilt
from that changelog at every assignment, they are kept here as what they are, each queue
its rows in order: taking the head moves an index and parking behind the last appends,
with no store row, no ordered index of the store, no floor and no memo to keep true. The
count, the sequence and the last row of a queue are the structure's own.

`QueueValues` is the `engine.held.Holder` of the queue table: the store reads and writes
its rows as bytes through it (a restore's replay, `derive`, an inspection), and a
transaction's writes to it are undone, last first, when the transaction aborts.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from heapq import merge
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from sluicegate.engine.tables import TableSpec

_ABSENT: Any = object()
# The sets and dict a lane makes only once it needs them (most lanes never do).
_NONE: frozenset[int] = frozenset()
_NO_VALUES: dict[bytes, bytes] = {}
_RANK_AND_SEQ = struct.Struct(">QQ")
# A queue is compacted at a commit once it has taken this many rows from its front and
# they are at least half of what it holds.
_COMPACT_AT = 64


class Lane:
    """One queue's rows.

    The rows that came in above every row before them (every start of a FIFO queue) are
    packed in arrival order, which is their order: their values joined in `data` (less
    the `cut` bytes taken from its front), where row i's value is `data[offs[i] - cut:
    offs[i + 1] - cut]`, and their keys as the rank and sequence of each (`ranks`,
    `seqs`; `marked` holds the sequences of the rows whose key ends in "h"). A row taken
    from the front moves `front` past it; one removed from behind the front is a sequence
    in `dead`, passed over when the front reaches it. The rows that came in below the last
    of those (a start of a higher priority) are in `side`, sorted, with their values in
    `side_values`. About 190 bytes a waiting start of 167 encoded, where a bytes object,
    a key and a dict entry each cost about 310.

    `last`: the key of the last packed row; `seq`: the highest sequence of its rows;
    `head`: what the queue made of its first row (the start decoded), while it is first."""

    __slots__ = ("cut", "data", "dead", "front", "head", "last", "live", "marked", "name",
                 "offs", "ranks", "seq", "seqs", "side", "side_values")

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.data = bytearray()
        self.cut = 0
        self.offs = array("Q", (0,))
        self.ranks = array("Q")
        self.seqs = array("Q")
        self.marked: set[int] | frozenset[int] = _NONE
        self.front = 0
        self.dead: set[int] | frozenset[int] = _NONE
        self.live = 0
        self.side: SortedList | None = None
        self.side_values: dict[bytes, bytes] = _NO_VALUES
        self.last = b""
        self.seq = -1
        self.head: Any = None

    def __len__(self) -> int:
        return self.live + len(self.side_values)

    def key(self, i: int) -> bytes:
        seq = self.seqs[i]
        key = self.name + _RANK_AND_SEQ.pack(self.ranks[i], seq)
        return key + b"h" if self.marked and seq in self.marked else key

    def packed(self, row: bytes) -> int:
        """The index of `row` among the packed rows still held, or -1."""
        if len(row) < len(self.name) + 16:
            return -1
        rank, seq = _RANK_AND_SEQ.unpack_from(row, len(self.name))
        seqs, i = self.seqs, self.front
        if i == len(seqs) or seqs[i] != seq:
            # (The front's own row, most often: a head taken.)
            i = bisect_left(seqs, seq, i)
        if (i == len(seqs) or seqs[i] != seq or self.ranks[i] != rank
                or seq in self.dead or (len(row) > len(self.name) + 16) != (seq in self.marked)):
            return -1
        return i

    def value(self, row: bytes) -> bytes | None:
        i = self.packed(row)
        if i < 0:
            return self.side_values.get(row)
        cut, offs = self.cut, self.offs
        return bytes(self.data[offs[i] - cut:offs[i + 1] - cut])

    def rows(self) -> Iterator[bytes]:
        """The keys in order: a copy, so the queue may change while they are read."""
        dead, seqs = self.dead, self.seqs
        packed = [self.key(i) for i in range(self.front, len(seqs))
                  if not dead or seqs[i] not in dead]
        return merge(packed, list(self.side)) if self.side else iter(packed)

    def problems(self) -> list[str]:
        """What breaks the lane's rule (for tests): packed keys out of order, a count that
        is not its rows', a side key not below the last packed one."""
        out: list[str] = []
        name = self.name
        keys = [self.key(i) for i in range(len(self.seqs))]
        if keys != sorted(set(keys)) or (keys and keys[-1] != self.last):
            out.append(f"queue {name!r}: its packed keys are not ascending up to its last")
        if len(self.offs) != len(self.seqs) + 1 or len(self.ranks) != len(self.seqs):
            out.append(f"queue {name!r}: its arrays do not agree")
        live = [i for i in range(self.front, len(self.seqs)) if self.seqs[i] not in self.dead]
        if len(live) != self.live or any(s < self.seqs[self.front] for s in self.dead
                                         if self.front < len(self.seqs)):
            out.append(f"queue {name!r}: it counts {self.live} packed rows, holds {len(live)}")
        side = list(self.side or ())
        if sorted(side) != sorted(self.side_values) or (side and side[-1] >= self.last):
            out.append(f"queue {name!r}: its side rows are not its side values below its last")
        return out


def _lane_name(key: bytes, table: int) -> bytes:
    """The queue's name in a row's key: the table's prefix, its length, the name."""
    (size,) = struct.unpack_from(">H", key, table)
    return key[:table + 2 + size]


class QueueValues:
    """The queue table of one memory store: its queues by the prefix of their rows (the
    table's prefix and the queue's length-prefixed name)."""

    __slots__ = ("_table", "_touched", "_undo", "lanes", "prefix", "spec")

    def __init__(self, spec: TableSpec[Any, Any], undo: list[Any]) -> None:
        self.spec = spec
        self.prefix = spec.prefix
        self._table = len(spec.prefix)
        self.lanes: dict[bytes, Lane] = {}
        self._undo = undo
        # Lanes written since the last commit: dropped then if empty, else compacted if
        # their front has moved far enough.
        self._touched: set[Lane] = set()

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())

    # -- the queue's own calls (admission/pending.py) ------------------------------------

    def put(self, name: bytes, row: bytes, value: bytes, counted: int) -> int | None:
        """Write `row`, a new row of the queue whose rows start with `name`; its position
        (the rows ahead of it), counted up to `counted` rows for a row that goes in below
        the queue's last (None past them)."""
        lane = self.lanes.get(name)
        if lane is None:
            lane = self.lanes[name] = Lane(name)
        self._touched.add(lane)
        rank, seq = _RANK_AND_SEQ.unpack_from(row, len(name))
        self._undo.append((self, ("put", lane, row), (lane.last, lane.seq)))
        if seq > lane.seq:
            lane.seq = seq
        if row > lane.last:
            lane.data += value
            lane.offs.append(lane.offs[-1] + len(value))
            lane.ranks.append(rank)
            lane.seqs.append(seq)
            if len(row) > len(name) + 16:
                if not lane.marked:
                    lane.marked = set()
                lane.marked.add(seq)  # type: ignore[union-attr]
            lane.live += 1
            lane.last = row
            return len(lane) - 1
        if lane.side is None:
            lane.side = SortedList()
            lane.side_values = {}
        lane.side.add(row)
        lane.side_values[row] = value
        lane.head = None
        return self._position(lane, row, counted)

    @staticmethod
    def _position(lane: Lane, row: bytes, counted: int) -> int | None:
        assert lane.side is not None
        ahead = lane.side.bisect_left(row)
        seqs, dead = lane.seqs, lane.dead
        for i in range(lane.front, len(seqs)):
            if ahead > counted or lane.key(i) >= row:
                break
            if seqs[i] not in dead:
                ahead += 1
        return ahead if ahead <= counted else None

    def delete(self, name: bytes, row: bytes) -> None:
        lane = self.lanes.get(name)
        if lane is None:
            return
        i = lane.packed(row)
        if i >= 0:
            if i == lane.front:
                lane.front += 1
                self._undo.append((self, ("front", lane, row), None))
            else:
                if not lane.dead:
                    lane.dead = set()
                lane.dead.add(lane.seqs[i])  # type: ignore[union-attr]
                self._undo.append((self, ("dead", lane, row), lane.seqs[i]))
            lane.live -= 1
        else:
            value = lane.side_values.pop(row, _ABSENT)
            if value is _ABSENT:
                return
            assert lane.side is not None
            lane.side.remove(row)
            self._undo.append((self, ("side", lane, row), value))
        self._touched.add(lane)
        if lane.head is not None and lane.head.row == row:
            lane.head = None

    def forget(self, name: bytes) -> None:
        """An empty queue that may not be used again goes now, not at the commit: one made
        again under its name starts its sequence again, so a start parked there in this
        cycle takes the row of the start just removed, and the changelog gets one row
        for both (as a queue kept as rows does: `PendingQueue.forget`)."""
        lane = self.lanes.get(name)
        if lane is not None and not len(lane):
            del self.lanes[name]
            self._undo.append((self, ("forget", lane, b""), None))

    def first(self, lane: Lane) -> bytes | None:
        """The lane's first row, passing over the rows removed from behind the front."""
        seqs, dead = lane.seqs, lane.dead
        while dead and lane.front < len(seqs) and seqs[lane.front] in dead:
            dead.discard(seqs[lane.front])  # type: ignore[union-attr]
            lane.front += 1
            self._undo.append((self, ("pass", lane, b""), None))
        head = lane.key(lane.front) if lane.front < len(seqs) else None
        side = lane.side
        if side and (head is None or side[0] < head):
            return side[0]
        return head

    def undo(self, at: tuple[str, Lane, bytes], old: Any) -> None:
        how, lane, row = at
        lane.head = None
        if how == "forget":
            self.lanes[lane.name] = lane
        elif how == "put":
            lane.last, lane.seq = old
            if lane.side_values.pop(row, None) is not None:
                assert lane.side is not None
                lane.side.remove(row)
                return
            seq = lane.seqs.pop()
            lane.ranks.pop()
            lane.offs.pop()
            del lane.data[lane.offs[-1] - lane.cut:]
            if lane.marked:
                lane.marked.discard(seq)  # type: ignore[union-attr]
            lane.live -= 1
        elif how == "front":
            lane.front -= 1
            lane.live += 1
        elif how == "dead":
            lane.dead.discard(old)  # type: ignore[union-attr]
            lane.live += 1
        elif how == "pass":
            lane.front -= 1
            if not lane.dead:
                lane.dead = set()
            lane.dead.add(lane.seqs[lane.front])  # type: ignore[union-attr]
        else:  # "side"
            assert lane.side is not None
            lane.side.add(row)
            lane.side_values[row] = old

    def keep(self) -> None:
        """The transaction committed: the lanes it emptied go, and those whose front has
        moved far drop what is behind it."""
        if not self._touched:
            return
        lanes = self.lanes
        for lane in self._touched:
            if not len(lane):
                if lanes.get(lane.name) is lane:
                    del lanes[lane.name]
            elif lane.front >= _COMPACT_AT and lane.front * 2 >= len(lane.seqs):
                self._compact(lane)
        self._touched.clear()

    @staticmethod
    def _compact(lane: Lane) -> None:
        front = lane.front
        start = lane.offs[front]
        del lane.data[:start - lane.cut]
        lane.cut = start
        del lane.offs[:front]
        del lane.ranks[:front]
        del lane.seqs[:front]
        lane.front = 0
        if lane.marked:
            kept = {seq for seq in lane.marked if lane.seqs and seq >= lane.seqs[0]}
            lane.marked = kept or _NONE

    def clear(self) -> None:
        self.lanes.clear()
        self._touched.clear()

    # -- as rows, for the store's own reads and writes ---------------------------------

    def get_row(self, key: bytes) -> bytes | None:
        lane = self.lanes.get(_lane_name(key, self._table))
        return None if lane is None else lane.value(key)

    def items(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows under `prefix` from `start` on, in key order: one queue's, looked up,
        when `prefix` holds a whole name, else those of every queue it covers, sorted."""
        table = self._table
        if len(prefix) >= table + 2 and len(prefix) >= table + 2 + int.from_bytes(
                prefix[table:table + 2], "big"):
            found = _lane_name(prefix, table)
            names = [found] if found in self.lanes else []
        else:
            names = sorted(n for n in self.lanes if n.startswith(prefix))
        for name in names:
            lane = self.lanes[name]
            for row in lane.rows():
                if row >= start and row.startswith(prefix):
                    value = lane.value(row)
                    if value is not None:
                        yield row, value

    def write_row(self, key: bytes, value: bytes | None) -> None:
        """A row a restore replays (not undone): written as the queue writes it, its undo
        entries dropped."""
        mark = len(self._undo)
        name = _lane_name(key, self._table)
        lane = self.lanes.get(name)
        if value is not None and (lane is None or key > lane.last):
            # A row past the queue's last: most of a replay.
            self.put(name, key, value, 0)
            del self._undo[mark:]
            return
        if lane is not None and lane.value(key) is not None:
            self.delete(name, key)  # a put over a row held: written again below
        if value is not None:
            self.put(name, key, value, 0)
        del self._undo[mark:]
        lane = self.lanes.get(name)
        if lane is not None:
            self.first(lane)  # the rows removed at the front passed over
            del self._undo[mark:]
            if not len(lane):
                del self.lanes[name]
            self._touched.discard(lane)

    def problems(self) -> list[str]:
        return [problem for lane in self.lanes.values() for problem in lane.problems()]
