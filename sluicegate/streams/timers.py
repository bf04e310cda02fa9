"""Timers as rows of the task's store, indexed by due time.

Being ordinary rows, timers go through the changelog, survive restarts and move
with the partition. The key layout of a stage store:

    STATE_PREFIX + stage key                 the stage's own rows
    TIMER_PREFIX + due (8 bytes BE) + key    one timer; value = its payload

Every row of a stage store must sit under one of these prefixes: stages build
their keys as STATE_PREFIX + key, never with a bare first byte 0x00.
"""

from __future__ import annotations

import heapq
import struct

from sluicegate.streams.store import StoreTransaction

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

    `next_due` is exact at all times: the cache is dropped whenever the
    transaction's view changes underneath it (commit, discard, restore writes,
    wipe), so no reload() is needed after an abort. reload() and rebind() exist
    for callers that swap or rebuild things explicitly.
    """

    def __init__(self, tx: StoreTransaction) -> None:
        self._tx = tx
        # The revision of `tx` that _pending and _next describe; None = stale.
        self._seen: tuple[int, int] | None = None
        # Timer keys put in the current buffer, as a heap; entries whose key
        # was later deleted in the buffer are skipped lazily.
        self._pending: list[bytes] = []
        self._next: int | None = None
        self._next_known = False

    def rebind(self, tx: StoreTransaction) -> None:
        self._tx = tx
        self._seen = None

    def schedule(self, due_ms: int, key: bytes, value: bytes = b"") -> None:
        """Add a timer; (due_ms, key) identifies it, so moving one means cancel + schedule."""
        raw = timer_key(due_ms, key)
        self._sync()
        self._tx.put(raw, value)
        heapq.heappush(self._pending, raw)
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
        for raw, value in self._tx.items(TIMER_PREFIX):
            due_ms, key = parse_timer_key(raw)
            if due_ms > now_ms or len(fired) >= limit:
                break
            fired.append((due_ms, key, value))
        return fired

    @property
    def next_due(self) -> int | None:
        self._sync()
        if not self._next_known:
            self._next = self._earliest()
            self._next_known = True
        return self._next

    def reload(self) -> None:
        self._seen = None
        self._sync()

    def _sync(self) -> None:
        revision = self._tx.revision
        if self._seen == revision:
            return
        # Only reached at the first timer call after a commit, discard, restore
        # or rebind, when the buffer is (nearly) empty, so this scan is cheap.
        self._pending = [
            raw
            for raw, value in self._tx.changes.items()
            if value is not None and raw.startswith(TIMER_PREFIX)
        ]
        heapq.heapify(self._pending)
        self._seen = revision
        self._next_known = False

    def _earliest(self) -> int | None:
        changes = self._tx.changes
        pending = self._pending
        while pending and changes.get(pending[0]) is None:
            heapq.heappop(pending)
        best = pending[0] if pending else None
        for raw, _ in self._tx.store.items(TIMER_PREFIX):
            # A stored timer counts unless the buffer deleted it; one the
            # buffer overwrote is also in `pending`, with the same key.
            if raw in changes and changes[raw] is None:
                continue
            if best is None or raw < best:
                best = raw
            break
        return None if best is None else parse_timer_key(best)[0]
