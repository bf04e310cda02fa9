"""A parked start keeps the Kafka headers it came with, to send them on when it leaves
(docs/decisions/record-headers.md): across a restart, through every way out of a queue,
at no cost to a start that came with none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.schemas.records import AdmittedKind, Origin, PendingStart
from sluicegate.streams.pending import (
    FairQueue,
    PendingQueue,
    pack_headers,
    unpack_headers,
)
from sluicegate.streams.stage import Headers
from sluicegate.streams.store import PartitionStore, StoreTransaction

HEADERS: Headers = [("sluicegate.cancelOn.group", b'{"batch":false}'), ("other", b"")]
HEADER_ROWS = b"\x00SP"  # where a parked start's headers are kept


def _header_rows(tx: StoreTransaction | PartitionStore) -> list[bytes]:
    return [key for key, _ in tx.items(HEADER_ROWS)]


def _start(n: int, priority: float = 0.0) -> PendingStart:
    return PendingStart(
        execution_id=f"x{n}", workflow="w", payload=b"{}", origin=Origin.event,
        kind=AdmittedKind.start, declaration_version="v", hop=1, request_id=f"r{n}",
        request_ids=[f"r{n}"], requested_at_ms=n, arrived_at_ms=n, priority=priority,
        slots=[])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    with PartitionStore(tmp_path / "stage-0") as s:
        yield s


def test_a_start_parked_with_headers_leaves_with_them_and_one_without_has_none(
        store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    queue = PendingQueue(tx, b"q")
    plain, with_headers = queue.park(_start(0))[0], queue.park(_start(1), headers=HEADERS)[0]
    assert plain.headers is None and with_headers.headers == HEADERS
    assert [p.headers for p in queue] == [None, HEADERS]
    assert queue.at(with_headers.row) == with_headers
    # Headers do not change the order: still first in, first out.
    assert [p.start.execution_id for p in queue] == ["x0", "x1"]
    assert queue.pop() == plain
    assert len(_header_rows(tx)) == 1
    assert queue.pop() == with_headers
    assert _header_rows(tx) == [], "the headers leave with their start"


def test_headers_survive_a_restart_and_every_way_out_of_a_queue_takes_them(
        store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    fair = FairQueue(tx, b"budget")
    fair.park("lane-a", _start(0), HEADERS)
    fair.park("lane-b", _start(1), HEADERS)
    queue = PendingQueue(tx, b"q")
    for n in range(2, 5):
        queue.push(_start(n), headers=HEADERS)
    tx.commit(0)
    assert len(_header_rows(store)) == 5

    tx = StoreTransaction(store)  # a restart: the rows come back as they were committed
    fair = FairQueue(tx, b"budget")
    served = fair.next()
    assert served is not None and served[1].headers == HEADERS
    fair.take(*served)
    other = fair.next()
    assert other is not None
    fair.remove(*other)
    queue = PendingQueue(tx, b"q")
    head = queue.peek()
    assert head is not None and head.headers == HEADERS
    queue.remove(head)
    queue.clear()
    tx.commit(1)
    assert _header_rows(store) == []


def test_a_start_without_headers_costs_no_row_beside_its_own(store: PartitionStore) -> None:
    tx = StoreTransaction(store)
    PendingQueue(tx, b"q").push(_start(0), headers=[])
    queued = PendingQueue(tx, b"q").peek()
    assert queued is not None and queued.headers is None
    assert _header_rows(tx) == []


@given(st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=5))
def test_headers_pack_and_unpack_to_themselves(headers: list[tuple[str, bytes]]) -> None:
    assert unpack_headers(pack_headers(list(headers))) == headers
