"""A commit cycle keeps its interval however much one poll fetched: the worker commits when
the cycle is due, in the middle of a batch if need be (docs/decisions/cycle-slices.md)."""

from __future__ import annotations

import functools
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from pydantic import BaseModel

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

STARTS = 20_000
INTERVAL_MS = 100


class Job(BaseModel):
    n: int


def test_a_backlog_is_committed_in_cycles_of_the_interval_not_in_fetched_batches(
        settings: Settings) -> None:
    # One slot and no engine: every start but the first is parked, the gate's costlier path.
    app = App([Workflow(name="cadence", payload=Job, concurrency=[Concurrency(limit=1)])])
    settings = settings.with_(commit_interval_ms=INTERVAL_MS)
    create_topics(settings)
    topics = Topics(settings)
    builder = StartBuilder(app, settings)
    producer = Producer(settings.client_config())
    for n in range(STARTS):
        start, key = builder.build("cadence", {"n": n})
        producer.produce(topics.starts, codec.encode(start), key)
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0

    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings) as worker:
        cycles: list[tuple[float, int]] = []
        commit = worker._commit

        def timed_commit() -> None:
            cycles.append((time.monotonic() - worker._cycle_started, worker._cycle_records))
            commit()

        worker._commit = timed_commit  # type: ignore[method-assign]
        records = ledger.until(lambda rows: len(rows) >= STARTS, timeout=300)
    ledger.close()

    outcomes = Counter(r.outcome for r in records)
    assert outcomes == {Outcome.admitted: 1, Outcome.queued: STARTS - 1}
    busy = sorted(seconds for seconds, n in cycles if n > 0)
    assert len(busy) > 1
    # A batch of thousands of parked starts took seconds; now the cycle ends when due.
    # Slack for a loaded machine: the slowest tenth may run long, none for a second.
    assert busy[int(len(busy) * 0.9) - 1] <= 2 * INTERVAL_MS / 1000, busy
    assert busy[-1] < 1.0, busy



def at_least(n: int, rows: list[LedgerRecord]) -> bool:
    return len(rows) >= n


def test_a_cycle_with_nothing_more_to_read_waits_no_longer_than_until_it_is_due(
        settings: Settings) -> None:
    app = App([Workflow(name="quiet", payload=Job)])
    interval_s = 0.3  # longer than the loop's own 50 ms wait for a record
    settings = settings.with_(commit_interval_ms=int(interval_s * 1000))
    create_topics(settings)
    topics = Topics(settings)
    builder = StartBuilder(app, settings)
    producer = Producer(settings.client_config())
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    waits: list[tuple[float, float]] = []
    with WorkerThread(app, settings) as worker:
        wait_s = worker._wait_s

        def watched(most_s: float) -> float:
            wait = wait_s(most_s)
            if worker._in_txn:
                waits.append((wait, worker._cycle_started + interval_s - time.monotonic()))
            return wait

        worker._wait_s = watched  # type: ignore[method-assign]
        # One start at a time: each opens a cycle that then has nothing more to read.
        for n in range(1, 4):
            start, key = builder.build("quiet", {"n": n})
            producer.produce(topics.starts, codec.encode(start), key)
            assert producer.flush(30) == 0
            ledger.until(functools.partial(at_least, n), timeout=60)
    ledger.close()
    assert waits, "the loop never waited with a cycle open"
    # No wait with a cycle open went past the cycle's due time (read just after, so
    # 10 ms of slack for a thread switch): a quiet cycle commits when due, not 50 ms later.
    assert all(wait <= max(0.0, left) + 0.01 for wait, left in waits), waits
    assert any(wait < 0.05 for wait, _ in waits), waits
