"""Timers as rows of the task's store, indexed by due time.

Being ordinary rows, timers go through the changelog, survive restarts and move
with the partition. The key layout of a stage store:

    STATE_PREFIX + stage key                 the stage's own rows
    TIMER_PREFIX + due (8 bytes BE) + key    one timer; value = its payload

Every row of a stage store must sit under one of these prefixes: stages build
their keys as STATE_PREFIX + key, never with a bare first byte 0x00.
"""

from __future__ import annotations

import struct

from sluicegate.engine.store import StoreTransaction

TIMER_PREFIX = b"\x00T"
STATE_PREFIX = b"\x00S"

_DUE = struct.Struct(">Q")
_HEAD = len(TIMER_PREFIX) + _DUE.size
_MAX_DUE = 2**64 - 1


def timer_key(due_ms: int, key: bytes) -> bytes:
    # Big-endian unsigned, so byte order is due order and a scan from
    # TIMER_PREFIX visits timers earliest first (ties by key).
    if not 0 <= due_ms <= _MAX_DUE:
        raise ValueError(f"timer due time {due_ms} ms is outside 0..2**64-1 (epoch ms)")
    return TIMER_PREFIX + _DUE.pack(due_ms) + key


def parse_timer_key(raw: bytes) -> tuple[int, bytes]:
    if len(raw) < _HEAD or not raw.startswith(TIMER_PREFIX):
        raise ValueError(f"{raw!r} is not a timer key (expected TIMER_PREFIX + 8-byte due + key)")
    return _DUE.unpack_from(raw, len(TIMER_PREFIX))[0], raw[_HEAD:]


class Timers:
    """The timer index of one task store, with its earliest due time kept in memory.

    `next_due` is exact at all times: the cache is dropped whenever the transaction's view
    changes other than through it (discard, restore writes, wipe), so no reload() is
    needed after an abort. reload() and rebind() exist for callers that swap or rebuild
    things explicitly.

    Finding the earliest starts at the transaction's floor for the timers (no live timer
    below it), so the timers cancelled before it (runs' leases, ended before they were
    due) are stepped over once, not at every look (docs/decisions/store-buffer-index.md).
    """

    def __init__(self, tx: StoreTransaction) -> None:
        self._tx = tx
        # The revision of `tx` that _next describes; None = stale.
        self._seen: tuple[int, int] | None = None
        self._next: int | None = None
        self._next_known = False

    def rebind(self, tx: StoreTransaction) -> None:
        self._tx = tx
        self._seen = None

    def schedule(self, due_ms: int, key: bytes, value: bytes = b"") -> None:
        """Add a timer; (due_ms, key) identifies it, so moving one means cancel + schedule."""
        raw = timer_key(due_ms, key)
        self._sync()
        tx = self._tx
        tx.put(raw, value)
        if raw < tx.floor(TIMER_PREFIX):
            tx.set_floor(TIMER_PREFIX, raw)
        if self._next_known and (self._next is None or due_ms < self._next):
            self._next = due_ms

    def cancel(self, due_ms: int, key: bytes) -> None:
        raw = timer_key(due_ms, key)
        self._sync()
        self._tx.delete(raw)
        if self._next == due_ms:
            self._next_known = False

    def due(self, now_ms: int, limit: int = 1000) -> list[tuple[int, bytes, bytes]]:
        """Timers due at or before `now_ms`, earliest first; the caller cancels each it handles."""
        next_due = self.next_due
        if next_due is None or next_due > now_ms:
            return []
        fired: list[tuple[int, bytes, bytes]] = []
        tx = self._tx
        for raw, value in tx.items(TIMER_PREFIX, tx.floor(TIMER_PREFIX)):
            due_ms, key = parse_timer_key(raw)
            if due_ms > now_ms or len(fired) >= limit:
                break
            fired.append((due_ms, key, value))
        return fired

    @property
    def next_due(self) -> int | None:
        self._sync()
        if not self._next_known:
            self._next = None
            tx = self._tx
            for raw, _ in tx.items(TIMER_PREFIX, tx.floor(TIMER_PREFIX)):
                tx.set_floor(TIMER_PREFIX, raw)
                self._next = parse_timer_key(raw)[0]
                break
            self._next_known = True
        return self._next

    def reload(self) -> None:
        self._seen = None
        self._sync()

    def _sync(self) -> None:
        revision = self._tx.revision
        if self._seen == revision:
            return
        self._seen = revision
        self._next_known = False
