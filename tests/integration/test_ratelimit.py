"""rateLimit on the real broker, time driven by a ManualClock: the excess is dropped, on
the ledger with its key and reason, and a waiting caller hears RateLimited."""

from __future__ import annotations

from collections import Counter

import pytest

from sluicegate.client import Client, RateLimited
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.rates import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

FOUR_HOURS = 4 * 3_600_000


def test_three_low_stock_events_two_for_p1_start_two_runs_and_drop_one_for_four_hours(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        first = client.submit("lowStockAlert", {"productId": "p1"})
        client.flush()
        ledger.until(lambda rows: len(rows) >= 1, what="the first alert's decision")
        clock.advance(60_000)
        second = client.submit("lowStockAlert", {"productId": "p1"})
        other = client.submit("lowStockAlert", {"productId": "p2"})
        client.flush()
        ledger.until(lambda rows: len(rows) >= 3, what="three decisions")
        admitted.until(lambda rows: len(rows) >= 2, what="two runs")
        ledger.settle()
        admitted.settle()

    outcomes = {row.request_id: row.outcome for row in ledger.records}
    assert outcomes == {first.request_id: Outcome.admitted, second.request_id: Outcome.dropped,
                        other.request_id: Outcome.admitted}
    (drop,) = (row for row in ledger.records if row.outcome is Outcome.dropped)
    assert drop.key == "p1"
    assert drop.stage == "ratelimit"
    assert drop.retry_after_ms == FOUR_HOURS - 60_000
    assert drop.reason is not None and "rateLimit: 1 per 4h for key 'p1'" in drop.reason
    assert drop.execution_id is None
    assert Counter(a.workflow for a in admitted.records) == {"lowStockAlert": 2}


def test_a_caller_waiting_for_the_decision_hears_rate_limited_with_the_retry_after(
        settings: Settings) -> None:
    create_topics(settings)
    clock = ManualClock()
    with WorkerThread(app, settings, clock=clock), Client(app=app, settings=settings) as client:
        handle = client.start("lowStockAlert", {"productId": "p7"}, wait_decision=True,
                              timeout=60)
        assert handle.status == "admitted"
        clock.advance(1000)
        with pytest.raises(RateLimited, match="retry after") as caught:
            client.start("lowStockAlert", {"productId": "p7"}, wait_decision=True, timeout=60)
        clock.advance(FOUR_HOURS - 1000)
        again = client.start("lowStockAlert", {"productId": "p7"}, wait_decision=True,
                             timeout=60)
    assert caught.value.retry_after_ms == FOUR_HOURS - 1000
    assert caught.value.handle.status == "dropped"
    assert again.status == "admitted"
