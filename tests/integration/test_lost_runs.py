"""A run's lease on the real broker: the admitted start carries it to the engine
(docs/decisions/lease-on-the-admitted-start.md), and a run whose lease runs out without a
report is lost: failed, reported to its onFailure, cancelled, retried by a bulk replay
(docs/decisions/lost-runs.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from sluicegate.client import Client, Engine
from sluicegate.client.engine import Delivery
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import ManualClock
from sluicegate.ops.services import bulk
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Outcome,
    RunRow,
    RunStatus,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.lifecycle import app as lifecycle_app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def app() -> App:
    return lifecycle_app


@pytest.fixture
def topics(settings: Settings) -> Iterator[Topics]:
    create_topics(settings)
    yield Topics(settings)


def _deliveries(engine: Engine, count: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 60
    while len(got) < count:
        assert time.monotonic() < deadline, f"the engine got {len(got)} of {count} starts"
        delivery = engine.poll(0.5)
        if delivery is not None and delivery.admitted is not None:
            got.append(delivery)
    return got


def test_an_engine_is_told_each_runs_lease_and_how_often_to_heartbeat(
        settings: Settings, topics: Topics, app: App) -> None:
    with Client(app=app, settings=settings) as client, \
            WorkerThread(app, settings, ManualClock()), \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        leased = client.start("leasedJob", {"jobId": "a"}, wait_decision=True)
        plain = client.start("flakyJob", {"jobId": "b"}, wait_decision=True)
        timed = client.start("slowJob", {"jobId": "c"}, wait_decision=True)
        assert [h.status for h in (leased, plain, timed)] == ["admitted"] * 3
        by_id = {d.admitted.execution_id: d for d in _deliveries(engine, 3) if d.admitted}

    # leasedJob: a concurrency slot leased for 1m, to be reported every 15 s.
    delivery = by_id[leased.execution_id]
    assert (delivery.lease_ms, delivery.heartbeat_every_ms) == (60_000, 15_000)
    # No concurrency slot: no lease. timeouts.finish bounds the run instead of a lease.
    for handle in (plain, timed):
        delivery = by_id[handle.execution_id]
        assert (delivery.lease_ms, delivery.heartbeat_every_ms) == (None, None)


def _next_command(engine: Engine) -> EngineCommand:
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the engine never got a command"
        delivery = engine.poll(0.5)
        if delivery is not None and delivery.command is not None:
            return delivery.command


def _last(rows: list[RunRow], execution_id: str) -> RunRow | None:
    mine = [r for r in rows if r.execution_id == execution_id]
    return mine[-1] if mine else None


def test_a_run_whose_engine_goes_silent_is_lost_reported_cancelled_and_can_be_retried(
        settings: Settings, topics: Topics, app: App) -> None:
    clock = ManualClock()
    runs = TopicReader(settings, topics.runs, RunRow)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock), \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        handle = client.start("leasedJob", {"jobId": "a"}, wait_decision=True)
        run = handle.execution_id
        assert handle.status == "admitted" and run is not None
        (delivery,) = _deliveries(engine, 1)
        engine.started(delivery)
        engine.flush()
        runs.until(lambda rows: (r := _last(rows, run)) is not None
                   and r.status is RunStatus.running, what="the run running")
        # The engine dies: no heartbeat for the lease (1m) of the worker's own time.
        clock.advance(60_001)

        command = _next_command(engine)
        lost = runs.until(lambda rows: (r := _last(rows, run)) is not None
                          and r.status is RunStatus.failed, what="the run recorded failed")
        ledger.until(lambda rows: any(r.outcome is Outcome.lease_expired for r in rows),
                     what="the ledger row")
        admitted.until(lambda rows: any(a.workflow == "jobFailed" for a in rows),
                       what="the onFailure run")
        # Its slot went back: the next start of the workflow runs (and ends, so that the
        # retry below finds the slot free too).
        following = client.start("leasedJob", {"jobId": "b"}, wait_decision=True)
        assert following.status == "admitted" and following.execution_id is not None
        engine.completed(following.execution_id, "leasedJob")
        engine.flush()
        runs.until(lambda rows: (r := _last(rows, following.execution_id)) is not None
                   and r.status is RunStatus.completed, what="the next run completed")

        result = bulk.apply_replay(settings, RunStatus.failed, "retry", limit=5,
                                   workflow="leasedJob")
        assert [r.execution_id for r in result.succeeded] == [run]
        retry = admitted.until(lambda rows: any(a.retry_of == run for a in rows),
                               what="the retry admitted")

    row = _last(lost, run)
    assert row is not None and row.ended_at_ms == clock.now_ms()
    assert row.last_reason is not None and row.last_reason.startswith("lost:")
    assert (command.kind, command.execution_id, command.command_id, command.reason) == (
        CommandKind.cancel, run, f"lease_expired:{run}", row.last_reason)
    (lapsed,) = [r for r in ledger.records if r.outcome is Outcome.lease_expired]
    assert (lapsed.execution_id, lapsed.stage, lapsed.reason) == (run, "runs", row.last_reason)
    (handler,) = [a for a in admitted.records if a.workflow == "jobFailed"]
    report = json.loads(handler.payload)
    assert (report["workflow"], report["execution_id"], report["reason"]) == (
        "leasedJob", run, "lease_expired")
    assert report["payload"] == {"jobId": "a"} and report["error_message"] == row.last_reason
    (retried,) = [a for a in retry if a.retry_of == run]
    assert retried.workflow == "leasedJob" and retried.execution_id != run
    assert json.loads(retried.payload) == {"jobId": "a"}
