"""Batch on the real broker, time driven by a ManualClock: exact ledger outcomes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import FailureReport
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.defer import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

SECOND = 1000


def _count(rows: list[LedgerRecord], outcome: Outcome, workflow: str | None = None) -> int:
    return sum(1 for r in rows if r.outcome is outcome and workflow in (None, r.workflow))


def _history(rows: list[LedgerRecord], request_id: str) -> list[Outcome]:
    return [r.outcome for r in rows if r.request_id == request_id]


def _send(client: Client, ledger: TopicReader, workflow: str,
          item: dict[str, Any], id: str | None = None) -> str:
    """One item, waited for until it is decided, so items arrive in the order sent."""
    handle = client.submit(workflow, item, id=id)
    client.flush()
    ledger.until(lambda rows: any(r.request_id == handle.request_id for r in rows),
                 timeout=30, what=f"item {item} decided")
    return handle.request_id


class _Broker:
    """A worker on a manual clock, a client, and readers of the ledger and admitted."""

    def __init__(self, settings: Settings) -> None:
        create_topics(settings)
        topics = Topics(settings)
        self.clock = ManualClock()
        self.t0 = self.clock.now_ms()
        self.ledger = TopicReader(settings, topics.ledger, LedgerRecord)
        self.admitted = TopicReader(settings, topics.admitted, AdmittedStart)
        self.worker = WorkerThread(app, settings, clock=self.clock)
        self.client = Client(app=app, settings=settings, replies=False)

    def runs(self, n: int) -> list[AdmittedStart]:
        return self.admitted.until(lambda rows: len(rows) >= n, timeout=30, what=f"{n} runs")


@pytest.fixture
def broker(settings: Settings) -> Any:
    b = _Broker(settings)
    with b.worker, b.client:
        yield b


def test_three_clicks_for_one_site_run_together_ten_seconds_after_the_first(
        broker: _Broker) -> None:
    requests = []
    for n, at in enumerate((0, 2 * SECOND, 9 * SECOND)):
        broker.clock.set(broker.t0 + at)
        requests.append(_send(broker.client, broker.ledger, "saveClicks",
                              {"siteId": "s1", "n": n}))
    broker.clock.set(broker.t0 + 10 * SECOND - 1)
    broker.admitted.settle(0.5)
    assert broker.admitted.records == []
    broker.clock.advance(1)
    (run,) = broker.runs(1)
    broker.ledger.until(lambda rows: _count(rows, Outcome.admitted) >= 1, what="admitted row")

    assert run.admitted_at_ms == broker.t0 + 10 * SECOND
    assert json.loads(run.payload) == {"items": [{"siteId": "s1", "n": n} for n in range(3)]}
    assert run.request_ids == requests
    rows = broker.ledger.records
    assert _history(rows, requests[0]) == [Outcome.queued, Outcome.admitted]
    for request in requests[1:]:
        assert _history(rows, request) == [Outcome.queued, Outcome.collapsed]
    assert {r.execution_id for r in rows if r.outcome is not Outcome.queued} == {
        run.execution_id}
    queued = [r for r in rows if r.outcome is Outcome.queued]
    assert {(r.deferral, r.due_at_ms, r.key) for r in queued} == {
        ("batch", broker.t0 + 10 * SECOND, "s1")}
    (admitted_row,) = [r for r in rows if r.outcome is Outcome.admitted]
    assert admitted_row.folded == 2


def test_two_hundred_and_fifty_clicks_make_three_runs_of_100_100_and_50(
        broker: _Broker) -> None:
    for n in range(250):
        broker.client.submit("saveClicks", {"siteId": "s2", "n": n})
    broker.client.flush()
    # Two batches fill up at once; the rest waits for the deadline.
    broker.runs(2)
    broker.ledger.until(lambda rows: _count(rows, Outcome.queued) >= 248, what="queued rows")
    broker.clock.advance(10 * SECOND)
    runs = broker.runs(3)
    broker.ledger.until(lambda rows: len({r.request_id for r in rows
                                          if r.outcome is not Outcome.queued}) >= 250,
                        what="250 final rows")
    broker.ledger.settle(0.5)

    assert sorted(len(r.request_ids) for r in runs) == [50, 100, 100]
    assert runs[2].admitted_at_ms == broker.t0 + 10 * SECOND
    items = [i["n"] for r in runs for i in json.loads(r.payload)["items"]]
    assert sorted(items) == list(range(250))
    outcomes = Counter(r.outcome for r in broker.ledger.records)
    # An item that completes a batch runs at once and is never queued.
    assert outcomes == {Outcome.queued: 248, Outcome.admitted: 3, Outcome.collapsed: 247}


def test_an_item_failing_if_runs_alone_at_once(broker: _Broker) -> None:
    waiting = _send(broker.client, broker.ledger, "importRows", {"table": "t1"})
    urgent = _send(broker.client, broker.ledger, "importRows", {"table": "t1", "urgent": True})
    (run,) = broker.runs(1)

    assert json.loads(run.payload) == {"items": [{"table": "t1", "urgent": True}]}
    assert run.request_ids == [urgent]
    assert run.admitted_at_ms == broker.t0
    rows = broker.ledger.records
    assert _history(rows, urgent) == [Outcome.admitted]
    assert _history(rows, waiting) == [Outcome.queued]


def test_an_item_that_would_pass_max_bytes_runs_the_open_batch_first(broker: _Broker) -> None:
    # Each row is 33 bytes of JSON: three make a 113-byte payload, a fourth would pass 120.
    rows = [{"table": "t2", "body": f"row-{n}-..."} for n in range(4)]
    assert all(len(json.dumps(r, separators=(",", ":"))) == 33 for r in rows)
    requests = [_send(broker.client, broker.ledger, "importRows", row) for row in rows[:3]]
    requests.append(broker.client.submit("importRows", rows[3]).request_id)
    broker.client.flush()
    (first,) = broker.runs(1)
    assert first.request_ids == requests[:3]
    assert first.admitted_at_ms == broker.t0
    assert len(first.payload) == 113
    broker.clock.advance(10 * SECOND)
    _, second = broker.runs(2)
    broker.ledger.until(lambda rows: _count(rows, Outcome.admitted) >= 2, what="admitted rows")

    assert second.request_ids == [requests[3]]
    assert json.loads(second.payload) == {"items": [rows[3]]}
    assert _history(broker.ledger.records, requests[3]) == [Outcome.queued, Outcome.admitted]


def test_a_batch_that_fails_the_workflow_payload_fails_every_item_and_reports_once(
        broker: _Broker) -> None:
    good = _send(broker.client, broker.ledger, "importRows", {"table": "t3"})
    poison = _send(broker.client, broker.ledger, "importRows",
                   {"table": "t3", "body": "poison"})
    broker.clock.advance(10 * SECOND)
    (handler,) = broker.runs(1)
    broker.ledger.until(lambda rows: _count(rows, Outcome.failed) >= 2, what="failed rows")
    broker.admitted.settle(0.5)

    rows = broker.ledger.records
    assert _history(rows, good) == [Outcome.queued, Outcome.failed]
    assert _history(rows, poison) == [Outcome.queued, Outcome.failed]
    (reason,) = {r.reason for r in rows if r.outcome is Outcome.failed}
    assert reason is not None
    assert "the batch of 2 items does not validate" in reason
    assert "a batch may not carry a poison row" in reason
    assert handler.workflow == "reportFailure"
    report = FailureReport.model_validate_json(handler.payload)
    assert report.workflow == "importRows"
    assert report.payload == {"items": [{"table": "t3"}, {"table": "t3", "body": "poison"}]}


def test_a_repeat_of_a_batched_start_answers_existing_with_the_batch_run(
        broker: _Broker) -> None:
    first = _send(broker.client, broker.ledger, "saveClicks", {"siteId": "s4"}, id="click-a")
    second = _send(broker.client, broker.ledger, "saveClicks", {"siteId": "s4"}, id="click-b")
    broker.clock.advance(10 * SECOND)
    (run,) = broker.runs(1)
    repeat = _send(broker.client, broker.ledger, "saveClicks", {"siteId": "s4"}, id="click-b")

    assert run.request_ids == [first, second]
    (row,) = [r for r in broker.ledger.records if r.request_id == repeat]
    assert (row.outcome, row.execution_id) == (Outcome.existing, run.execution_id)
