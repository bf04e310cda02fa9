"""The pending queues of a memory store held as values (docs/decisions/queues-held-as-values.md).

A queue's rows (admission/pending.py: the queue's length-prefixed name, the start's rank
and a sequence, 8 bytes each, then "h" when it came with headers) are still the queue's
durable copy, in the stage's changelog. In a memory store, whose working copy is rebuilt
from that changelog at every assignment, they are kept here as what they are, each queue
its rows in order: taking the head is a deque operation and parking behind the last an
append, with no store row, no ordered index of the store, no floor and no memo to keep
true. The count, the sequence and the last row of a queue are the structure's own.

`QueueValues` is the `engine.held.Holder` of the queue table: the store reads and writes
its rows as bytes through it (a restore's replay, `derive`, an inspection), and a
transaction's writes to it are undone, last first, when the transaction aborts.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from heapq import merge
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

if TYPE_CHECKING:
    from sluicegate.engine.tables import TableSpec

_ABSENT: Any = object()
# A row's rank and sequence, after its queue's name.
_RANK = 8


class Lane:
    """One queue's rows. `values` holds each row's value by key; the keys are in order in
    `order`, the keys that came in above every key before them (appended: every key of a
    FIFO queue), and `side`, the keys that came in below the last of those (a start of a
    higher priority), a sorted list made when one does. A key removed from inside `order`
    stays there, skipped once it reaches the left end. `last`: the highest key `order`
    has held; `seq`: the highest sequence of its keys; `head`: what the queue made of its
    first row (its start decoded), while that row is first."""

    __slots__ = ("head", "last", "order", "seq", "side", "values")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.order: deque[bytes] = deque()
        self.side: SortedList | None = None
        self.last = b""
        self.seq = -1
        self.head: Any = None

    def __len__(self) -> int:
        return len(self.values)

    def rows(self) -> Iterator[bytes]:
        """The keys in order: a copy, so the queue may change while they are read."""
        values = self.values
        ordered = [key for key in self.order if key in values]
        return merge(ordered, list(self.side)) if self.side else iter(ordered)

    def problems(self, name: bytes) -> list[str]:
        """What breaks the lane's rule (for tests): keys out of order, keys held twice or
        not at all, a key of `order` above `last`."""
        out: list[str] = []
        order = list(self.order)
        if order != sorted(set(order)):
            out.append(f"queue {name!r}: its appended keys are not ascending")
        if order and order[-1] > self.last:
            out.append(f"queue {name!r}: a key above its last")
        side = list(self.side or ())
        if side and (self.last == b"" or side[-1] >= self.last):
            out.append(f"queue {name!r}: a key of the side list not below its last")
        live = [key for key in order if key in self.values] + side
        if sorted(live) != sorted(self.values) or len(set(live)) != len(live):
            out.append(f"queue {name!r}: its keys in order are not the keys it holds")
        return out


def _lane_prefix(key: bytes, table: int) -> bytes:
    """The queue's name in a row's key: the table's prefix, its length, the name."""
    (size,) = struct.unpack_from(">H", key, table)
    return key[:table + 2 + size]


class QueueValues:
    """The queue table of one memory store: its queues by the prefix of their rows (the
    table's prefix and the queue's length-prefixed name)."""

    __slots__ = ("_emptied", "_table", "_undo", "lanes", "prefix", "spec")

    def __init__(self, spec: TableSpec[Any, Any], undo: list[Any]) -> None:
        self.spec = spec
        self.prefix = spec.prefix
        self._table = len(spec.prefix)
        self.lanes: dict[bytes, Lane] = {}
        self._undo = undo
        # Lanes emptied since the last commit: dropped then, if still empty.
        self._emptied: set[bytes] = set()

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())

    # -- the queue's own calls (admission/pending.py) ------------------------------------

    def put(self, name: bytes, row: bytes, value: bytes, counted: int) -> int | None:
        """Write `row` of the queue whose rows start with `name`; its position (the rows
        ahead of it), counted up to `counted` rows for a row that goes in below the
        queue's last (None past them)."""
        lane = self.lanes.get(name)
        if lane is None:
            lane = self.lanes[name] = Lane()
        values = lane.values
        (seq,) = struct.unpack_from(">Q", row, len(name) + _RANK)
        old = values.get(row, _ABSENT)
        self._undo.append((self, ("put", lane, row), (old, lane.last, lane.seq)))
        if seq > lane.seq:
            lane.seq = seq
        values[row] = value
        if old is not _ABSENT:
            lane.head = None
            return self._position(lane, row, counted)
        if row > lane.last:
            lane.order.append(row)
            lane.last = row
            return len(values) - 1
        if lane.side is None:
            lane.side = SortedList()
        lane.side.add(row)
        lane.head = None
        return self._position(lane, row, counted)

    @staticmethod
    def _position(lane: Lane, row: bytes, counted: int) -> int | None:
        values = lane.values
        ahead = lane.side.bisect_left(row) if lane.side else 0
        for key in lane.order:
            if key >= row or ahead > counted:
                break
            if key in values:
                ahead += 1
        return ahead if ahead <= counted else None

    def delete(self, name: bytes, row: bytes) -> None:
        lane = self.lanes.get(name)
        if lane is None:
            return
        value = lane.values.pop(row, _ABSENT)
        if value is _ABSENT:
            return
        order = lane.order
        if order and order[0] == row:
            order.popleft()
            how = "left"
        elif lane.side and row < lane.last and row in lane.side:
            lane.side.remove(row)
            how = "side"
        else:
            how = "inside"  # skipped once it reaches the left end
        self._undo.append((self, (how, lane, row), value))
        if lane.head is not None and lane.head.row == row:
            lane.head = None
        if not lane.values:
            self._emptied.add(name)

    def first(self, lane: Lane) -> bytes | None:
        """The lane's first row, the keys removed from inside it before it dropped."""
        order, values = lane.order, lane.values
        while order and order[0] not in values:
            self._undo.append((self, ("skip", lane, order.popleft()), None))
        head = order[0] if order else None
        side = lane.side
        if side and (head is None or side[0] < head):
            return side[0]
        return head

    def undo(self, at: tuple[str, Lane, bytes], old: Any) -> None:
        how, lane, row = at
        lane.head = None
        if how == "put":
            value, lane.last, lane.seq = old
            if value is not _ABSENT:
                lane.values[row] = value
                return
            del lane.values[row]
            if lane.order and lane.order[-1] == row:
                lane.order.pop()
            else:
                assert lane.side is not None
                lane.side.remove(row)
        elif how == "skip":
            lane.order.appendleft(row)
        else:
            lane.values[row] = old
            if how == "left":
                lane.order.appendleft(row)
            elif how == "side":
                assert lane.side is not None
                lane.side.add(row)

    def keep(self) -> None:
        """The transaction committed: the lanes it emptied go."""
        if self._emptied:
            lanes = self.lanes
            for name in self._emptied:
                lane = lanes.get(name)
                if lane is not None and not lane.values:
                    del lanes[name]
            self._emptied.clear()

    def clear(self) -> None:
        self.lanes.clear()
        self._emptied.clear()

    # -- as rows, for the store's own reads and writes ---------------------------------

    def get_row(self, key: bytes) -> bytes | None:
        lane = self.lanes.get(_lane_prefix(key, self._table))
        return None if lane is None else lane.values.get(key)

    def items(self, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows under `prefix` from `start` on, in key order."""
        for name in sorted(n for n in self.lanes
                           if n.startswith(prefix) or prefix.startswith(n)):
            lane = self.lanes[name]
            values = lane.values
            for row in lane.rows():
                if row >= start and row.startswith(prefix):
                    value = values.get(row)
                    if value is not None:
                        yield row, value

    def write_row(self, key: bytes, value: bytes | None) -> None:
        """A row a restore replays (not undone)."""
        name = _lane_prefix(key, self._table)
        lane = self.lanes.get(name)
        if value is None:
            if lane is None or lane.values.pop(key, None) is None:
                return
            lane.head = None
            if lane.side and key in lane.side:
                lane.side.remove(key)
            elif lane.order and lane.order[0] == key:
                lane.order.popleft()
            if not lane.values:
                del self.lanes[name]
            return
        if lane is None:
            lane = self.lanes[name] = Lane()
        (seq,) = struct.unpack_from(">Q", key, len(name) + _RANK)
        lane.seq = max(lane.seq, seq)
        if key not in lane.values:
            order = lane.order
            if key > lane.last:
                order.append(key)
                lane.last = key
            else:
                at = bisect_left(order, key)
                if at == len(order) or order[at] != key:
                    # (Else it was removed from inside `order` and is back in its place.)
                    if lane.side is None:
                        lane.side = SortedList()
                    lane.side.add(key)
        lane.values[key] = value
        lane.head = None

    def problems(self) -> list[str]:
        return [problem for name, lane in self.lanes.items() for problem in lane.problems(name)]
