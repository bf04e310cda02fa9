from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from sluicegate.engine.store import PartitionStore, StoreTransaction
from sluicegate.engine.timers import (
    STATE_PREFIX,
    TIMER_PREFIX,
    Timers,
    parse_timer_key,
    timer_key,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    with PartitionStore(tmp_path / "s") as s:
        yield s


@pytest.fixture
def tx(store: PartitionStore) -> StoreTransaction:
    return StoreTransaction(store)


def test_timer_keys_sort_by_due_time_then_key() -> None:
    keys = [timer_key(256, b"a"), timer_key(1, b"z"), timer_key(1, b"b"), timer_key(2**40, b"")]
    assert [parse_timer_key(k) for k in sorted(keys)] == [
        (1, b"b"),
        (1, b"z"),
        (256, b"a"),
        (2**40, b""),
    ]


def test_timer_and_state_rows_live_in_separate_namespaces() -> None:
    assert timer_key(0, b"k").startswith(TIMER_PREFIX)
    assert not TIMER_PREFIX.startswith(STATE_PREFIX)
    assert not STATE_PREFIX.startswith(TIMER_PREFIX)


def test_negative_due_times_and_foreign_keys_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside"):
        timer_key(-1, b"k")
    with pytest.raises(ValueError, match="not a timer key"):
        parse_timer_key(STATE_PREFIX + b"k")


def test_due_fires_timers_at_or_before_now_earliest_first(tx: StoreTransaction) -> None:
    timers = Timers(tx)
    timers.schedule(300, b"c", b"v3")
    timers.schedule(100, b"b", b"v1")
    timers.schedule(100, b"a", b"v0")
    timers.schedule(301, b"d")
    assert timers.due(99) == []
    assert timers.due(300) == [(100, b"a", b"v0"), (100, b"b", b"v1"), (300, b"c", b"v3")]
    assert timers.due(300, limit=2) == [(100, b"a", b"v0"), (100, b"b", b"v1")]


def test_due_leaves_fired_timers_in_place_until_cancelled(tx: StoreTransaction) -> None:
    timers = Timers(tx)
    timers.schedule(10, b"a")
    assert timers.due(10) == [(10, b"a", b"")]
    assert timers.due(10) == [(10, b"a", b"")]
    timers.cancel(10, b"a")
    assert timers.due(10) == []
    assert timers.next_due is None


def test_next_due_follows_schedule_and_cancel(tx: StoreTransaction) -> None:
    timers = Timers(tx)
    assert timers.next_due is None
    timers.schedule(50, b"a")
    timers.schedule(20, b"b")
    timers.schedule(20, b"c")
    assert timers.next_due == 20
    timers.cancel(20, b"b")
    assert timers.next_due == 20
    timers.cancel(20, b"c")
    assert timers.next_due == 50
    timers.cancel(50, b"a")
    assert timers.next_due is None


def test_next_due_sees_stored_timers_and_ignores_those_cancelled_in_the_buffer(
    tx: StoreTransaction,
) -> None:
    timers = Timers(tx)
    timers.schedule(10, b"a")
    timers.schedule(30, b"b")
    tx.commit(0)
    assert timers.next_due == 10
    timers.cancel(10, b"a")
    timers.schedule(40, b"c")
    assert timers.next_due == 30


def test_an_aborted_cycle_restores_next_due_without_a_reload(tx: StoreTransaction) -> None:
    timers = Timers(tx)
    timers.schedule(100, b"kept")
    tx.commit(0)
    timers.cancel(100, b"kept")
    timers.schedule(5, b"aborted")
    assert timers.next_due == 5
    tx.discard()
    assert timers.next_due == 100


def test_next_due_tracks_restore_writes_and_wipes_of_the_store(
    store: PartitionStore, tx: StoreTransaction
) -> None:
    timers = Timers(tx)
    assert timers.next_due is None
    store.write({timer_key(70, b"replayed"): b""}, 0)  # as a changelog replay would
    assert timers.next_due == 70
    store.wipe()
    assert timers.next_due is None


def test_timers_survive_a_restart_once_committed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with PartitionStore(path) as store:
        tx = StoreTransaction(store)
        timers = Timers(tx)
        timers.schedule(200, b"b", b"payload")
        timers.schedule(100, b"a")
        tx.commit(1)
        timers.schedule(50, b"never-committed")
    with PartitionStore(path) as store:
        timers = Timers(StoreTransaction(store))
        assert timers.next_due == 100
        assert timers.due(1000) == [(100, b"a", b""), (200, b"b", b"payload")]


def test_rebind_moves_the_index_to_another_transaction(store: PartitionStore) -> None:
    first = StoreTransaction(store)
    timers = Timers(first)
    timers.schedule(10, b"a")
    second = StoreTransaction(store)
    second.put(timer_key(7, b"b"), b"")
    timers.rebind(second)
    assert timers.next_due == 7
    assert timers.due(10) == [(7, b"b", b"")]


def test_state_rows_do_not_show_up_as_timers(tx: StoreTransaction) -> None:
    tx.put(STATE_PREFIX + b"\x00\x00", b"state")
    tx.put(b"\x00U", b"some later namespace")
    timers = Timers(tx)
    timers.reload()
    assert timers.next_due is None
    assert timers.due(2**63) == []


DUES = st.integers(min_value=0, max_value=40)
TIMER_KEYS = st.sampled_from([b"", b"a", b"b", b"\x00", b"\xff"])


class TimersMachine(RuleBasedStateMachine):
    """Timers over a real store vs. sorted lists of committed and pending timers."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluicegate-timers-"))
        self.store = PartitionStore(self.dir / "s")
        self.tx = StoreTransaction(self.store)
        self.timers = Timers(self.tx)
        self.committed: dict[tuple[int, bytes], bytes] = {}
        self.pending: dict[tuple[int, bytes], bytes] = {}
        self.offset = -1

    @rule(due=DUES, key=TIMER_KEYS, value=st.binary(max_size=2))
    def schedule(self, due: int, key: bytes, value: bytes) -> None:
        self.timers.schedule(due, key, value)
        self.pending[(due, key)] = value

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        # Mostly cancel a live timer (often the earliest), sometimes an unknown one.
        live = sorted(self.pending)
        anything = st.tuples(DUES, TIMER_KEYS)
        choice = data.draw(st.one_of(st.sampled_from(live), anything) if live else anything)
        self.timers.cancel(*choice)
        self.pending.pop(choice, None)

    @rule()
    def cancel_earliest(self) -> None:
        if self.pending:
            due, key = min(self.pending)
            self.timers.cancel(due, key)
            del self.pending[(due, key)]

    @rule()
    def commit(self) -> None:
        if self.tx:
            self.offset += 1
        self.tx.commit(self.offset)
        self.committed = dict(self.pending)

    @rule()
    def discard(self) -> None:
        self.tx.discard()
        self.pending = dict(self.committed)

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = PartitionStore(self.dir / "s")
        self.tx = StoreTransaction(self.store)
        self.timers = Timers(self.tx)
        self.pending = dict(self.committed)

    @rule(due=DUES, key=TIMER_KEYS)
    def restore_writes(self, due: int, key: bytes) -> None:
        """A restore writes the store under a transaction with nothing buffered (between
        cycles): what the index knew of the store (its floor, its earliest) must go."""
        if self.tx:
            return
        self.offset += 1
        self.store.write({timer_key(due, key): b"r"}, self.offset)
        self.committed[(due, key)] = b"r"
        self.pending = dict(self.committed)

    @rule(now=DUES, limit=st.integers(min_value=1, max_value=4))
    def due(self, now: int, limit: int) -> None:
        expected = [(d, k, v) for (d, k), v in sorted(self.pending.items()) if d <= now]
        assert self.timers.due(now, limit) == expected[:limit]

    # A rule, not an invariant: reading next_due after every step would keep
    # the cache warm and hide bugs in its lazy recomputation.
    @rule()
    def next_due_is_the_earliest_pending_timer(self) -> None:
        assert self.timers.next_due == (min(self.pending)[0] if self.pending else None)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TimersMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
test_timers_behave_like_a_sorted_list = TimersMachine.TestCase
