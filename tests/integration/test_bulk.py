"""Bulk cancel and replay on the real broker: the dry run, the limit, the skipped runs."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.ops import bulk
from sluicegate.ops.workflows import app as workflows_cli
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    EngineCommand,
    RunEvent,
    RunEventKind,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.streams.clock import ManualClock
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.operations import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


def _report(settings: Settings, execution_id: str, kind: RunEventKind) -> None:
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    producer.produce(Topics(settings).run_events, codec.encode(RunEvent(
        execution_id=execution_id, workflow="plainTour", kind=kind, at_ms=1,
        retries_spent=3 if kind is RunEventKind.failed else None)), execution_id.encode())
    assert producer.flush(30) == 0


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
