"""The queues a memory store holds as values (admission/queue_values.py) answer as the
queues kept as rows do, through commits, aborts and restores from their changelog."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluicegate.admission import pending
from sluicegate.admission.pending import FairQueue, HeldQueue, PendingQueue, index_problems
from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.store import StoreTransaction
from sluicegate.schemas.records import AdmittedKind, Origin, PendingStart

HEADERS = [("sluicegate.cancelOn.group", b'{"batch":false}')]


def _start(n: int, priority: float = 0.0) -> PendingStart:
    return PendingStart(
        execution_id=f"x{n}", workflow="w", payload=b"{}", origin=Origin.event,
        kind=AdmittedKind.start, declaration_version="v", hop=1, request_id=f"r{n}",
        request_ids=[f"r{n}"], requested_at_ms=n, arrived_at_ms=n, priority=priority,
        slots=[])


def held_store() -> MemoryStore:
    """A memory store holding its queues as values, as a task makes it."""
    store = MemoryStore()
    for spec in pending.TABLES:
        if spec.values is not None:
            store.held.table(spec)
    return store


class Logged:
    """A store and the changelog its commits wrote, which a restore replays."""

    def __init__(self, held: bool) -> None:
        self.held = held
        self.log: list[tuple[bytes, bytes | None]] = []
        self.store = held_store() if held else MemoryStore()
        self.tx = StoreTransaction(self.store)

    def commit(self, offset: int) -> None:
        # What the executor logs: the buffer's rows but the derived ones, then the held's.
        self.log += [(k, v) for k, v in self.tx.changes.items()
                     if not k.startswith(pending.DERIVED)]
        self.log += list(self.tx.logged.items())
        self.tx.commit(offset)

    def restore(self, offset: int) -> None:
        """A new store, replayed from the changelog, its derived rows made again."""
        self.store = held_store() if self.held else MemoryStore()
        for key, value in self.log:
            self.store.write({key: value}, None)
        self.store.write(dict(pending.derive(self.store)), offset)
        self.tx = StoreTransaction(self.store)


def test_a_store_that_holds_its_queues_makes_held_queues_and_logs_their_rows() -> None:
    held = Logged(True)
    queue = PendingQueue(held.tx, b"q")
    assert isinstance(queue, HeldQueue)
    assert not isinstance(PendingQueue(Logged(False).tx, b"q"), HeldQueue)
    first, position = queue.park(_start(1), headers=HEADERS)
    assert position == 0 and first.headers == HEADERS
    assert queue.park(_start(2))[1] == 1
    # Ahead of both, by its priority: counted.
    assert queue.park(_start(3, priority=5.0))[1] == 0
    assert [p.start.execution_id for p in queue] == ["x3", "x1", "x2"]
    # The rows go to the changelog, not to the store's rows; the store reads them.
    assert len(held.tx.logged) == 3 and not held.store._rows
    assert [key for key, _ in held.store.items(pending.ROW_PREFIX)] == [
        p.row for p in queue]
    assert held.store.get(first.row) is not None
    held.commit(0)
    popped = queue.pop()
    assert popped is not None and popped.start.execution_id == "x3"
    held.tx.discard()
    # The take undone: the queue is as committed.
    assert [p.start.execution_id for p in PendingQueue(held.tx, b"q")] == ["x3", "x1", "x2"]
    held.restore(0)
    restored = PendingQueue(held.tx, b"q")
    assert [(p.start.execution_id, p.headers) for p in restored] == [
        ("x3", None), ("x1", HEADERS), ("x2", None)]
    assert len(restored) == 3
    assert index_problems(held.tx) == []


class HeldMachine(RuleBasedStateMachine):
    """A fair queue held as values against one kept as rows: the same next start, lanes,
    counts and positions, through parks ahead of the head, takes with weights, removals
    from the middle, clears, commits, aborts and restores from the changelog."""

    LANES = ("a", "b", "c")

    def __init__(self) -> None:
        super().__init__()
        self.sides = [Logged(True), Logged(False)]
        self.n = 0
        self.offset = -1
        self._open()

    def _open(self) -> None:
        self.queues = [FairQueue(side.tx, b"budget") for side in self.sides]

    @rule(lane=st.sampled_from(LANES), priority=st.sampled_from([0.0, 0.0, 1.0, 5.0]),
          count=st.integers(1, 12), headers=st.booleans())
    def park(self, lane: str, priority: float, count: int, headers: bool) -> None:
        for _ in range(count):
            self.n += 1
            positions = [q.park(lane, _start(self.n, priority), HEADERS if headers else None)[1]
                         for q in self.queues]
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
            assert queue.lane(lane).at(parked.row) == parked
            queue.remove(lane, parked)
            assert queue.lane(lane).at(parked.row) is None

    @rule(lane=st.sampled_from(LANES))
    def clear_a_lane(self, lane: str) -> None:
        for queue in self.queues:
            for parked in list(queue.lane(lane)):
                queue.remove(lane, parked)

    @rule(lane=st.sampled_from(LANES))
    def forget_a_lane(self, lane: str) -> None:
        # A throttle forgets its key's queue once it is empty and idle: a held one goes at
        # once, so a start parked next takes the row of the one removed.
        for queue in self.queues:
            queue.lane(lane).forget()

    @rule()
    def commit(self) -> None:
        self.offset += 1
        for side in self.sides:
            side.commit(self.offset)

    @rule()
    def abort(self) -> None:
        for side in self.sides:
            side.tx.discard()

    @rule()
    def restore(self) -> None:
        for side in self.sides:
            side.restore(self.offset)
        self._open()

    @invariant()
    def both_answer_alike(self) -> None:
        held, rows = self.queues
        assert index_problems(self.sides[0].tx) == []
        assert held.lanes() == rows.lanes()
        assert len(held) == len(rows)
        heads = [q.next() for q in self.queues]
        assert [None if h is None else (h[0], h[1].start.execution_id, h[1].headers)
                for h in heads] == [
            None if h is None else (h[0], h[1].start.execution_id, h[1].headers)
            for h in heads[::-1]]
        for lane in self.LANES:
            # (Their rows' keys may differ: a held queue emptied starts its sequence again.)
            assert ([(p.start.execution_id, p.headers) for p in held.lane(lane)]
                    == [(p.start.execution_id, p.headers) for p in rows.lane(lane)])
            assert len(held.lane(lane)) == len(rows.lane(lane))
        # The store reads the held rows as it reads rows: its starts, in order.
        assert ([value for _, value in self.sides[0].tx.items(pending.ROW_PREFIX)]
                == [value for _, value in self.sides[1].tx.items(pending.ROW_PREFIX)])
        assert pending.queue_names(self.sides[0].tx) == pending.queue_names(self.sides[1].tx)
        # One fair queue's rows, as the restore's sweep reads them, lane by lane.
        assert ([value for _, _, value in pending.lane_rows(self.sides[0].tx, b"budget")]
                == [value for _, _, value in pending.lane_rows(self.sides[1].tx, b"budget")])


HeldMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40,
                                         deadline=None)
test_a_fair_queue_held_as_values_answers_as_one_kept_as_rows = HeldMachine.TestCase
