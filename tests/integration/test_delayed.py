"""Delayed starts (`at`) on the real broker, time driven by a ManualClock."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from sluicegate.client import BlockingCallerRefused, Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.kafkautil import watermarks
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.defer import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

MINUTE = 60_000


def _rows(ledger: TopicReader, request_id: str) -> list[LedgerRecord]:
    return [r for r in ledger.records if r.request_id == request_id]


class _Broker:
    def __init__(self, settings: Settings) -> None:
        create_topics(settings)
        topics = Topics(settings)
        self.clock = ManualClock()
        self.t0 = self.clock.now_ms()
        self.ledger = TopicReader(settings, topics.ledger, LedgerRecord)
        self.admitted = TopicReader(settings, topics.admitted, AdmittedStart)
        self.worker = WorkerThread(app, settings, clock=self.clock)
        self.client = Client(app=app, settings=settings)

    def runs(self, n: int) -> list[AdmittedStart]:
        return self.admitted.until(lambda rows: len(rows) >= n, timeout=30, what=f"{n} runs")

    def decided(self, request_id: str, n: int = 1) -> list[LedgerRecord]:
        self.ledger.until(lambda rows: sum(r.request_id == request_id for r in rows) >= n,
                          timeout=30, what=f"{n} rows for {request_id}")
        return _rows(self.ledger, request_id)


@pytest.fixture
def broker(settings: Settings) -> Any:
    b = _Broker(settings)
    with b.worker, b.client:
        yield b


def test_a_delayed_start_answers_queued_and_runs_at_its_instant(broker: _Broker) -> None:
    at = broker.t0 + 10 * MINUTE
    handle = broker.client.start("note", {"rowId": "r1", "editedAt": 1}, at=at)
    handle.wait(30)
    assert (handle.status, handle.deferral, handle.due_at_ms, handle.execution_id) == (
        "queued", "delayed", at, None)
    broker.clock.set(at - 1)
    broker.admitted.settle(0.5)
    assert broker.admitted.records == []
    broker.clock.set(at)
    (run,) = broker.runs(1)
    queued, admitted = broker.decided(handle.request_id, 2)

    assert run.admitted_at_ms == at
    assert run.request_ids == [handle.request_id]
    assert (queued.outcome, queued.deferral, queued.due_at_ms) == (Outcome.queued, "delayed", at)
    assert (admitted.outcome, admitted.execution_id) == (Outcome.admitted, run.execution_id)


def test_a_delayed_start_whose_instant_has_passed_starts_now(broker: _Broker) -> None:
    handle = broker.client.start("note", {"rowId": "r2", "editedAt": 1},
                                 at=broker.t0 - MINUTE)
    handle.wait(30)
    (run,) = broker.runs(1)

    assert handle.status == "admitted"
    assert handle.execution_id == run.execution_id
    assert run.admitted_at_ms == broker.t0
    assert [r.outcome for r in broker.decided(handle.request_id)] == [Outcome.admitted]


def test_two_delayed_starts_alike_never_collapse_into_one(broker: _Broker) -> None:
    at = broker.t0 + MINUTE
    same = {"rowId": "r3", "editedAt": 1}
    handles = [broker.client.start("note", same, at=at) for _ in range(2)]
    for handle in handles:
        handle.wait(30)
        assert (handle.status, handle.deferral) == ("queued", "delayed")
    broker.clock.set(at)
    runs = broker.runs(2)
    broker.admitted.settle(0.5)

    assert len(broker.admitted.records) == 2
    assert sorted(r.request_ids[0] for r in runs) == sorted(h.request_id for h in handles)
    assert len({r.execution_id for r in runs}) == 2
    assert all(json.loads(r.payload) == same for r in runs)


def test_at_its_instant_a_debounce_collapses_a_delayed_start_with_the_open_burst(
        broker: _Broker) -> None:
    delayed = broker.client.start("tourCapped", {"rowId": "r4", "editedAt": 2},
                                  at=broker.t0 + 2 * MINUTE)
    delayed.wait(30)
    now = broker.client.start("tourCapped", {"rowId": "r4", "editedAt": 1})
    broker.decided(now.request_id)
    broker.clock.set(broker.t0 + 2 * MINUTE)  # the delayed start arrives at the debounce
    broker.decided(now.request_id, 2)
    broker.clock.set(broker.t0 + 7 * MINUTE)  # five quiet minutes after it
    (run,) = broker.runs(1)
    broker.decided(delayed.request_id, 3)

    assert json.loads(run.payload) == {"rowId": "r4", "editedAt": 2}
    assert run.request_ids == [now.request_id, delayed.request_id]
    assert run.admitted_at_ms == broker.t0 + 7 * MINUTE
    assert [(r.outcome, r.deferral) for r in _rows(broker.ledger, delayed.request_id)] == [
        (Outcome.queued, "delayed"), (Outcome.queued, "debounce"), (Outcome.admitted, None)]
    assert [(r.outcome, r.execution_id) for r in _rows(broker.ledger, now.request_id)] == [
        (Outcome.queued, None), (Outcome.collapsed, run.execution_id)]


def test_waiting_for_the_decision_of_a_delayed_start_is_refused_and_sends_nothing(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    with Client(app=app, settings=settings, replies=False) as client, \
            pytest.raises(BlockingCallerRefused, match="workflow note: a delayed start"):
        client.start("note", {"rowId": "r5", "editedAt": 1}, at=4_000_000_000_000,
                     wait_decision=True)
    consumer = Consumer(settings.client_config(**{"group.id": "count"}))
    try:
        written = sum(watermarks(consumer, TopicPartition(topics.starts, p))[1]
                      for p in range(settings.partitions))
    finally:
        consumer.close()
    assert written == 0
