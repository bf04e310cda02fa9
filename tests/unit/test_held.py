"""A memory store's derived tables and timers held as values (engine.held): a cycle's
writes kept by its commit and undone by its abort, the timers fired in due order, and the
rows still read and written as rows through the store."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.admission.stages.runs import BACKSTOPS, Backstop
from sluicegate.engine.held import Held
from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.tables import TEXT, HeldStateTable, StateTable, TableSpec
from sluicegate.engine.timers import DERIVED_TIMER_PREFIX, STATE_PREFIX, Timers, timer_key
from sluicegate.testing import TestDriver
from tests.unit.test_clock_steps import APP as RUNS_APP


def _store() -> tuple[MemoryStore, StoreTransaction, HeldStateTable[str, Backstop]]:
    store = MemoryStore()
    store.held.table(BACKSTOPS)
    store.held.held_timers()
    tx = StoreTransaction(store)
    return store, tx, HeldStateTable(BACKSTOPS, store.held.tables[BACKSTOPS.prefix])


def test_a_held_tables_writes_stay_when_the_cycle_commits_and_go_when_it_aborts() -> None:
    _, tx, table = _store()
    kept = Backstop(lease_ms=10, lease_until_ms=110)
    table.put("a", kept)
    tx.commit(None)
    table.put("a", Backstop(lease_ms=10, lease_until_ms=500))
    table.put("b", kept)
    table.delete("a")
    assert table.get("a") is None and table.get("b") is kept
    tx.discard()
    assert table.get("a") is kept, "the committed value is back"
    assert table.get("b") is None and "b" not in table


def test_a_new_transaction_undoes_what_the_last_one_left_uncommitted() -> None:
    store, tx, table = _store()
    table.put("a", Backstop(lease_ms=1, lease_until_ms=2))
    tx.commit(None)
    table.delete("a")
    table.put("c", Backstop(lease_ms=1, lease_until_ms=3))
    # The worker crashed here: its transaction neither committed nor aborted.
    StoreTransaction(store)
    assert table.get("a") == Backstop(lease_ms=1, lease_until_ms=2)
    assert table.get("c") is None


def test_a_cycle_that_wrote_only_held_values_commits_them() -> None:
    """The executor commits a store whose cycle changed only held values: an abort after
    that commit does not undo them."""
    with TestDriver(RUNS_APP) as driver:
        if not isinstance(driver.store("runs").store, MemoryStore):
            pytest.skip("a RocksDB store keeps its derived rows as rows")
        table = driver.context("runs").table("backstops")
        table.put("x", Backstop(lease_ms=5, lease_until_ms=9))
        assert driver.store("runs").pending and not driver.store("runs").changes
        driver.commit()
        driver.tasks[0].discard()
        assert table.get("x") == Backstop(lease_ms=5, lease_until_ms=9)


def test_held_rows_read_and_written_as_rows_through_the_store() -> None:
    store, tx, table = _store()
    value = Backstop(lease_ms=7, lease_until_ms=70)
    table.put("r1", value)
    ctx_timers = Timers(tx, (b"L",), store.held.timers)
    ctx_timers.schedule(70, b"Lr1")
    tx.commit(None)
    store.write({STATE_PREFIX + b"A": b"1", STATE_PREFIX + b"C": b"2"}, None)
    row = BACKSTOPS.prefix + b"r1"
    assert store.get(row) == BACKSTOPS.value.encode(value)
    assert store.get(timer_key(70, b"Lr1", DERIVED_TIMER_PREFIX)) == b""
    assert [k for k, _ in store.items(STATE_PREFIX)] == [
        STATE_PREFIX + b"A", row, STATE_PREFIX + b"C"], "in key order among the rows"
    assert [k for k, _ in store.items(STATE_PREFIX, row + b"\x00")] == [STATE_PREFIX + b"C"]
    # A restore writes them as rows (`derive`'s), and deletes them so.
    other = Backstop(lease_ms=1, lease_until_ms=2)
    store.write({BACKSTOPS.prefix + b"r2": BACKSTOPS.value.encode(other), row: None,
                 timer_key(5, b"Lr2", DERIVED_TIMER_PREFIX): b""}, None)
    assert table.get("r2") == other and table.get("r1") is None
    assert ctx_timers.next_due == 5
    assert len(store) == 2 + 1 + 2, "the rows, the held row and the two timers"
    store.wipe()
    assert table.get("r2") is None and ctx_timers.next_due is None


def test_a_held_row_of_any_prefix_is_found_through_the_store_and_no_other_row_is() -> None:
    """The store asks its held values only about a key whose table may be held (its first
    bytes, the timers' prefix, a table's shorter prefix): every held row is still read and
    written through it, whatever its table's prefix, and a kept row of a neighbouring
    table stays a row."""
    store = MemoryStore()
    short = TableSpec("short", b"\x00Q", TEXT, TEXT, derived=True, held=True)
    # Two tables whose prefixes begin alike: the second is not found by its first bytes.
    first = TableSpec("first", STATE_PREFIX + b"Ya", TEXT, TEXT, derived=True, held=True)
    shared = TableSpec("shared", STATE_PREFIX + b"Yb", TEXT, TEXT, derived=True, held=True)
    for spec in (BACKSTOPS, short, first, shared):
        store.held.table(spec)
    store.held.held_timers()
    rows = {BACKSTOPS.prefix + b"r": BACKSTOPS.value.encode(Backstop(lease_ms=1)),
            short.prefix + b"q": b"v1", first.prefix + b"f": b"v0",
            shared.prefix + b"s": b"v2", timer_key(9, b"Lr", DERIVED_TIMER_PREFIX): b""}
    kept = {STATE_PREFIX + b"Rr": b"a run's row", b"\x00Qx"[:1] + b"P": b"a neighbour"}
    store.write({**rows, **kept}, None)
    for key, value in {**rows, **kept}.items():
        assert store.get(key) == value, key
    assert store.held.tables[short.prefix].rows == {b"q": "v1"}
    assert store.held.tables[shared.prefix].rows == {b"s": "v2"}
    assert store.held.timers is not None and store.held.timers.next_due == 9
    assert store._rows == kept, "only the rows of tables not held are rows"
    assert store.get(STATE_PREFIX + b"Rmissing") is None


def test_a_memory_store_holds_the_tables_marked_held_and_rocksdb_keeps_them_as_rows() -> None:
    with TestDriver(RUNS_APP) as driver:
        table = driver.context("runs").table("backstops")
        held = isinstance(driver.store("runs").store, MemoryStore)
        assert isinstance(table, HeldStateTable) is held
        assert isinstance(table, StateTable) is not held


def test_held_timers_fire_in_due_order_and_a_cancel_undone_fires_again() -> None:
    _, tx, _ = _store()
    timers = Timers(tx, (b"L",), tx.store.held.timers)  # type: ignore[attr-defined]
    for due, key in ((30, b"Lc"), (10, b"La"), (20, b"Lb"), (10, b"La2")):
        timers.schedule(due, key)
    tx.commit(None)
    assert timers.next_due == 10
    assert [(d, k) for d, k, _ in timers.due(20)] == [(10, b"La"), (10, b"La2"), (20, b"Lb")]
    assert [(d, k) for d, k, _ in timers.due(20, limit=1)] == [(10, b"La")]
    timers.cancel(10, b"La")
    timers.cancel(10, b"La2")
    assert timers.next_due == 20
    tx.discard()
    assert timers.next_due == 10
    assert [k for _, k, _ in timers.due(10)] == [b"La", b"La2"], "once each"


def test_held_timers_stay_compact_when_most_timers_are_cancelled() -> None:
    held = Held()
    timers = held.held_timers()
    for n in range(20_000):
        timers.schedule(1_000_000 + n, b"L%d" % n)
        timers.cancel(1_000_000 + n, b"L%d" % n)
        held.keep()
    assert len(timers) == 0 and len(timers._heap) <= 1_025
    assert timers.next_due is None


@dataclass
class _Model:
    rows: dict[str, int]
    timers: set[tuple[int, bytes]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "delete", "schedule", "cancel", "commit",
                                           "abort"]),
                          st.integers(0, 5), st.integers(0, 3)), max_size=60))
def test_held_values_and_timers_follow_their_commits_and_aborts(ops: list[tuple[str, int, int]]
                                                                ) -> None:
    held = Held()
    table = held.table(BACKSTOPS)
    timers = held.held_timers()
    committed = _Model({}, set())
    now = _Model({}, set())
    for op, n, due in ops:
        key = f"k{n}"
        if op == "put":
            table.put(key.encode(), n * 10 + due)
            now.rows[key] = n * 10 + due
        elif op == "delete":
            table.delete(key.encode())
            now.rows.pop(key, None)
        elif op == "schedule":
            timers.schedule(due, key.encode())
            now.timers.add((due, key.encode()))
        elif op == "cancel":
            timers.cancel(due, key.encode())
            now.timers.discard((due, key.encode()))
        elif op == "commit":
            held.keep()
            committed = _Model(dict(now.rows), set(now.timers))
        else:
            held.rollback()
            now = _Model(dict(committed.rows), set(committed.timers))
        assert {k.decode(): v for k, v in table.rows.items()} == now.rows
        assert [(d, k) for d, k, _ in timers.due(10**6, limit=10**6)] == sorted(now.timers)
        assert timers.next_due == (min(now.timers)[0] if now.timers else None)


def test_a_replayed_derived_row_that_does_not_decode_is_left_for_the_rebuild() -> None:
    store, _, table = _store()
    store.write({BACKSTOPS.prefix + b"old": b"\x07not a backstop row"}, 5)
    assert table.get("old") is None and store.changelog_offset == 5
