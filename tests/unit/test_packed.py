"""The memory store's packed rows (engine.packed) and the store over them, against a dict:
blocks small and merges frequent, so every path (a block cut, a block joined to the one
before, a delete hiding a packed row, a read going on across a merge) is walked."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.packed import Block, Packed, _spliced, _unpacked

# Few distinct bytes, so keys share prefixes and collide often.
keys = st.binary(min_size=0, max_size=4).map(lambda b: bytes(x % 4 for x in b))
values = st.binary(max_size=3)
changes = st.dictionaries(keys, st.none() | values, max_size=12)


def _rows(model: dict[bytes, bytes], prefix: bytes = b"",
          start: bytes | None = None) -> list[tuple[bytes, bytes]]:
    lo = prefix if start is None or start < prefix else start
    return sorted((k, v) for k, v in model.items() if k.startswith(prefix) and k >= lo)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(changes, max_size=12),
       block_rows=st.sampled_from([1, 2, 3, 4, 5, 6, 16, 64]), probe=keys,
       family=st.sampled_from([1, 2, 3]))
def test_packed_rows_are_those_of_a_dict_given_the_same_changes(
    batches: list[dict[bytes, bytes | None]], block_rows: int, probe: bytes, family: int,
) -> None:
    packed = Packed(block_rows, family)
    model: dict[bytes, bytes] = {}
    for batch in batches:
        packed.merge(sorted(batch.items()))
        for key, value in batch.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        assert len(packed) == len(model)
        # The tables it knows to have rows are exactly those of its rows: a key whose
        # table it does not know is missing without a search.
        assert packed.families == {key[:family] for key in model}
        assert list(packed.rows(b"")) == sorted(model.items())
        assert packed.get(probe) == model.get(probe)
        assert list(packed.rows(probe)) == [r for r in sorted(model.items()) if r[0] >= probe]
        assert list(packed.rows(probe, after=True)) == [
            r for r in sorted(model.items()) if r[0] > probe]
        for key in model:
            assert packed.get(key) == model[key]
        # Blocks stay in order, none empty, none over twice the size they are cut to.
        assert all(0 < len(b) <= 2 * block_rows for b in packed.blocks)
        assert packed.firsts == [b.first() for b in packed.blocks]
        assert packed.firsts == sorted(packed.firsts)


@settings(max_examples=300, deadline=None)
@given(rows=st.dictionaries(keys, values, max_size=40), batch=changes)
def test_a_block_spliced_is_the_block_unpacked_with_the_same_changes(
    rows: dict[bytes, bytes], batch: dict[bytes, bytes | None],
) -> None:
    """A merge remakes a block with few changes by copying the runs of rows between them
    whole: the same rows and offsets as applying them to its rows one by one."""
    block = Block(sorted(rows), [rows[k] for k in sorted(rows)])
    spliced = _spliced(block, sorted(batch.items()))
    unpacked = _unpacked(block, sorted(batch.items()))
    assert (b"".join(spliced[0]), spliced[1], b"".join(spliced[2]), spliced[3]) == (
        b"".join(unpacked[0]), unpacked[1], b"".join(unpacked[2]), unpacked[3])
    expected = {**rows, **batch}
    live = sorted(k for k, v in expected.items() if v is not None)
    assert b"".join(unpacked[0]) == b"".join(live)
    assert b"".join(unpacked[2]) == b"".join(expected[k] for k in live)


def test_a_packed_key_is_found_only_whole_however_often_it_is_part_of_others() -> None:
    """A lookup finds the key's bytes in the block and takes them only where they are a
    whole key; a key inside many others, or the empty key, is found by a search."""
    packed = Packed(64)
    rows = [b"", b"a", b"aa", b"aaa", b"aaaa", b"aaaaa", b"aaaaaa", b"ba", b"bab", b"c"]
    packed.merge([(k, b"v" + k) for k in rows])
    for key in rows:
        assert packed.get(key) == b"v" + key
    for key in (b"ab", b"b", b"abab", b"aaaaaaa", b"\x00"):
        assert packed.get(key) is None
    packed.merge([(b"", None)])
    assert packed.get(b"") is None
    assert packed.get(b"aaaaaa") == b"vaaaaaa"


def test_a_memory_store_packs_its_older_rows_and_keeps_a_small_last_write_recent() -> None:
    store = MemoryStore(pack_at=4, block_rows=2)
    store.write({b"a1": b"1", b"a2": b"2", b"a3": b"3", b"a4": b"4"}, 0)
    assert store._packed.count == 4 and not store._rows  # a write as large as a merge
    store.write({b"b1": b"1", b"b2": b"2"}, 1)
    store.write({b"a2": None}, 2)  # a packed row's delete: a None over it
    store.write({b"c1": b"1", b"c2": b"2"}, 3)
    assert store._packed.count == 4
    assert store.get(b"a2") is None
    assert list(store.items(b"a")) == [(b"a1", b"1"), (b"a3", b"3"), (b"a4", b"4")]
    assert len(store) == 7
    store.write({b"c3": b"3"}, 4)  # five rows older than this write: merged
    assert list(store._rows) == [b"c3"]
    assert store._packed.count == 7
    # A key looked for and not found, then put, is known not to be packed: its delete
    # drops it rather than leaving a None for the next merge.
    assert store.get(b"d1") is None
    store.write({b"d1": b"1"}, 5)
    store.write({b"d1": None, b"b1": None}, 6)
    assert store._rows == {b"c3": b"3", b"b1": None}
    assert list(store.items(b"")) == [(b"a1", b"1"), (b"a3", b"3"), (b"a4", b"4"),
                                      (b"b2", b"2"), (b"c1", b"1"), (b"c2", b"2"),
                                      (b"c3", b"3")]


class MemoryStoreMachine(RuleBasedStateMachine):
    """A memory store that merges its recent rows after every few writes, against a dict;
    an ordered read is started, written under and read on, as a queue's head or the
    timers' are while a cycle writes."""

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore(pack_at=4, block_rows=2)
        self.model: dict[bytes, bytes] = {}
        self.offset = 0
        self.reading: Any = None
        self.read: list[tuple[bytes, bytes]] = []

    @rule(batch=changes)
    def write(self, batch: dict[bytes, bytes | None]) -> None:
        self.store.write(batch, self.offset)
        self.offset += 1
        for key, value in batch.items():
            if value is None:
                self.model.pop(key, None)
            else:
                self.model[key] = value

    @rule(key=keys)
    def get(self, key: bytes) -> None:
        assert self.store.get(key) == self.model.get(key)

    @rule(prefix=keys.map(lambda k: k[:2]), start=st.none() | keys)
    def items(self, prefix: bytes, start: bytes | None) -> None:
        assert list(self.store.items(prefix, start)) == _rows(self.model, prefix, start)

    @rule(prefix=keys.map(lambda k: k[:1]))
    def start_reading(self, prefix: bytes) -> None:
        self.reading = (prefix, self.store.items(prefix))
        self.read = []

    @precondition(lambda self: self.reading is not None)
    @rule()
    def read_on(self) -> None:
        """The next row of the read started: the first row after the last one it gave,
        among the rows as they are now."""
        prefix, rows = self.reading
        after = self.read[-1][0] if self.read else None
        expected = [r for r in _rows(self.model, prefix) if after is None or r[0] > after]
        row = next(rows, None)
        assert row == (expected[0] if expected else None)
        if row is None:
            self.reading = None
        else:
            self.read.append(row)

    @rule()
    def wipe(self) -> None:
        self.store.wipe()
        self.model = {}
        self.offset = 0
        self.reading = None

    @invariant()
    def same_rows(self) -> None:
        assert len(self.store) == len(self.model)


MemoryStoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                                deadline=None)
test_a_memory_store_behaves_like_a_dict = MemoryStoreMachine.TestCase



def test_a_block_finds_a_key_only_where_a_row_of_it_starts_and_ends() -> None:
    # b"bc" appears across b"ab" and b"cd", b"b" inside b"ab", b"a" first in b"ab": none
    # of those is a row.
    block = Block([b"", b"a", b"ab", b"cd"], [b"0", b"1", b"2", b"3"])
    assert [block.find(k) for k in (b"", b"a", b"ab", b"cd")] == [b"0", b"1", b"2", b"3"]
    assert [block.find(k) for k in (b"bc", b"b", b"abc", b"d", b"x")] == [None] * 5
