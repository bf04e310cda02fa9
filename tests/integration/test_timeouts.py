"""The runs stage's backstops on the real broker: timeouts.finish and the slot lease."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Outcome,
    RunEvent,
    RunEventKind,
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


def _status(rows: list[RunRow], execution_id: str) -> RunStatus | None:
    mine = [r for r in rows if r.execution_id == execution_id]
    return mine[-1].status if mine else None


def test_a_run_that_overruns_timeouts_finish_is_cancelled_recorded_failed_and_reported(
        settings: Settings, topics: Topics, app: App) -> None:
    clock = ManualClock()
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock):
        first = client.start("soloJob", {"jobId": "j1"}, wait_decision=True)
        assert first.status == "admitted" and first.execution_id is not None
        run = first.execution_id
        runs.until(lambda rows: _status(rows, run) is RunStatus.admitted, what="run row")
        # While it runs it holds the singleton key.
        assert client.start("soloJob", {"jobId": "j1"}, wait_decision=False).wait().status \
            == "skipped"

        clock.advance(9_999)
        clock.advance(2)  # 10.001 s after admission
        commands.until(lambda rows: len(rows) >= 1, what="the cancel command")
        runs.until(lambda rows: _status(rows, run) is RunStatus.failed, what="failed row")
        ledger.until(lambda rows: any(r.request_id == f"run:{run}:finish" for r in rows),
                     what="the ledger row of the overrun")
        handler = admitted.until(
            lambda rows: any(a.workflow == "jobFailed" for a in rows), what="the handler run")
        # The key is free again (the release went to the singleton stage in this worker,
        # handed over: docs/decisions/in-process-handover.md): a new start of the same
        # job runs.
        assert client.start("soloJob", {"jobId": "j1"}, wait_decision=True).status \
            == "admitted"
        ledger.until(lambda rows: sum(not r.request_id.startswith("run:") for r in rows) >= 4,
                     what="the decisions on the four start requests")
        ledger.settle()

    (command,) = commands.records
    assert (command.kind, command.execution_id, command.workflow) == (
        CommandKind.cancel, run, "soloJob")
    assert command.reason is not None and command.reason.startswith("timeouts.finish")
    assert "10s" in command.reason
    row = [r for r in runs.records if r.execution_id == run][-1]
    assert row.last_reason == command.reason and row.ended_at_ms == clock.now_ms()
    (overrun,) = [r for r in ledger.records if r.request_id == f"run:{run}:finish"]
    assert (overrun.outcome, overrun.execution_id, overrun.stage) == (Outcome.failed, run, "runs")
    assert overrun.waited_ms == 10_001
    # Every start request kept exactly one final outcome.
    finals = [r for r in ledger.records if not r.request_id.startswith("run:")]
    assert sorted(r.outcome.value for r in finals) == [
        "admitted", "admitted", "admitted", "skipped"]
    (report_run,) = [a for a in handler if a.workflow == "jobFailed"]
    report = json.loads(report_run.payload)
    assert report["reason"] == "timeouts.finish"
    assert report["workflow"] == "soloJob" and report["execution_id"] == run
    assert report["payload"] == {"jobId": "j1"}
    assert report["failed_at"] == clock.now_ms()


def test_a_run_that_ends_in_time_is_never_cancelled(
        settings: Settings, topics: Topics, app: App) -> None:
    clock = ManualClock()
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock):
        handle = client.start("slowJob", {"jobId": "j2"}, wait_decision=True)
        run = handle.execution_id
        assert run is not None
        _report(producer, topics, run, "slowJob", RunEventKind.completed, clock.now_ms())
        runs.until(lambda rows: _status(rows, run) is RunStatus.completed, what="completed")
        clock.advance(60_000)
        commands.settle()
        runs.settle()
    assert commands.records == []
    assert _status(runs.records, run) is RunStatus.completed


# -- the lease ---------------------------------------------------------------------------


def _report(producer: Producer, topics: Topics, execution_id: str, workflow: str,
            kind: RunEventKind, at_ms: int) -> tuple[int, int]:
    """Produce one run event; returns its (partition, offset)."""
    where: list[tuple[int, int]] = []
    event = RunEvent(execution_id=execution_id, workflow=workflow, kind=kind, at_ms=at_ms)
    producer.produce(topics.run_events, codec.encode(event), execution_id.encode(),
                     on_delivery=lambda err, msg: where.append((msg.partition(), msg.offset())))
    assert producer.flush(10) == 0 and where
    return where[0]


def _wait_consumed(settings: Settings, topics: Topics, partition: int, offset: int) -> None:
    """Until the workers' group has committed past `offset`: the record was processed."""
    probe = Consumer(settings.client_config(**{"group.id": topics.group}))
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (tp,) = probe.committed([TopicPartition(topics.run_events, partition)], timeout=10)
            if tp.offset > offset:
                return
            time.sleep(0.05)
        raise AssertionError(f"the worker did not process {topics.run_events}[{partition}]"
                             f"@{offset} within 30s")
    finally:
        probe.close()


def test_a_silent_run_gives_its_slot_back_after_the_lease_and_heartbeats_extend_it(
        settings: Settings, topics: Topics, app: App) -> None:
    clock = ManualClock()
    runs = TopicReader(settings, topics.runs, RunRow)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock):
        # leasedJob: one slot, leased for 1m to a run that reports nothing.
        holder = client.start("leasedJob", {"jobId": "a"}, wait_decision=True)
        assert holder.status == "admitted" and holder.execution_id is not None
        run = holder.execution_id
        waiting = client.start("leasedJob", {"jobId": "b"}, wait_decision=True)
        assert (waiting.status, waiting.deferral) == ("queued", "concurrency")
        runs.until(lambda rows: _status(rows, run) is RunStatus.admitted, what="run row")
        start = next(r for r in runs.records if r.execution_id == run).admitted_at_ms

        clock.advance(50_000)
        _wait_consumed(settings, topics, *_report(
            producer, topics, run, "leasedJob", RunEventKind.heartbeat, clock.now_ms()))
        # 70 s after admission: past the first lease, inside the one the heartbeat renewed.
        clock.advance(20_000)
        # The slot is not given back: the waiting start stays queued.
        ledger.settle()
        assert [r.outcome for r in ledger.records if r.request_id == waiting.request_id] == [
            Outcome.queued]
        clock.advance(40_001)  # 60.001 s after the heartbeat
        ledger.until(lambda rows: any(r.outcome is Outcome.lease_expired for r in rows),
                     what="the lease_expired ledger row")
        ledger.until(lambda rows: any(r.request_id == waiting.request_id
                                      and r.outcome is Outcome.admitted for r in rows),
                     what="the waiting start admitted into the freed slot")
        runs.until(lambda rows: _status(rows, run) is RunStatus.failed,
                   what="the silent run recorded failed (lost)")
        # Its engine reports it completed after all: an ended run does not change, nothing
        # is released twice, the slot stays taken.
        _wait_consumed(settings, topics, *_report(
            producer, topics, run, "leasedJob", RunEventKind.completed, clock.now_ms()))
        third = client.start("leasedJob", {"jobId": "c"}, wait_decision=True)
        assert (third.status, third.deferral) == ("queued", "concurrency")
        ledger.settle()

    # One slot given back, once: the waiting start took it, the third waits.
    assert [r.outcome for r in ledger.records if r.request_id == waiting.request_id] == [
        Outcome.queued, Outcome.admitted]
    (row,) = [r for r in ledger.records if r.outcome is Outcome.lease_expired]
    # leasedJob's limit declares no key: its text is empty.
    assert (row.execution_id, row.stage, row.key, row.control) == (
        run, "runs", "", "concurrency")
    assert row.request_id.startswith(f"run:{run}:lease")
    assert row.reason is not None and "1m" in row.reason and "heartbeat" in row.reason
    assert row.decided_at_ms == start + 110_001
    assert _status(runs.records, run) is RunStatus.failed
