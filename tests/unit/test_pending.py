"""A parked start keeps the Kafka headers it came with, to send them on when it leaves
(docs/decisions/record-headers.md): across a restart, through every way out of a queue,
at no cost to a start that came with none."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluicegate.admission.pending import (
    COUNTED,
    DERIVED,
    FairQueue,
    Parked,
    PendingQueue,
    agrees,
    derive,
    index_problems,
    pack_headers,
    unpack_headers,
)
from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.stage import Headers
from sluicegate.engine.store import PartitionStore, StoreTransaction
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedKind, Origin, PendingStart

HEADERS: Headers = [("sluicegate.cancelOn.group", b'{"batch":false}'), ("other", b"")]
HEADER_ROWS = b"\x00SP"  # where a parked start's headers are kept
HEAD_ROWS = 4  # the first rows of a queue its memo reads at once (pending._HEAD_ROWS)


def _header_rows(tx: StoreTransaction | PartitionStore) -> list[bytes]:
    return [key for key, _ in tx.items(HEADER_ROWS)]


def _start(n: int, priority: float = 0.0) -> PendingStart:
    return PendingStart(
        execution_id=f"x{n}", workflow="w", payload=b"{}", origin=Origin.event,
        kind=AdmittedKind.start, declaration_version="v", hop=1, request_id=f"r{n}",
        request_ids=[f"r{n}"], requested_at_ms=n, arrived_at_ms=n, priority=priority,
        slots=[])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    with PartitionStore(tmp_path / "stage-0") as s:
        yield s


def test_a_start_parked_with_headers_leaves_with_them_and_one_without_has_none(
        store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"q")
    plain, with_headers = queue.park(_start(0))[0], queue.park(_start(1), headers=HEADERS)[0]
    assert plain.headers is None and with_headers.headers == HEADERS
    assert [p.headers for p in queue] == [None, HEADERS]
    assert queue.at(with_headers.row) == with_headers
    # Headers do not change the order: still first in, first out.
    assert [p.start.execution_id for p in queue] == ["x0", "x1"]
    assert queue.pop() == plain
    assert len(_header_rows(tx)) == 1
    assert queue.pop() == with_headers
    assert _header_rows(tx) == [], "the headers leave with their start"


def test_headers_survive_a_restart_and_every_way_out_of_a_queue_takes_them(
        store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    fair = FairQueue(tx, b"budget")
    fair.park("lane-a", _start(0), HEADERS)
    fair.park("lane-b", _start(1), HEADERS)
    queue = PendingQueue(tx, b"q")
    for n in range(2, 5):
        queue.push(_start(n), headers=HEADERS)
    tx.commit(0)
    assert len(_header_rows(store)) == 5

    tx = StoreTransaction(store)  # a restart: the rows come back as they were committed
    fair = FairQueue(tx, b"budget")
    served = fair.next()
    assert served is not None and served[1].headers == HEADERS
    fair.take(*served)
    other = fair.next()
    assert other is not None
    fair.remove(*other)
    queue = PendingQueue(tx, b"q")
    head = queue.peek()
    assert head is not None and head.headers == HEADERS
    queue.remove(head)
    queue.clear()
    tx.commit(1)
    assert _header_rows(store) == []


def test_a_start_without_headers_costs_no_row_beside_its_own(store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    PendingQueue(tx, b"q").push(_start(0), headers=[])
    queued = PendingQueue(tx, b"q").peek()
    assert queued is not None and queued.headers is None
    assert _header_rows(tx) == []


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5))
def test_headers_pack_and_unpack_to_themselves(headers: list[tuple[str, bytes]]) -> None:
    assert unpack_headers(pack_headers(list(headers))) == headers


class QueueMachine(RuleBasedStateMachine):
    """A PendingQueue over a real store vs. a sorted list, through commits, aborts and
    restarts: the floor it reads from (docs/decisions/store-buffer-index.md) never hides a
    start, whether it was taken from the head, removed from the middle, or parked ahead
    of the head with a higher priority."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluicegate-queue-"))
        self.store = PartitionStore(self.dir / "s")
        self._open()
        self.n = 0
        self.offset = -1
        # (-priority, arrival, id): the queue's order.
        self.committed: list[tuple[float, int, str]] = []
        self.live: list[tuple[float, int, str]] = []

    def _open(self) -> None:
        self.tx = StoreTransaction(self.store)
        self.queue = PendingQueue(self.tx, b"q")

    def _find(self, execution_id: str) -> Parked:
        return next(p for p in self.queue if p.start.execution_id == execution_id)

    @rule(priority=st.sampled_from([0.0, 0.0, 1.0, 5.0]))
    def park(self, priority: float) -> None:
        self.n += 1
        self.queue.push(_start(self.n, priority))
        self.live = sorted([*self.live, (-priority, self.n, f"x{self.n}")])

    @rule()
    def take_the_head(self) -> None:
        taken = self.queue.pop()
        if not self.live:
            assert taken is None
            return
        assert taken is not None and taken.start.execution_id == self.live.pop(0)[2]

    @rule(data=st.data())
    def remove_any(self, data: st.DataObject) -> None:
        if self.live:
            entry = data.draw(st.sampled_from(self.live))
            self.queue.remove(self._find(entry[2]))
            self.live.remove(entry)

    @rule()
    def clear(self) -> None:
        self.queue.clear()
        self.live = []

    @rule()
    def commit(self) -> None:
        if self.tx:
            self.offset += 1
        self.tx.commit(self.offset)
        self.committed = list(self.live)

    @rule()
    def abort(self) -> None:
        self.tx.discard()
        self.live = list(self.committed)

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = PartitionStore(self.dir / "s")
        self._open()
        self.live = list(self.committed)

    @invariant()
    def the_queue_matches_the_model(self) -> None:
        # Its index (floor, first rows) agrees with its rows before, and after, it is read.
        assert index_problems(self.tx) == []
        head = self.queue.peek()
        assert (head.start.execution_id if head else None) == (
            self.live[0][2] if self.live else None)
        assert [p.start.execution_id for p in self.queue] == [e[2] for e in self.live]
        assert len(self.queue) == len(self.live)
        assert index_problems(self.tx) == []

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


QueueMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_a_queue_behaves_like_a_sorted_list = QueueMachine.TestCase


def test_a_queue_whose_head_was_taken_reads_its_next_start_without_walking_the_taken(
    store: PartitionStore,
) -> None:
    """The rows taken from the head, deleted in this cycle and tombstones once committed,
    are not read again by the next peek: taking 150 starts one by one reads each stored
    row about once, not the taken ones at every take. And the queue's memo reads a few
    rows at a time, so a take is not an iterator over the store each
    (docs/decisions/queue-head-memo.md)."""
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"q")
    for n in range(200):
        queue.push(_start(n))
    tx.commit(0)
    stored_rows_read = []
    reads = 0
    original = store.items

    def counting(prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        nonlocal reads
        reads += 1
        for row in original(prefix, start):
            stored_rows_read.append(row[0])
            yield row

    store.items = counting  # type: ignore[method-assign]
    for n in range(150):
        taken = queue.pop()
        assert taken is not None and taken.start.execution_id == f"x{n}"
    head = queue.peek()
    assert head is not None and head.start.execution_id == "x150"
    assert len(stored_rows_read) <= 150 + HEAD_ROWS
    assert len(set(stored_rows_read)) == len(stored_rows_read)
    assert reads <= 150 // HEAD_ROWS + 1


def _record_reads(store: PartitionStore) -> list[tuple[bytes, bytes | None]]:
    """From now on, every ordered read of `store`: (prefix, where it starts)."""
    reads: list[tuple[bytes, bytes | None]] = []
    original = store.items

    def recording(prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        reads.append((prefix, start))
        return original(prefix, start)

    store.items = recording  # type: ignore[method-assign]
    return reads


def test_an_empty_fair_queue_is_answered_without_listing_its_lanes(
    store: PartitionStore,
) -> None:
    """A key that keeps up with its arrivals asks for its next start at every release:
    with nothing waiting, the answer is one point read, not a walk over the lanes (whose
    range keeps the tombstones of every lane that emptied)."""
    tx = StoreTransaction(store)
    queue = FairQueue(tx, b"budget")
    for n in range(50):
        queue.park(f"lane{n}", _start(n))
    tx.commit(0)
    while (head := queue.next()) is not None:
        queue.take(*head)
    tx.commit(1)
    reads = _record_reads(store)
    assert queue.next() is None
    assert reads == []
    queue.park("lane7", _start(99))
    head = queue.next()
    assert head is not None and head[1].start.execution_id == "x99"


def test_an_empty_queue_is_answered_without_an_ordered_read(store: PartitionStore) -> None:
    """A throttle key on pace looks at its queue's head at every start and every turn of
    its timer, and nothing waits there: one point read of the count, no iterator
    (docs/decisions/empty-queue-reads.md)."""
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"key")
    queue.park(_start(0))
    tx.commit(0)
    assert queue.pop() is not None
    tx.commit(1)
    reads = _record_reads(store)
    assert queue.peek() is None and queue.pop() is None
    assert reads == []
    queue.park(_start(1))
    head = queue.peek()
    assert head is not None and head.start.execution_id == "x1"


def _bookkeeping(tx: StoreTransaction) -> dict[bytes, bytes]:
    return {key: value for prefix in DERIVED for key, value in tx.items(prefix)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["park", "take", "remove", "commit"]),
                          st.sampled_from(["a", "b", "c"]),
                          st.sampled_from([0.0, 0.0, 1.0, 5.0])), max_size=40),
       st.sampled_from(["strict", "age"]))
def test_the_queues_bookkeeping_is_what_derive_makes_from_their_rows(
        ops: list[tuple[str, str, float]], mode: str) -> None:
    """Counts, sequences, last rows and a fair queue's total are kept up to date as starts
    park and leave, and never logged: at every step they are what `derive` makes from
    the queues' rows at a restore, an emptied queue leaving none behind."""
    tx = StoreTransaction(MemoryStore())
    fair = FairQueue(tx, b"budget\x1fkey", mode)
    alone = PendingQueue(tx, b"alone")
    n = 0
    offset = 0
    for op, lane, priority in ops:
        if op == "park":
            n += 1
            fair.park(lane, _start(n, priority))
            alone.park(_start(n, priority), mode)
        elif op == "take":
            head = fair.next()
            if head is not None:
                fair.take(*head)
            alone.pop()
        elif op == "remove":
            head = fair.next()
            if head is not None:
                fair.remove(*head)
        else:
            tx.commit(offset)
            offset += 1
        kept, derived = _bookkeeping(tx), derive(tx)
        assert agrees(kept, derived), (kept, derived)


def test_a_key_that_never_queued_is_forgotten_without_writing_anything(
    store: PartitionStore,
) -> None:
    """Forgetting an idle queue deletes its sequence row only when it has one: a key whose
    starts all went through on arrival logs no tombstone to its changelog."""
    tx = StoreTransaction(store)
    PendingQueue(tx, b"idle").forget()
    assert tx.changes == {}
    used = PendingQueue(tx, b"used")
    used.park(_start(0))
    assert used.pop() is not None
    tx.commit(0)
    used.forget()
    # Its sequence row goes, and nothing else is written.
    assert list(tx.changes.values()) == [None]


def test_a_queue_emptied_at_once_reads_its_next_rows_without_walking_the_taken(
    store: PartitionStore,
) -> None:
    """A batch's items are read, then cleared, at every take: the rows of the batches
    taken before (deleted in this cycle, or tombstones once committed) are not read
    again, or each take costs as much as every take before it."""
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"batch")
    for batch in range(20):
        for n in range(10):
            queue.push(_start(batch * 10 + n))
        if batch % 2:
            tx.commit(batch)
        taken = list(queue)
        assert [p.start.execution_id for p in taken] == [f"x{batch * 10 + n}" for n in range(10)]
        last_taken = taken[-1].row
        queue.clear()
    tx.commit(99)
    for n in range(200, 210):
        queue.push(_start(n))
    reads = _record_reads(store)
    assert [p.start.execution_id for p in queue] == [f"x{n}" for n in range(200, 210)]
    queue.clear()
    # Every read of the store starts past the 200 rows taken before (RocksDB would step
    # over their tombstones one by one).
    assert reads and all(start is not None and start > last_taken for _, start in reads)
    assert len(queue) == 0 and queue.peek() is None


class _Unremembering(StoreTransaction):
    """A transaction in which the queues keep no memo: every read goes to the rows."""

    def cache(self, owner: str) -> dict[Any, Any]:
        if owner == "queue memos":
            return {}  # a new one at every use: nothing kept
        return super().cache(owner)


class _TakingTurnsAlone(FairQueue):
    """A fair queue whose lane moves to the back of the round at every take, even when it
    is the only lane waiting (as every take did before the single-lane shortcut)."""

    def _alone(self, lane: str) -> bool:
        return False


class MemoMachine(RuleBasedStateMachine):
    """A fair queue that remembers its lanes and its lanes' first rows (the transaction's
    memo), and leaves a lone lane's turn alone, serves in the order of one that reads them
    from the store every time and moves a lane to the back at every take, through parks
    ahead of the head, takes with weights, removals from the middle, commits, aborts and
    restarts (docs/decisions/queue-head-memo.md)."""

    LANES = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluicegate-memo-"))
        self.stores = [PartitionStore(self.dir / "memo"), PartitionStore(self.dir / "plain")]
        self._open()
        self.n = 0
        self.offset = -1

    def _open(self) -> None:
        self.txs = [StoreTransaction(self.stores[0]), _Unremembering(self.stores[1])]
        self.queues = [FairQueue(self.txs[0], b"budget"),
                       _TakingTurnsAlone(self.txs[1], b"budget")]

    @rule(lane=st.sampled_from(LANES), priority=st.sampled_from([0.0, 0.0, 1.0, 5.0]),
          count=st.integers(1, 12))
    def park(self, lane: str, priority: float, count: int) -> None:
        for _ in range(count):
            self.n += 1
            positions = [q.push(lane, _start(self.n, priority)) for q in self.queues]
            assert positions[0] == positions[1]

    @rule(weight=st.sampled_from([1, 1, 2, 3]))
    def take_the_next(self, weight: int) -> None:
        heads = [q.next() for q in self.queues]
        if heads[0] is None:
            assert heads[1] is None
            return
        for queue, (lane, parked) in zip(self.queues, heads, strict=True):  # type: ignore[misc]
            queue.take(lane, parked, weight)

    @rule(data=st.data())
    def remove_any(self, data: st.DataObject) -> None:
        waiting = [(lane, p.start.execution_id) for lane in self.LANES
                   for p in self.queues[1].lane(lane)]
        if not waiting:
            return
        lane, execution_id = data.draw(st.sampled_from(waiting))
        for queue in self.queues:
            parked = next(p for p in queue.lane(lane) if p.start.execution_id == execution_id)
            queue.remove(lane, parked)

    @rule()
    def commit(self) -> None:
        self.offset += 1
        for tx in self.txs:
            tx.commit(self.offset)

    @rule()
    def abort(self) -> None:
        for tx in self.txs:
            tx.discard()

    @rule()
    def restart(self) -> None:
        for i, store in enumerate(self.stores):
            store.close()
            self.stores[i] = PartitionStore(store.path)
        self._open()

    @invariant()
    def both_answer_alike(self) -> None:
        assert index_problems(self.txs[0]) == []
        memo, plain = self.queues
        # The same lanes; their turns' numbers may differ, not their order.
        assert [lane for lane, _ in memo.lanes()] == [lane for lane, _ in plain.lanes()]
        assert ([lane for lane, _ in sorted(memo.lanes(), key=lambda lt: lt[1])]
                == [lane for lane, _ in sorted(plain.lanes(), key=lambda lt: lt[1])])
        assert len(memo) == len(plain)
        heads = [q.next() for q in self.queues]
        assert [None if h is None else (h[0], h[1].start.execution_id) for h in heads] == [
            None if h is None else (h[0], h[1].start.execution_id) for h in heads[::-1]]
        for lane in self.LANES:
            assert ([p.start.execution_id for p in memo.lane(lane)]
                    == [p.start.execution_id for p in plain.lane(lane)])

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


MemoMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                         deadline=None)
test_a_fair_queue_with_its_memo_answers_as_one_without = MemoMachine.TestCase


def test_a_queue_remembers_its_first_rows_only(store: PartitionStore) -> None:
    """The memo of a queue that was empty when read takes the starts parked after, but
    keeps only the first few: a million parked starts are not a million in memory."""
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"q")
    queue.push(_start(0))
    assert queue.peek() is not None  # read: the memo holds the queue, all of it
    for n in range(1, 100):
        queue.push(_start(n, priority=float(n % 3)))
    heads = tx.cache("queue memos").get(b"\x00SQ" + b"\x00\x01q")
    assert heads is not None and len(heads.rows) == HEAD_ROWS
    tx.commit(0)
    expected = [f"x{n}" for n in sorted(range(100), key=lambda n: (-(n % 3), n))]
    # What it keeps is the queue's head, and the queue's order past it is the store's.
    assert [codec.decode(PendingStart, value).execution_id if isinstance(value, bytes)
            else value.start.execution_id for _, value in heads.rows] == expected[:HEAD_ROWS]
    taken = [queue.pop() for _ in range(100)]
    assert [p.start.execution_id for p in taken if p is not None] == expected
    assert queue.peek() is None


def test_a_start_parked_ahead_of_a_deep_queue_is_counted_only_so_far(
    store: PartitionStore,
) -> None:
    """Its place in line is counted from the head, up to COUNTED starts ahead of it: a park
    into a priority queue thousands deep reads as few rows as one a hundred deep
    (docs/decisions/queue-position-bound.md). Behind the last, its place is the queue's
    count at any depth, without a read."""
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"q")
    # Priorities 0, -1, -2, ...: each new one is the last.
    for n in range(2_000):
        assert queue.push(_start(n, priority=float(-n))) == n
    tx.commit(0)
    rows_read = _record_rows_read(store)
    assert queue.push(_start(2_000, priority=float(-2_000))) == 2_000
    assert rows_read == []
    # Ahead of all but the first ten, and of all but the first COUNTED: counted.
    assert queue.push(_start(3_000, priority=-9.5)) == 10
    assert queue.push(_start(3_001, priority=-(COUNTED - 1.5))) == COUNTED
    rows_read.clear()
    # Ahead of all but the first 1,000: more than COUNTED, not counted.
    assert queue.push(_start(3_002, priority=-999.5)) is None
    assert len(rows_read) <= COUNTED + 2
    # And the queue's order is kept all the same.
    order = [p.start.execution_id for p in queue]
    assert order.index("x3002") == 1_002 and order.index("x3000") == 10


def _record_rows_read(store: PartitionStore) -> list[bytes]:
    """From now on, every row the store's ordered reads hand out."""
    rows: list[bytes] = []
    original = store.items

    def counting(prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for row in original(prefix, start):
            rows.append(row[0])
            yield row

    store.items = counting  # type: ignore[method-assign]
    return rows
