"""What debounce and batch share: a group's verdict (run, or expire under timeouts.start),
when its timer wakes, the timer keys that order groups due at one instant by priority, and
the holds a folded run keeps (SPEC.md section 3, step 3; the defer stage)."""

from __future__ import annotations

from typing import Literal

from sluicegate.schemas.records import Slot

# What a pending group is owed at a given moment: to run now, or to expire (timeouts.start).
Verdict = Literal["run", "expire"]


def verdict(run_at: int, expire_at: int | None, now: int) -> Verdict | None:
    # At the same instant running wins: the start left the queue within its bound.
    if expire_at is not None and expire_at < run_at:
        return "expire" if now >= expire_at else None
    return "run" if now >= run_at else None


def wake(run_at: int, expire_at: int | None) -> int:
    return run_at if expire_at is None else min(run_at, expire_at)


# Timer keys: rank (8 bytes) + kind + the group's Kafka key, so groups due at the same
# instant fire in priority order.
RANK = 8
DEBOUNCE, BATCHED = b"d", b"b"


def timer_key(rank: bytes, kind: bytes, key: bytes) -> bytes:
    return rank + kind + key


def merged_slots(*lists: list[Slot]) -> list[Slot]:
    """Every hold the folded starts took (an identity key with a ttl each), once."""
    return list(dict.fromkeys(slot for slots in lists for slot in slots))
