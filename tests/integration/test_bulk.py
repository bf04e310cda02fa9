"""Bulk cancel and replay on the real broker: the dry run, the limit, the skipped runs."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.ops.cli.workflows import app as workflows_cli
from sluicegate.ops.services import bulk
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
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.operations import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


def _report(settings: Settings, execution_id: str, kind: RunEventKind, at_ms: int = 1,
            reason: str | None = None) -> None:
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    producer.produce(Topics(settings).run_events, codec.encode(RunEvent(
        execution_id=execution_id, workflow="plainTour", kind=kind, at_ms=at_ms,
        retries_spent=3 if kind is RunEventKind.failed else None, reason=reason)),
        execution_id.encode())
    assert producer.flush(30) == 0


def _latest(rows: list[RunRow], execution_id: str) -> RunRow | None:
    mine = [r for r in rows if r.execution_id == execution_id]
    return mine[-1] if mine else None


def test_the_dry_run_changes_nothing_and_names_the_runs_the_commit_acts_on(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    starts = TopicReader(settings, topics.starts, StartRequest)
    clock = ManualClock()
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        for i in range(5):
            client.submit("plainTour", {"rowId": f"r{i}", "issueKey": "K"})
            client.flush()
            admitted.until(lambda rs: len(rs) > i, what=f"run {i}")  # noqa: B023 - called now
            clock.advance(10)
        ids = [a.execution_id for a in admitted.records]
        _report(settings, ids[0], RunEventKind.started)
        _report(settings, ids[1], RunEventKind.suspended)
        _report(settings, ids[3], RunEventKind.failed)
        _report(settings, ids[4], RunEventKind.completed)
        runs.until(lambda rs: {r.execution_id for r in rs if r.status in (
            RunStatus.failed, RunStatus.completed)} == {ids[3], ids[4]}, what="ended runs")

        preview = bulk.preview_cancel(settings, "plainTour", limit=2)
        commands.settle(1.0)
        assert commands.records == []
        assert [r.execution_id for r in preview.succeeded] == ids[:2]
        assert (preview.truncated, preview.eligible) == (True, 3)  # ids[2] is admitted
        assert {(r.execution_id, r.status) for r in preview.skipped} == {
            (ids[3], "failed"), (ids[4], "completed")}
        assert all("can be cancelled" in (r.detail or "") for r in preview.skipped)

        result = CliRunner().invoke(workflows_cli, [
            "cancel-many", "--workflow", "plainTour", "--reason", "bad deploy", "--limit", "2",
            "--commit", "--format", "json", "--bootstrap", settings.bootstrap,
            "--namespace", settings.namespace])
        assert result.exit_code == 0, result.output
        applied = json.loads(result.output)
        assert [r["execution_id"] for r in applied["succeeded"]] == ids[:2]
        assert applied["truncated"] is True and applied["failed"] == []
        commands.until(lambda cs: len(cs) >= 2, what="two cancel commands")

        redrive = bulk.apply_replay(settings, RunStatus.failed, "redrive", limit=10)
        retried = bulk.apply_replay(settings, RunStatus.failed, "retry", limit=10)
        commands.until(lambda cs: len(cs) >= 3, what="the redrive command")
        starts.until(lambda ss: any(s.request_id == f"retry:{ids[3]}" for s in ss),
                     what="the retry start")
        commands.settle(0.5)

    cancels = [c for c in commands.records if c.kind is CommandKind.cancel]
    assert sorted(c.execution_id for c in cancels) == sorted(ids[:2])
    assert {c.reason for c in cancels} == {"bad deploy"}
    (redriven,) = [c for c in commands.records if c.kind is CommandKind.redrive]
    assert redriven.execution_id == ids[3]
    assert [r.execution_id for r in redrive.succeeded] == [ids[3]]
    assert not redrive.truncated and redrive.skipped == []
    (retry,) = [s for s in starts.records if s.request_id == f"retry:{ids[3]}"]
    assert (retry.idempotency_id, retry.workflow) == (f"retry:{ids[3]}", "plainTour")
    assert [r.execution_id for r in retried.succeeded] == [ids[3]]


def test_replay_skips_runs_the_mode_cannot_replay_with_the_reason(settings: Settings) -> None:
    rows = [RunRow(execution_id="c1", workflow="w", status=RunStatus.cancelled, payload=b"{}",
                   declaration_version="v", admitted_at_ms=1, updated_at_ms=1, slots=[],
                   keys={})]
    result = bulk.preview_replay(settings, RunStatus.cancelled, "redrive", 5, runs=rows)
    assert result.succeeded == []
    (skipped,) = result.skipped
    assert skipped.detail is not None and "only a failed run has" in skipped.detail


def test_a_retried_run_is_admitted_with_retry_of_naming_the_run_it_retries(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    with WorkerThread(app, settings), \
            Client(app=app, settings=settings, replies=False) as client:
        client.submit("plainTour", {"rowId": "r1", "issueKey": "K"})
        client.flush()
        (first,) = admitted.until(lambda rs: len(rs) >= 1, what="the first run")
        _report(settings, first.execution_id, RunEventKind.failed)
        runs.until(lambda rs: any(r.status is RunStatus.failed for r in rs), what="its failure")

        result = bulk.apply_replay(settings, RunStatus.failed, "retry", limit=5,
                                   workflow="plainTour")
        assert [r.execution_id for r in result.succeeded] == [first.execution_id]
        admitted.until(lambda rs: len(rs) >= 2, what="the retry admitted")

    retry = admitted.records[1]
    assert retry.request_ids == [f"retry:{first.execution_id}"]
    assert retry.execution_id != first.execution_id
    assert retry.retry_of == first.execution_id
    assert first.retry_of is None


def test_a_bulk_cancel_records_the_operators_reason_on_every_run_and_in_the_ledger(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings), \
            Client(app=app, settings=settings, replies=False) as client:
        for row in ("r1", "r2"):
            client.submit("plainTour", {"rowId": row, "issueKey": "K"})
        client.flush()
        running, asleep = (a.execution_id for a in admitted.until(
            lambda rs: len(rs) >= 2, what="two runs"))
        _report(settings, running, RunEventKind.started, at_ms=10)
        _report(settings, asleep, RunEventKind.suspended, at_ms=10,
                reason="waiting for approval")
        runs.until(lambda rs: getattr(_latest(rs, asleep), "last_reason", None)
                   == "waiting for approval", what="the suspended run")

        result = CliRunner().invoke(workflows_cli, [
            "cancel-many", "--workflow", "plainTour", "--reason", "bad deploy", "--limit", "5",
            "--commit", "--format", "json", "--bootstrap", settings.bootstrap,
            "--namespace", settings.namespace])
        assert result.exit_code == 0, result.output
        applied = json.loads(result.output)
        commands.until(lambda cs: len(cs) >= 2, what="two cancel commands")
        # The engine cancels both and says nothing of why.
        for run in (running, asleep):
            _report(settings, run, RunEventKind.cancelled, at_ms=20)
        runs.until(lambda rs: all(getattr(_latest(rs, r), "status", None)
                                  is RunStatus.cancelled for r in (running, asleep)),
                   what="both runs cancelled")
        for run in (running, asleep):
            row = _latest(runs.records, run)
            assert row is not None and (row.status, row.last_reason) == (
                RunStatus.cancelled, "bad deploy")
        ledger.until(lambda ls: sum(r.outcome is Outcome.cancelled for r in ls) >= 2,
                     what="a ledger row per cancelled run")

    assert {c.reason for c in commands.records} == {"bad deploy"}
    operation = applied["operation"]
    rows = [r for r in ledger.records if r.request_id.startswith("run:")]
    assert sorted((r.request_id, r.outcome, r.reason, r.stage) for r in rows) == sorted(
        (f"run:{run}:bulk-cancel:{operation}", Outcome.cancelled, "bad deploy", "runs")
        for run in (running, asleep))
    assert {r.execution_id for r in rows} == {running, asleep}


def test_every_redrive_sends_a_command_of_its_own_and_each_replay_writes_a_ledger_row(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)

    def status_is(run: str, status: RunStatus, what: str) -> None:
        runs.until(lambda rs: getattr(_latest(rs, run), "status", None) is status, what=what)

    with WorkerThread(app, settings), \
            Client(app=app, settings=settings, replies=False) as client:
        client.submit("plainTour", {"rowId": "r1", "issueKey": "K"})
        client.flush()
        (first,) = admitted.until(lambda rs: len(rs) >= 1, what="the run")
        run = first.execution_id
        _report(settings, run, RunEventKind.failed, at_ms=10)
        status_is(run, RunStatus.failed, "the run failed")
        once = bulk.apply_replay(settings, RunStatus.failed, "redrive", 5,
                                 workflow="plainTour", reason="downstream fixed")
        commands.until(lambda cs: len(cs) >= 1, what="the first redrive")
        # Redriven, it fails again 52 s later, and the operator redrives it again.
        _report(settings, run, RunEventKind.started, at_ms=20)
        status_is(run, RunStatus.running, "the run redriven")
        _report(settings, run, RunEventKind.failed, at_ms=52_020)
        status_is(run, RunStatus.failed, "the run failed again")
        twice = bulk.apply_replay(settings, RunStatus.failed, "redrive", 5,
                                  workflow="plainTour", reason="downstream fixed")
        first_command, second_command = commands.until(lambda cs: len(cs) >= 2,
                                                       what="the second redrive")
        # An engine drops a command whose id it has seen (docs/wire-format.md).
        assert first_command.command_id != second_command.command_id
        assert (first_command.kind, second_command.kind) == (CommandKind.redrive,) * 2
        assert first_command.execution_id == second_command.execution_id == run
        retried = bulk.apply_replay(settings, RunStatus.failed, "retry", 5,
                                    workflow="plainTour")
        ledger.until(lambda ls: sum(r.request_id.startswith("run:") for r in ls) >= 3,
                     what="a ledger row per replay")

    assert first_command.reason == "downstream fixed"
    rows = sorted((r.request_id, r.outcome, r.reason, r.execution_id)
                  for r in ledger.records if r.request_id.startswith("run:"))
    assert rows == sorted([
        (f"run:{run}:bulk-redrive:{once.operation}", Outcome.redriven, "downstream fixed", run),
        (f"run:{run}:bulk-redrive:{twice.operation}", Outcome.redriven, "downstream fixed",
         run),
        (f"run:{run}:bulk-retry:{retried.operation}", Outcome.retried,
         "replay-many --mode retry", run),
    ])
