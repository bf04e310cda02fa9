"""A guaranteed share under a shared limit: `Concurrency(limit=100, pool="gpu",
fair_by="tenantId", floor=5)` (docs/decisions/concurrency-floor.md).

Every fairness value (a lane of the key's queue) with starts waiting is guaranteed
`floor` of the key's slots: a slot that frees goes first to a lane holding fewer than
`floor`, in the queue's own order among such lanes, and only then to the weighted round
of every lane. A lane holding its floor or more competes as before, so idle capacity is
still used: a lone tenant may take every slot. Nothing is taken away from a running run;
a floor is made good from the slots that free.

The stage counts the slots each lane holds at a key: a row per holder naming its lane
(logged with the holder's own row) and a count per lane derived from them at restore.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sluicegate.admission.pending import FairQueue, Parked
from sluicegate.engine.stage import StoreReader
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.tables import RAW, TEXT, Decimal, Joined, TableSpec
from sluicegate.engine.timers import STATE_PREFIX

# The concurrency stage's tables for floored keys (its `tables`; `key` below is the stage's
# length-prefixed key, so never a prefix of another key's rows): (key + execution id) ->
# the lane the holder took its slot in; (key, lane) -> the number of slots the lane holds,
# derived from the first.
LANE_OF = STATE_PREFIX + b"G"
LANE_HELD = STATE_PREFIX + b"F"
_LANE_OF = TableSpec("floor.lane_of", LANE_OF, RAW, TEXT)
_LANE_HELD = TableSpec("floor.lane_held", LANE_HELD, Joined(RAW, TEXT), Decimal(1),
                       derived=True)
TABLES: tuple[TableSpec[Any, Any], ...] = (_LANE_OF, _LANE_HELD)


def _count_key(key: bytes, lane: str) -> bytes:
    return LANE_HELD + _LANE_HELD.key.encode((key, lane))


def held(store: StoreReader | StoreTransaction, key: bytes, lane: str) -> int:
    raw = store.get(_count_key(key, lane))
    return _LANE_HELD.value.decode(raw) if raw else 0


def _add(tx: StoreTransaction, key: bytes, lane: str, n: int) -> None:
    total = held(tx, key, lane) + n
    if total > 0:
        tx.put(_count_key(key, lane), _LANE_HELD.value.encode(total))
    else:
        tx.delete(_count_key(key, lane))


def took(tx: StoreTransaction, key: bytes, execution_id: str, lane: str) -> None:
    """A start of `lane` took one of `key`'s slots."""
    tx.put(LANE_OF + key + execution_id.encode(), _LANE_OF.value.encode(lane))
    _add(tx, key, lane, 1)


def released(tx: StoreTransaction, key: bytes, execution_id: str) -> None:
    """The holder `execution_id` gave its slot of `key` back (nothing when it took it with
    no lane: before the key had a floor)."""
    row = LANE_OF + key + execution_id.encode()
    raw = tx.get(row)
    if raw is None:
        return
    tx.delete(row)
    _add(tx, key, _LANE_OF.value.decode(raw), -1)


def derive(store: StoreReader, holding: set[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The lanes' counts from their holders' rows (`holding`: key + execution id of each
    holder); a row whose holder is gone (released by a worker that did not know floors)
    counts for nothing."""
    counts: dict[tuple[bytes, str], int] = {}
    for row, raw in store.items(LANE_OF):
        where = row[len(LANE_OF):]
        if where not in holding:
            continue
        counted = (where[:split_at(where)], _LANE_OF.value.decode(raw))
        counts[counted] = counts.get(counted, 0) + 1
    for (key, lane), n in counts.items():
        yield _LANE_HELD.row((key, lane), n)


def split_at(where: bytes) -> int:
    """Where the length-prefixed key of `key + execution id` ends."""
    return 4 + int.from_bytes(where[:4], "big")


def next_start(queue: FairQueue, tx: StoreTransaction, key: bytes,
               floor: int) -> tuple[str, Parked] | None:
    """The start a freed slot of a floored key goes to: a lane under its floor first, in
    the queue's order among them; else the queue's weighted round."""
    under = queue.next(among=lambda lane: held(tx, key, lane) < floor)
    return under if under is not None else queue.next()
