"""Timers as rows of the task's store, indexed by due time.

Being ordinary rows, timers go through the changelog, survive restarts and move
with the partition. The key layout of a stage store:

    STATE_PREFIX + stage key                         the stage's own rows
    TIMER_PREFIX + due (8 bytes BE) + key            one timer; value = its payload
    DERIVED_TIMER_PREFIX + due (8 bytes BE) + key    one derived timer (never logged)

Every row of a stage store must sit under one of these prefixes: stages build
their keys as STATE_PREFIX + key, never with a bare first byte 0x00.
"""

from __future__ import annotations

from sluicegate.engine.held import HeldTimers
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.tables import Floors
from sluicegate.engine.timerkeys import (
    DERIVED_TIMER_PREFIX,
    STATE_PREFIX,
    TIMER_PREFIX,
    parse_timer_key,
    timer_key,
)

__all__ = ["DERIVED_TIMER_PREFIX", "STATE_PREFIX", "TIMER_PREFIX", "TimerIndex", "Timers",
           "parse_timer_key", "timer_key"]


class Timers:
    """A stage's timers on one task: those it logs, and those it derives from its other
    rows (`derived`: the timer keys starting with one of these prefixes), each in an index
    of its own under its own prefix, fired together in due order."""

    __slots__ = ("_derived", "_derived_keys", "_logged")

    def __init__(self, tx: StoreTransaction, derived: tuple[bytes, ...] = (),
                 held: HeldTimers | None = None) -> None:
        """`held`: the derived timers a memory store holds as values (engine.held), where
        they are kept instead of in an index of rows."""
        self._logged = TimerIndex(tx)
        self._derived_keys = derived
        self._derived: TimerIndex | HeldTimers | None = (
            None if not derived else held if held is not None
            else TimerIndex(tx, DERIVED_TIMER_PREFIX))

    def _index(self, key: bytes) -> TimerIndex | HeldTimers:
        if self._derived is not None and key.startswith(self._derived_keys):
            return self._derived
        return self._logged

    def rebind(self, tx: StoreTransaction) -> None:
        self._logged.rebind(tx)
        if self._derived is not None:
            self._derived.rebind(tx)

    def schedule(self, due_ms: int, key: bytes, value: bytes = b"") -> None:
        """Add a timer; (due_ms, key) identifies it, so moving one means cancel + schedule."""
        self._index(key).schedule(due_ms, key, value)

    def cancel(self, due_ms: int, key: bytes) -> None:
        self._index(key).cancel(due_ms, key)

    def due(self, now_ms: int, limit: int = 1000) -> list[tuple[int, bytes, bytes]]:
        """Timers due at or before `now_ms`, earliest first; the caller cancels each it handles."""
        fired = self._logged.due(now_ms, limit)
        if self._derived is None:
            return fired
        derived = self._derived.due(now_ms, limit)
        if not derived:
            return fired
        return sorted(fired + derived)[:limit]

    @property
    def next_due(self) -> int | None:
        logged = self._logged.next_due
        if self._derived is None:
            return logged
        derived = self._derived.next_due
        if logged is None or (derived is not None and derived < logged):
            return derived
        return logged

    def reload(self) -> None:
        self._logged.reload()
        if self._derived is not None:
            self._derived.reload()


class TimerIndex:
    """The timers of one task store under one prefix, with their earliest due time kept in
    memory.

    `next_due` is exact at all times: the cache is dropped whenever the transaction's view
    changes other than through it (discard, restore writes, wipe), so no reload() is
    needed after an abort. reload() and rebind() exist for callers that swap or rebuild
    things explicitly.

    Finding the earliest starts at the transaction's floor for the timers (no live timer
    below it), so the timers cancelled before it (runs' leases, ended before they were
    due) are stepped over once, not at every look (docs/decisions/store-buffer-index.md).
    """

    def __init__(self, tx: StoreTransaction, prefix: bytes = TIMER_PREFIX) -> None:
        self._tx = tx
        self._prefix = prefix
        self._floors = Floors(tx, f"timers {prefix!r}")
        # The revision of `tx` that _next describes; None = stale.
        self._seen: tuple[int, int] | None = None
        self._next: int | None = None
        self._next_known = False

    def rebind(self, tx: StoreTransaction) -> None:
        self._tx = tx
        self._floors = Floors(tx, f"timers {self._prefix!r}")
        self._seen = None

    def schedule(self, due_ms: int, key: bytes, value: bytes = b"") -> None:
        """Add a timer; (due_ms, key) identifies it, so moving one means cancel + schedule."""
        raw = timer_key(due_ms, key, self._prefix)
        self._sync()
        self._floors.put(self._prefix, raw, value)
        if self._next_known and (self._next is None or due_ms < self._next):
            self._next = due_ms

    def cancel(self, due_ms: int, key: bytes) -> None:
        raw = timer_key(due_ms, key, self._prefix)
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
        for raw, value in self._tx.items(self._prefix, self._floors.floor(self._prefix)):
            due_ms, key = parse_timer_key(raw, self._prefix)
            if due_ms > now_ms or len(fired) >= limit:
                break
            fired.append((due_ms, key, value))
        return fired

    @property
    def next_due(self) -> int | None:
        self._sync()
        if not self._next_known:
            first = self._floors.first(self._prefix)
            self._next = None if first is None else parse_timer_key(first, self._prefix)[0]
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
