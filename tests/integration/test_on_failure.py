"""onFailure on the real broker: every way a run fails to deliver starts the handler with
the failure report, and a failing handler is not reported again."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome, RunRow, RunStatus
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.lifecycle import app as lifecycle_app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def topics(settings: Settings) -> Iterator[Topics]:
    create_topics(settings)
    yield Topics(settings)


def _ended(rows: list[RunRow], execution_id: str) -> bool:
    return any(r.execution_id == execution_id and r.status is RunStatus.failed for r in rows)


def test_an_engine_failure_with_retries_spent_starts_the_handler_with_the_report(
        settings: Settings, topics: Topics) -> None:
    app: App = lifecycle_app
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    with Client(app=app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine, \
            WorkerThread(app, settings, ManualClock()):
        handle = client.start("flakyJob", {"jobId": "j1"}, wait_decision=True)
        run = handle.execution_id
        assert run is not None
        engine.started(next(d for d in engine if d.admitted is not None), run_id="run-7")
        engine.failed(run, "flakyJob", retries_spent=3, error_tag="Boom",
                      error_message="the downstream said no")
        engine.flush()
        runs.until(lambda rows: _ended(rows, run), what="the failed run row")
        admitted.until(lambda rows: any(a.workflow == "jobFailed" for a in rows),
                       what="the handler's run")
        admitted.settle()

    (handler,) = [a for a in admitted.records if a.workflow == "jobFailed"]
    assert json.loads(handler.payload) == {
        "workflow": "flakyJob", "payload": {"jobId": "j1"}, "error_tag": "Boom",
        "error_message": "the downstream said no", "run_id": "run-7", "execution_id": run,
        "reason": "retries exhausted (3)",
        "failed_at": json.loads(handler.payload)["failed_at"],
    }


def test_a_failing_failure_handler_is_logged_and_not_reported_again(
        settings: Settings, topics: Topics, caplog: pytest.LogCaptureFixture) -> None:
    app: App = lifecycle_app
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    with Client(app=app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine, \
            WorkerThread(app, settings, ManualClock()):
        handle = client.start("flakyJob", {"jobId": "j2"}, wait_decision=True)
        assert handle.execution_id is not None
        engine.failed(handle.execution_id, "flakyJob", retries_spent=1)
        engine.flush()
        handler = admitted.until(lambda rows: any(a.workflow == "jobFailed" for a in rows),
                                 what="the handler's run")
        (report_run,) = [a for a in handler if a.workflow == "jobFailed"]
        # The handler fails too: that is the floor.
        engine.failed(report_run.execution_id, "jobFailed", retries_spent=5,
                      error_message="the handler broke")
        engine.flush()
        runs.until(lambda rows: _ended(rows, report_run.execution_id),
                   what="the handler's failed row")
        admitted.settle(2.0)

    assert [a.workflow for a in admitted.records] == ["flakyJob", "jobFailed"]
    assert any("failure handler jobFailed failed" in r.getMessage() for r in caplog.records)


def test_a_start_that_waits_past_timeouts_start_expires_into_the_handler(
        settings: Settings, topics: Topics) -> None:
    app: App = lifecycle_app
    clock = ManualClock()
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock):
        # expiringJob: one slot, and a start waits at most 5 s for it.
        assert client.start("expiringJob", {"jobId": "a"}, wait_decision=True).status \
            == "admitted"
        waiting = client.start("expiringJob", {"jobId": "b"}, wait_decision=True)
        assert (waiting.status, waiting.deferral) == ("queued", "concurrency")
        clock.advance(5_001)
        admitted.until(lambda rows: any(a.workflow == "jobFailed" for a in rows),
                       what="the handler's run")
        ledger.until(lambda rows: any(r.request_id == waiting.request_id
                                      and r.outcome is Outcome.expired for r in rows),
                     what="the expiry")

    (handler,) = [a for a in admitted.records if a.workflow == "jobFailed"]
    report = json.loads(handler.payload)
    assert report["reason"].startswith("timeouts.start")
    assert (report["workflow"], report["payload"]) == ("expiringJob", {"jobId": "b"})
    # No run ever existed for it.
    assert report["run_id"] is None and report["execution_id"] is None
    assert report["failed_at"] == clock.now_ms()
