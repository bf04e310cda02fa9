"""Rows packed into sorted blocks: the bulk of a memory store's rows without an object,
a dict entry or a list slot per row (docs/decisions/packed-memory-rows.md).

A `Packed` holds rows in key order in blocks of a few dozen rows. A block is the rows'
keys concatenated into one bytes object and their values into another, with an array of
offsets into each: a row costs its key's and its value's bytes and 8 bytes of offsets,
where a dict of bytes costs ~150 more (two object headers, the dict's entry, a slot in
an ordered index). A block is never changed once made: `merge` makes new blocks for the
ones its changes touch, in a new list of blocks.

It is the packed tier of `engine.memstore.MemoryStore`, which keeps the rows written
recently in a dict and merges them in here in bulk.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, pairwise, repeat
from operator import add

# Rows per block when blocks are made; a block grown past twice that by a merge is cut
# again. A lookup is a bisect over the blocks' first keys (in C) then a binary search of
# log2(rows) steps in one block (in Python): small blocks keep it short, large ones keep
# the per-block objects (~450 bytes) few.
BLOCK_ROWS = 64


class Block:
    """Rows in key order, packed: keys and values each concatenated, with offsets."""

    __slots__ = ("key_offsets", "keys", "value_offsets", "values")

    def __init__(self, keys: list[bytes], values: list[bytes]) -> None:
        self.keys = b"".join(keys)
        self.key_offsets = array("I", accumulate(map(len, keys), initial=0))
        self.values = b"".join(values)
        self.value_offsets = array("I", accumulate(map(len, values), initial=0))

    def __len__(self) -> int:
        return len(self.key_offsets) - 1

    def first(self) -> bytes:
        return self.keys[:self.key_offsets[1]]

    @classmethod
    def made(cls, keys: bytes, key_offsets: array[int], values: bytes,
             value_offsets: array[int]) -> Block:
        """A block of rows already joined, with their offsets."""
        block = cls.__new__(cls)
        block.keys, block.key_offsets = keys, key_offsets
        block.values, block.value_offsets = values, value_offsets
        return block

    def value(self, i: int) -> bytes:
        offsets = self.value_offsets
        return self.values[offsets[i]:offsets[i + 1]]

    def position(self, key: bytes, after: bool = False, lo: int = 0) -> int:
        """Index of the first row whose key is >= `key` (> `key` when `after`), from
        `lo` on."""
        keys = self.keys
        offsets = self.key_offsets
        hi = len(offsets) - 1
        while lo < hi:
            mid = (lo + hi) >> 1
            found = keys[offsets[mid]:offsets[mid + 1]]
            if found < key or (after and found == key):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def find(self, key: bytes) -> bytes | None:
        """The value of the row of `key`, or None. A search of the joined keys (in C)
        rather than a binary search of the rows (in Python): a match is the row's only if
        it starts at a row's offset and is that row's length, since a key may also appear
        across two neighbours or inside a longer one."""
        keys, offsets = self.keys, self.key_offsets
        if not key:
            # Only the first row's key can be empty; an empty key is found anywhere.
            return self.value(0) if len(offsets) > 1 and offsets[1] == 0 else None
        at = keys.find(key)
        while at >= 0:
            # The last row starting at or before `at` (rows start at the same offset only
            # after an empty first key).
            i = bisect_right(offsets, at) - 1
            if offsets[i] == at and offsets[i + 1] - at == len(key):
                return self.value(i)
            at = keys.find(key, at + 1)
        return None

    def unpack(self) -> tuple[list[bytes], list[bytes]]:
        keys, values = self.keys, self.values
        return ([keys[a:b] for a, b in pairwise(self.key_offsets)],
                [values[a:b] for a, b in pairwise(self.value_offsets)])

    def rows(self, start: int) -> Iterator[tuple[bytes, bytes]]:
        keys, key_offsets = self.keys, self.key_offsets
        values, value_offsets = self.values, self.value_offsets
        for i in range(start, len(key_offsets) - 1):
            yield (keys[key_offsets[i]:key_offsets[i + 1]],
                   values[value_offsets[i]:value_offsets[i + 1]])


_EMPTY = Block([], [])
# A merge splices a block's changes into it, rather than unpacking its rows, when the
# block has more than this many rows per change (`_spliced`).
_SPLICE_BELOW = 6


def _shifted(offsets: array[int], by: int) -> array[int]:
    return array("I", map(add, offsets, repeat(by)))


def _unpacked(block: Block, changes: list[tuple[bytes, bytes | None]],
              ) -> tuple[list[bytes], array[int], list[bytes], array[int]]:
    """The rows of `block` with `changes` (puts and deletes, ascending) applied, as the
    pieces of their keys and of their values to join (here a row each), with the offsets
    of the rows in each."""
    keys, values = block.unpack()
    for key, value in changes:
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            if value is None:
                del keys[i]
                del values[i]
            else:
                values[i] = value
        elif value is not None:
            keys.insert(i, key)
            values.insert(i, value)
    return (keys, array("I", accumulate(map(len, keys), initial=0)),
            values, array("I", accumulate(map(len, values), initial=0)))


def _copy_rows(data: bytes, offsets: array[int], lo: int, hi: int, pieces: list[bytes],
               out: array[int]) -> None:
    """Rows `lo` to `hi` (excluded) of one side of a block (`data`, cut at `offsets`)
    appended to `pieces` as one piece, their offsets shifted onto the end of `out`."""
    a = offsets[lo]
    pieces.append(data[a:offsets[hi]])
    out.extend(map(add, offsets[lo + 1:hi + 1], repeat(out[-1] - a)))


def _spliced(block: Block, changes: list[tuple[bytes, bytes | None]],
             ) -> tuple[list[bytes], array[int], list[bytes], array[int]]:
    """As `_unpacked`, for a block with few changes: a run of rows between two changes
    is copied as one piece, its offsets shifted, so its cost is per change rather than
    per row (a change costs about what four rows unpacked and joined again do)."""
    keys, key_offsets = block.keys, block.key_offsets
    values, value_offsets = block.values, block.value_offsets
    n = len(key_offsets) - 1
    key_pieces: list[bytes] = []
    value_pieces: list[bytes] = []
    new_key_offsets = array("I", (0,))
    new_value_offsets = array("I", (0,))
    kept = 0  # the old rows before this index are copied or replaced
    for key, value in changes:
        i = block.position(key, lo=kept)
        if i > kept:
            _copy_rows(keys, key_offsets, kept, i, key_pieces, new_key_offsets)
            _copy_rows(values, value_offsets, kept, i, value_pieces, new_value_offsets)
        kept = i + 1 if i < n and keys[key_offsets[i]:key_offsets[i + 1]] == key else i
        if value is not None:
            key_pieces.append(key)
            new_key_offsets.append(new_key_offsets[-1] + len(key))
            value_pieces.append(value)
            new_value_offsets.append(new_value_offsets[-1] + len(value))
    if kept < n:
        _copy_rows(keys, key_offsets, kept, n, key_pieces, new_key_offsets)
        _copy_rows(values, value_offsets, kept, n, value_pieces, new_value_offsets)
    return key_pieces, new_key_offsets, value_pieces, new_value_offsets


def _families(blocks: list[Block], width: int) -> set[bytes]:
    """The first `width` bytes of every key in `blocks` (all of a shorter key)."""
    found: set[bytes] = set()
    for block in blocks:
        keys, offsets = block.keys, block.key_offsets
        last = offsets[-2]
        first = keys[:min(width, offsets[1])]
        if first == keys[last:min(last + width, offsets[-1])]:
            found.add(first)  # keys in order: all between share them
        else:
            found.update(keys[a:min(a + width, b)] for a, b in pairwise(offsets))
    return found


class Packed:
    """Rows in key order in immutable blocks; changed only by `merge`.

    `family`: how many of a key's first bytes name the table it belongs to. The tables
    with a row here are known (`families`), so a key of a table with none is found
    missing without a search: a store whose live runs' or holders' rows never last to a
    merge looks for a new start's among them at every arrival."""

    __slots__ = ("block_rows", "blocks", "count", "families", "family", "firsts")

    def __init__(self, block_rows: int = BLOCK_ROWS, family: int = 3) -> None:
        self.block_rows = block_rows
        self.family = family
        self.blocks: list[Block] = []
        # Each block's first key, for the bisect that finds a key's block.
        self.firsts: list[bytes] = []
        self.count = 0
        self.families: set[bytes] = set()

    def __len__(self) -> int:
        return self.count

    def get(self, key: bytes) -> bytes | None:
        if key[:self.family] not in self.families:
            return None
        at = bisect_right(self.firsts, key) - 1
        if at < 0:
            return None
        return self.blocks[at].find(key)

    def rows(self, start: bytes, after: bool = False) -> Iterator[tuple[bytes, bytes]]:
        """Rows from `start` (inclusive, or exclusive when `after`), ascending. Good until
        the next merge, which frees the blocks it replaces: a reader that outlives one
        starts again after its last row (MemoryStore does)."""
        blocks = self.blocks
        at = bisect_right(self.firsts, start) - 1
        if at < 0:
            at, first = 0, 0
        elif at < len(blocks):
            first = blocks[at].position(start, after)
        else:
            return
        for i in range(at, len(blocks)):
            yield from blocks[i].rows(first)
            first = 0

    def merge(self, changes: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply puts and deletes (None), given in ascending key order; the number of
        packed rows it made again (the rows of the blocks its changes fell into)."""
        blocks, firsts = self.blocks, self.firsts
        out_blocks: list[Block] = []
        out_firsts: list[bytes] = []
        count = self.count
        remade = 0
        rows = self.block_rows
        done = 0  # blocks before this index are copied to the output or replaced
        pending = list(changes)
        n = len(pending)
        c = 0
        while c < n:
            at = max(bisect_right(firsts, pending[c][0]) - 1, 0)
            out_blocks.extend(blocks[done:at])
            out_firsts.extend(firsts[done:at])
            # This block's changes: every one before the next block's first key.
            end = bisect_left(pending, (firsts[at + 1],), c) if at + 1 < len(firsts) else n
            if at < len(blocks):
                block = blocks[at]
                # Freed now rather than with the old list, so the blocks made next can
                # take its memory: a merge that rewrites every block does not need the
                # old and the new ones at once (the allocator would keep the high mark).
                blocks[at] = _EMPTY
                done = at + 1
            else:
                block = _EMPTY
                done = at
            count -= len(block)
            remade += len(block)
            changed = pending[c:end]
            keys, key_offsets, values, value_offsets = (
                _spliced if len(changed) * _SPLICE_BELOW < len(block) else _unpacked)(
                    block, changed)
            made = len(key_offsets) - 1
            if made and made < rows // 4 and out_blocks:
                # Too few rows left for a block of their own: joined to the one before.
                before = out_blocks.pop()
                out_firsts.pop()
                count -= len(before)
                made += len(before)
                keys.insert(0, before.keys)
                values.insert(0, before.values)
                key_offsets = before.key_offsets + _shifted(key_offsets[1:], len(before.keys))
                value_offsets = before.value_offsets + _shifted(value_offsets[1:],
                                                                len(before.values))
            count += made
            joined_keys, joined_values = b"".join(keys), b"".join(values)
            if made <= 2 * rows:
                if made:
                    out_blocks.append(Block.made(joined_keys, key_offsets, joined_values,
                                                 value_offsets))
                    out_firsts.append(joined_keys[:key_offsets[1]])
            else:
                for i in range(0, made, rows):
                    j = min(i + rows, made)
                    k0, v0 = key_offsets[i], value_offsets[i]
                    out_blocks.append(Block.made(
                        joined_keys[k0:key_offsets[j]], _shifted(key_offsets[i:j + 1], -k0),
                        joined_values[v0:value_offsets[j]],
                        _shifted(value_offsets[i:j + 1], -v0)))
                    out_firsts.append(joined_keys[k0:key_offsets[i + 1]])
            c = end
        out_blocks.extend(blocks[done:])
        out_firsts.extend(firsts[done:])
        self.blocks, self.firsts, self.count = out_blocks, out_firsts, count
        self.families = _families(out_blocks, self.family)
        return remade
