"""A Bloom filter of a packed tier's keys: a key it does not hold is certainly not packed,
so a read of a key that is in no block (a holder or a waiting start looked for before it
is put, a run's row before its first write) is answered without a search of the blocks
(docs/decisions/packed-memory-rows.md).

Two bits a key, at places taken from the halves of the key's 64-bit hash (`hash` of a
bytes object, computed once and kept by the object), in `BITS_PER_KEY` bits for each key
it was made for: ~1-3.3% of the keys it does not hold answer "maybe" (the search then
finds nothing), 1.25 bytes for each key it was made for. Keys are only ever added; a
deleted key leaves its bits, so the owner makes the filter again once it has taken as
many keys as it was made for (`full`). The hash is the process's own (randomised per
process), which is all an in-memory filter needs: it is never kept or sent.
"""

from __future__ import annotations

from collections.abc import Iterable

# Bits per key the filter is made for: at that many keys, two bits a key give ~3.3% of
# false "maybe"s, at half of them (as made, by `Packed`) ~0.9%.
BITS_PER_KEY = 10
_LOW = 0xFFFFFFFF


class KeyFilter:
    """Says a key is certainly not among those added (`may_hold` False), or maybe is."""

    __slots__ = ("added", "bits", "capacity", "size")

    def __init__(self, capacity: int, keys: Iterable[bytes] = ()) -> None:
        self.capacity = max(capacity, 64)
        # In bits; at most 2**32, the range of each half of the hash.
        self.size = min(self.capacity * BITS_PER_KEY, 1 << 32)
        self.bits = bytearray((self.size + 7) >> 3)
        self.added = 0
        self.add_all(keys)

    def add_all(self, keys: Iterable[bytes]) -> None:
        bits, size = self.bits, self.size
        added = 0
        for key in keys:
            h = hash(key)
            a = (h & _LOW) % size
            bits[a >> 3] |= 1 << (a & 7)
            b = ((h >> 32) & _LOW) % size
            bits[b >> 3] |= 1 << (b & 7)
            added += 1
        self.added += added

    def may_hold(self, key: bytes) -> bool:
        h = hash(key)
        size = self.size
        a = (h & _LOW) % size
        if not self.bits[a >> 3] >> (a & 7) & 1:
            return False
        b = ((h >> 32) & _LOW) % size
        return bool(self.bits[b >> 3] >> (b & 7) & 1)

    @property
    def full(self) -> bool:
        """Whether it took the keys it was made for: its "maybe"s grow more common past
        that (deleted keys' bits included), so it is made again."""
        return self.added > self.capacity
