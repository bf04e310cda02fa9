from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.recovery import unproven
from sluicegate.engine.store import BACKENDS, PartitionStore, StoreTransaction, open_store


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A store of each backend: both answer every read and write the same way."""
    s = open_store(request.param, tmp_path / "stage-0")
    yield s
    s.close()


def test_a_store_never_written_makes_no_files_until_its_first_write(tmp_path: Path) -> None:
    path = tmp_path / "stage-0"
    with PartitionStore(path) as store:
        assert store.get(b"a") is None
        assert list(store.items(b"")) == []
        assert not path.exists()
        store.write({b"a": b"1"}, 3)
        assert path.exists()
    with PartitionStore(path) as store:
        assert store.get(b"a") == b"1"
        assert store.changelog_offset == 3


def test_a_new_store_is_empty_and_reflects_no_changelog_offset(store: PartitionStore) -> None:
    assert store.changelog_offset == -1
    assert store.get(b"k") is None
    assert list(store.items(b"")) == []


def test_write_puts_and_deletes_and_records_the_offset(store: PartitionStore) -> None:
    store.write({b"a": b"1", b"b": b"2"}, 10)
    store.write({b"a": None, b"c": b"3"}, 11)
    assert store.get(b"a") is None
    assert store.get(b"b") == b"2"
    assert store.changelog_offset == 11


def test_items_yields_only_the_prefix_in_ascending_order_from_start(
    store: PartitionStore,
) -> None:
    store.write({b"p\x02": b"2", b"p\x01": b"1", b"o\xff": b"x", b"q": b"y", b"p": b"0"}, 0)
    assert list(store.items(b"p")) == [(b"p", b"0"), (b"p\x01", b"1"), (b"p\x02", b"2")]
    assert list(store.items(b"p", start=b"p\x01")) == [(b"p\x01", b"1"), (b"p\x02", b"2")]
    # A start before the prefix is the same as no start.
    assert list(store.items(b"p", start=b"a")) == list(store.items(b"p"))
    assert list(store.items(b"p", start=b"p\x03")) == []


@pytest.mark.parametrize("prefix", [b"p", b"p\xff", b"\xff", b"\xff\xff", b"\x00"])
def test_items_of_a_prefix_end_at_its_last_row_whatever_its_bytes(
    store: PartitionStore, prefix: bytes,
) -> None:
    """Prefix scans are bounded above (an emptied range is not walked on into the
    tombstones after it): the bound must not cut the range short, for a prefix ending in
    0xff bytes too, nor survive the call that made it (rows read long after it)."""
    inside = [prefix, prefix + b"\x00", prefix + b"a", prefix + b"\xff", prefix + b"\xff\xff\x01"]
    outside = [prefix[:-1] + bytes((prefix[-1] - 1,)) + b"\xff" if prefix[-1] else b"",
               *([prefix[:-1] + bytes((prefix[-1] + 1,))] if prefix[-1] < 255 else [])]
    store.write({**{k: b"in" for k in inside}, **{k: b"out" for k in outside if k}}, 0)
    rows = store.items(prefix)
    later = store.items(prefix, start=prefix + b"a")
    churn = [bytes(4096) for _ in range(2000)]  # reuse what a freed bound would have held
    assert [k for k, _ in rows] == sorted(inside)
    assert [k for k, _ in later] == sorted(k for k in inside if k >= prefix + b"a")
    del churn
    # A range emptied by deletes, with rows after it, reads as empty.
    store.write(dict.fromkeys(inside), 1)
    assert list(store.items(prefix)) == []


def test_items_of_a_memory_store_go_on_from_their_last_row_after_a_write() -> None:
    store = MemoryStore()
    store.write({b"a": b"1", b"c": b"3", b"d": b"4"}, 0)
    rows = store.items(b"")
    assert next(rows) == (b"a", b"1")
    store.write({b"b": b"2", b"c": None}, 1)
    assert list(rows) == [(b"b", b"2"), (b"d", b"4")]


def test_a_memory_store_orders_the_keys_written_since_its_last_ordered_read_when_read() -> None:
    store = MemoryStore()
    store.write({b"p3": b"3", b"p1": b"1"}, 0)
    assert list(store.items(b"p")) == [(b"p1", b"1"), (b"p3", b"3")]
    # Written and deleted between two ordered reads, a key is never in the order; one
    # deleted after it joined the order leaves it.
    store.write({b"p2": b"2", b"p0": b"0", b"p1": None}, 1)
    store.write({b"p0": None}, 2)
    assert list(store.items(b"p")) == [(b"p2", b"2"), (b"p3", b"3")]
    # Keys written while an ordered read goes on join it ahead of where it is.
    rows = store.items(b"p")
    assert next(rows) == (b"p2", b"2")
    store.write({b"p25": b"x", b"p4": b"4", b"p1": b"1"}, 3)
    assert list(rows) == [(b"p25", b"x"), (b"p3", b"3"), (b"p4", b"4")]
    assert len(store) == 5


def test_items_of_a_rocksdb_store_see_it_as_of_the_call(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "s")
    store.write({b"a": b"1", b"c": b"3"}, 0)
    rows = store.items(b"")
    store.write({b"b": b"2", b"c": None}, 1)
    assert list(rows) == [(b"a", b"1"), (b"c", b"3")]


def test_user_keys_never_collide_with_the_offset_bookkeeping(store: PartitionStore) -> None:
    store.write({b"changelog_offset": b"mine", b"meta": b"also mine"}, 3)
    assert store.get(b"changelog_offset") == b"mine"
    assert store.changelog_offset == 3
    assert [k for k, _ in store.items(b"")] == [b"changelog_offset", b"meta"]


def test_a_published_tables_offset_moves_with_its_rows_and_apart_from_the_changelog(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    with PartitionStore(path) as s:
        s.write({b"\x00SRrun-1": b"row"}, None, {"runs": 7})
        assert s.changelog_offset == -1
        assert s.table_offset("runs") == 7
        s.write({b"\x00SB": b"backstop"}, 3, {"runs": 9})
        s.write({b"\x00SBx": b"timer"}, 4)
        with pytest.raises(ValueError, match="table runs offset 9"):
            s.write({b"k": b"v"}, 5, {"runs": 8})
        assert s.get(b"k") is None, "a refused write changes nothing"
    with PartitionStore(path) as s:
        assert (s.changelog_offset, s.table_offset("runs")) == (4, 9)
        assert s.table_offset("other") == -1
        s.wipe()
        assert (s.changelog_offset, s.table_offset("runs")) == (-1, -1)


def test_reopening_gives_the_same_rows_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with PartitionStore(path) as s:
        s.write({b"a": b"1", b"big": b"x" * 8_000_000}, 41)
        s.write({b"a": None, b"b": b"2"}, 42)
    with PartitionStore(path) as s:
        assert s.changelog_offset == 42
        assert s.get(b"a") is None
        assert s.get(b"b") == b"2"
        assert s.get(b"big") == b"x" * 8_000_000


def test_rows_and_offset_go_to_rocksdb_in_one_write_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PartitionStore(tmp_path / "s")
    # The atomicity argument: RocksDB applies one WriteBatch all-or-nothing,
    # so a crash can never leave the rows without the offset or vice versa.
    store.write({}, None)  # RocksDB opens at a store's first write
    spy = _SpyRdict(store._db)
    monkeypatch.setattr(store, "_db", spy)
    store.write({b"a": b"1", b"b": None, b"c": b"3"}, 7)
    assert spy.batches == 1
    assert spy.direct_writes == 0
    assert store.changelog_offset == 7


class _SpyRdict:
    """Stands in for the Rdict: counts batches and direct writes, forwards the rest."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.batches = 0
        self.direct_writes = 0

    def write(self, batch: Any) -> None:
        self.batches += 1
        self._db.write(batch)

    def put(self, *args: Any) -> None:
        self.direct_writes += 1
        self._db.put(*args)

    def delete(self, key: bytes) -> None:
        self.direct_writes += 1
        self._db.delete(key)

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.direct_writes += 1
        self._db[key] = value

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_the_offset_never_moves_backwards(store: PartitionStore) -> None:
    store.write({b"a": b"1"}, 5)
    with pytest.raises(ValueError, match="refusing to move it back"):
        store.write({b"a": b"2"}, 4)
    assert store.get(b"a") == b"1"


def test_wipe_drops_rows_and_offset_and_the_store_stays_usable(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with PartitionStore(path) as s:
        s.write({b"a": b"1"}, 9)
        s.wipe()
        assert s.changelog_offset == -1
        assert s.get(b"a") is None
        s.write({b"b": b"2"}, 0)
    with PartitionStore(path) as s:
        assert s.changelog_offset == 0
        assert list(s.items(b"")) == [(b"b", b"2")]


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    s = PartitionStore(tmp_path / "s")
    s.close()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.get(b"a")


# -- StoreTransaction ---------------------------------------------------------------


def test_reads_see_the_buffer_first_and_a_buffered_delete_hides_the_stored_row(
    store: PartitionStore,
) -> None:
    store.write({b"a": b"old", b"b": b"kept"}, 0)
    tx = StoreTransaction(store)
    tx.put(b"a", b"new")
    tx.delete(b"b")
    assert tx.get(b"a") == b"new"
    assert tx.get(b"b") is None
    assert store.get(b"b") == b"kept"


def test_items_merges_buffer_and_store_in_key_order_with_the_buffer_winning(
    store: PartitionStore,
) -> None:
    store.write({b"k1": b"s1", b"k3": b"s3", b"k5": b"s5", b"x": b"other"}, 0)
    tx = StoreTransaction(store)
    tx.put(b"k4", b"b4")
    tx.put(b"k3", b"b3")
    tx.delete(b"k5")
    tx.put(b"k0", b"b0")
    tx.put(b"y", b"other")
    assert list(tx.items(b"k")) == [(b"k0", b"b0"), (b"k1", b"s1"), (b"k3", b"b3"), (b"k4", b"b4")]
    assert list(tx.items(b"k", start=b"k2")) == [(b"k3", b"b3"), (b"k4", b"b4")]


def test_writing_while_iterating_does_not_disturb_the_iteration(store: PartitionStore) -> None:
    store.write({b"a": b"1", b"b": b"2"}, 0)
    tx = StoreTransaction(store)
    tx.put(b"c", b"3")
    seen = []
    for key, value in tx.items(b""):
        tx.delete(key)
        seen.append((key, value))
    assert seen == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    assert list(tx.items(b"")) == []


def test_changes_keep_first_write_order_and_the_last_value(store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    tx.put(b"b", b"1")
    tx.put(b"a", b"1")
    tx.put(b"b", b"2")
    tx.delete(b"a")
    assert list(tx.changes.items()) == [(b"b", b"2"), (b"a", None)]
    assert len(tx) == 2


def test_commit_writes_the_buffer_with_the_offset_and_empties_it(store: PartitionStore) -> None:
    store.write({b"gone": b"x"}, 3)
    tx = StoreTransaction(store)
    tx.put(b"a", b"1")
    tx.delete(b"gone")
    committed = tx.changes
    tx.commit(8)
    assert not tx
    assert committed == {b"a": b"1", b"gone": None}
    assert store.get(b"a") == b"1"
    assert store.get(b"gone") is None
    assert store.changelog_offset == 8


def test_committing_an_empty_buffer_writes_nothing(store: PartitionStore) -> None:
    store.write({b"a": b"1"}, 3)
    revision = store.revision
    StoreTransaction(store).commit(99)
    assert store.changelog_offset == 3
    assert store.revision == revision


def test_discard_drops_the_buffer_and_leaves_the_store_alone(store: PartitionStore) -> None:
    store.write({b"a": b"1"}, 0)
    tx = StoreTransaction(store)
    tx.put(b"a", b"2")
    tx.put(b"b", b"2")
    tx.discard()
    assert not tx
    assert tx.get(b"a") == b"1"
    assert tx.get(b"b") is None
    assert store.changelog_offset == 0


KEY_SET = [b"", b"a", b"a\x00", b"ab", b"\x00T", b"\xff"]
KEYS = st.sampled_from(KEY_SET)
PREFIXES = st.sampled_from([b"", b"", b"a", b"\x00", b"\xff", b"z"])


class TransactionMachine(RuleBasedStateMachine):
    """StoreTransaction over a real store vs. a dict for the store and a dict for the buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="sluicegate-store-"))
        self.store = self.open()
        self.tx = StoreTransaction(self.store)
        self.stored: dict[bytes, bytes] = {}
        self.buffer: dict[bytes, bytes | None] = {}
        self.offset = -1
        self.writes = 0

    def view(self) -> dict[bytes, bytes]:
        merged = dict(self.stored)
        for k, v in self.buffer.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        return merged

    @rule(key=KEYS)
    def put(self, key: bytes) -> None:
        # Every put writes a value never written before, so a read that returns
        # a stale row cannot pass by luck.
        self.writes += 1
        value = self.writes.to_bytes(4, "big")
        self.tx.put(key, value)
        self.buffer[key] = value

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        self.tx.delete(key)
        self.buffer[key] = None

    # One rule for the end of a cycle, weighted towards commit: separate
    # discard/restart rules would empty the buffer too often to test the merge.
    @rule(
        outcome=st.sampled_from(["commit", "commit", "commit", "discard", "restart"]),
        step=st.integers(min_value=1, max_value=5),
    )
    def end_cycle(self, outcome: str, step: int) -> None:
        if outcome == "commit":
            # An empty cycle produced nothing, so there is no new offset to record.
            if self.buffer:
                self.offset += step
            self.tx.commit(self.offset)
            self.stored = self.view()
        elif outcome == "discard":
            self.tx.discard()
        else:
            # Only what was committed survives a restart.
            self.restart()
        self.buffer = {}

    @rule(key=KEYS)
    def get(self, key: bytes) -> None:
        assert self.tx.get(key) == self.view().get(key)

    @rule(prefix=PREFIXES, start=st.one_of(st.none(), KEYS))
    def items(self, prefix: bytes, start: bytes | None) -> None:
        expected = sorted(
            (k, v)
            for k, v in self.view().items()
            if k.startswith(prefix) and (start is None or k >= start)
        )
        assert list(self.tx.items(prefix, start)) == expected

    @invariant()
    def reads_match_the_model(self) -> None:
        view = self.view()
        assert list(self.tx.items(b"")) == sorted(view.items())
        for key in KEY_SET:
            assert self.tx.get(key) == view.get(key)

    @invariant()
    def store_matches_the_committed_model(self) -> None:
        assert dict(self.store.items(b"")) == self.stored
        assert self.store.changelog_offset == self.offset
        assert self.tx.changes == self.buffer

    def open(self) -> Any:
        return PartitionStore(self.dir / "s")

    def restart(self) -> None:
        """Only what was committed survives a restart."""
        self.store.close()
        self.store = self.open()
        self.tx = StoreTransaction(self.store)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class MemoryTransactionMachine(TransactionMachine):
    """The same over the in-memory store, whose rows do not outlive the process: a restart
    is a new transaction over the committed store, as the test driver's restart keeps it."""

    def open(self) -> Any:
        return MemoryStore()

    def restart(self) -> None:
        self.tx = StoreTransaction(self.store)


for machine in (TransactionMachine, MemoryTransactionMachine):
    machine.TestCase.settings = settings(max_examples=100, stateful_step_count=30,
                                         deadline=None)
test_transaction_behaves_like_a_dict_over_a_dict = TransactionMachine.TestCase
test_transaction_over_memory_behaves_like_a_dict_over_a_dict = (
    MemoryTransactionMachine.TestCase)


_KILLED_AFTER_WRITING = """
import os, sys
from pathlib import Path
from sluicegate.engine.store import PartitionStore
store = PartitionStore(Path(sys.argv[1]))
store.write({b"a": b"2", b"b": b"2"}, 8, {"runs": 4})
assert store.get(b"b") == b"2" and store.changelog_offset == 8
os._exit(0)  # as a kill -9: no close, no flush
"""


def test_a_store_killed_keeps_a_committed_state_with_its_own_offsets(tmp_path: Path) -> None:
    """No write-ahead log: a write not yet flushed is lost by a kill, and the offsets
    written with it are lost with it, so the store is never ahead of or behind them
    (the changelog replay from those offsets brings it back)."""
    with PartitionStore(tmp_path / "s") as store:
        store.write({b"a": b"1"}, 7, {"runs": 3})
    subprocess.run([sys.executable, "-c", _KILLED_AFTER_WRITING, str(tmp_path / "s")],
                   check=True)
    with PartitionStore(tmp_path / "s") as store:
        assert (store.get(b"a"), store.get(b"b")) == (b"1", None)
        assert (store.changelog_offset, store.table_offset("runs")) == (7, 3)


def test_a_committed_write_and_a_clean_close_say_when_the_store_was_in_step(
        tmp_path: Path) -> None:
    now = [1_000]
    s = PartitionStore(tmp_path / "s", lambda: now[0])
    s.write({b"k": b"v"}, 5)  # a replay's write: the logs may hold more
    assert s.synced_at_ms is None
    s.write({b"k": b"w"}, 6, synced=True)  # the owner's commit
    assert s.synced_at_ms == 1_000
    now[0] = 2_000
    s.close(synced=True)
    assert PartitionStore(tmp_path / "s").synced_at_ms == 2_000
    now[0] = 3_000
    reopened = PartitionStore(tmp_path / "s", lambda: now[0])
    reopened.close()  # not known to be in step (still restoring, say): not stamped
    assert PartitionStore(tmp_path / "s").synced_at_ms == 2_000


def test_a_store_is_unproven_once_half_its_logs_delete_retention_has_passed(
        tmp_path: Path) -> None:
    s = PartitionStore(tmp_path / "s", lambda: 10_000)
    s.write({b"k": b"v"}, 5)
    assert "no record" in (unproven(s, 1_000, 10_000) or "")
    s.mark_synced(10_000)
    assert unproven(s, 1_000, 10_499) is None
    assert "delete.retention.ms" in (unproven(s, 1_000, 10_500) or "")


def test_a_store_that_cannot_be_opened_is_moved_aside_and_opened_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "stage" / "0"
    s = PartitionStore(path)
    s.write({b"k": b"v"}, 5)
    s.close()
    (path / "CURRENT").write_bytes(b"garbage")
    reopened = PartitionStore(path)
    assert (reopened.changelog_offset, reopened.get(b"k")) == (-1, None)
    (aside,) = path.parent.glob("0.unreadable-*")
    assert (aside / "CURRENT").read_bytes() == b"garbage"
    assert "cannot be opened" in caplog.text and str(path) in caplog.text


def test_a_count_set_in_a_cycle_is_written_to_its_row_once_at_the_commit(
        store: PartitionStore) -> None:
    store.write({b"\x00SNq": b"4", b"\x00SNgone": b"1"}, 1)
    tx = StoreTransaction(store)
    assert tx.count(b"\x00SNq") == 4 and tx.count(b"\x00SNnone") is None
    for n in (5, 6, 7):
        tx.set_count(b"\x00SNq", n)
    tx.set_count(b"\x00SNgone", None)
    tx.set_count(b"\x00SNnew", 0)  # a count of 0 is a row; None is none
    # Seen by every read of the cycle, not yet by the store.
    assert tx.count(b"\x00SNq") == 7 and tx.get(b"\x00SNq") == b"7"
    assert tx.get(b"\x00SNgone") is None and tx.get(b"\x00SNnew") == b"0"
    assert store.get(b"\x00SNq") == b"4"
    tx.commit(2)
    assert (store.get(b"\x00SNq"), store.get(b"\x00SNgone"), store.get(b"\x00SNnew")) == (
        b"7", None, b"0")
    assert tx.count(b"\x00SNq") == 7 and not tx.changes


def test_counts_set_before_an_ordered_read_of_their_prefix_are_in_it(
        store: PartitionStore) -> None:
    store.write({b"\x00SNa": b"1", b"\x00SNb": b"2"}, 1)
    tx = StoreTransaction(store)
    tx.set_count(b"\x00SNa", None)
    tx.set_count(b"\x00SNc", 3)
    assert list(tx.items(b"\x00SN")) == [(b"\x00SNb", b"2"), (b"\x00SNc", b"3")]
    # The cycle's writes, as its logs see them, hold the counts too.
    tx.set_count(b"\x00SNb", 9)
    assert tx.changes == {b"\x00SNa": None, b"\x00SNc": b"3", b"\x00SNb": b"9"}


def test_an_abort_drops_the_counts_set_and_the_next_read_is_the_stores(
        store: PartitionStore) -> None:
    store.write({b"\x00SNq": b"4"}, 1)
    tx = StoreTransaction(store)
    tx.set_count(b"\x00SNq", 5)
    tx.discard()
    assert tx.count(b"\x00SNq") == 4 and not tx.changes
    tx.set_count(b"\x00SNq", 6)
    tx.commit(2)
    # A write to the store that is not this transaction's commit (a restore) is seen.
    store.write({b"\x00SNq": b"1"}, 3)
    assert tx.count(b"\x00SNq") == 1
