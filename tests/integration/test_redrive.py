"""Redrive shows in the runs table: a failed run the engine reports started again (after
`replay-many --mode redrive`) is running again; a completed run never changes."""

from __future__ import annotations

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.ops.services import bulk
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    EngineCommand,
    RunEvent,
    RunEventKind,
    RunRow,
    RunStatus,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.operations import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.integration.test_cancelon import _produce

pytestmark = pytest.mark.broker


def test_a_redriven_run_is_running_again_and_a_completed_one_stays_completed(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    runs = TopicReader(settings, topics.runs, RunRow)
    commands = TopicReader(settings, topics.commands, EngineCommand)

    def report(execution_id: str, kind: RunEventKind) -> None:
        clock.advance(1_000)
        _produce(settings, topics.run_events, execution_id.encode(), codec.encode(RunEvent(
            execution_id=execution_id, workflow="plainTour", kind=kind,
            at_ms=clock.now_ms(), error_message="boom" if kind is RunEventKind.failed
            else None)))

    def status_is(execution_id: str, status: RunStatus, what: str) -> None:
        runs.until(lambda rs: [r.status for r in rs if r.execution_id == execution_id][-1:]
                   == [status], timeout=30, what=what)

    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        for row in ("r1", "r2"):
            client.submit("plainTour", {"rowId": row, "issueKey": "K"})
        client.flush()
        first, done = (a.execution_id for a in admitted.until(
            lambda rs: len(rs) >= 2, timeout=30, what="two runs"))
        for kind in (RunEventKind.started, RunEventKind.failed):
            report(first, kind)
        for kind in (RunEventKind.started, RunEventKind.completed):
            report(done, kind)
        status_is(first, RunStatus.failed, "the first run failed")
        status_is(done, RunStatus.completed, "the second run completed")

        result = bulk.apply_replay(settings, RunStatus.failed, "redrive", 10,
                                   workflow="plainTour")
        assert [r.execution_id for r in result.succeeded] == [first]
        (command,) = commands.until(lambda cs: len(cs) >= 1, timeout=30, what="the redrive")
        assert (command.kind, command.execution_id) == (CommandKind.redrive, first)

        # The engine resumes it from the failed step; a late report on the completed run
        # changes nothing.
        report(first, RunEventKind.started)
        report(done, RunEventKind.started)
        status_is(first, RunStatus.running, "the redriven run running again")
        report(first, RunEventKind.completed)
        status_is(first, RunStatus.completed, "the redriven run completed")
        runs.settle(1.5)

    # The table publishes a run's latest row per commit, so two reports in one commit
    # cycle show as one change; each status waited for above did show.
    first_rows = [r.status for r in runs.records if r.execution_id == first]
    assert first_rows[-3:] == [RunStatus.failed, RunStatus.running, RunStatus.completed]
    assert first_rows[:-3] in ([], [RunStatus.admitted], [RunStatus.running],
                               [RunStatus.admitted, RunStatus.running])
    done_rows = [r.status for r in runs.records if r.execution_id == done]
    assert done_rows[-1] is RunStatus.completed
    assert done_rows.count(RunStatus.completed) == 1, "the late report changed nothing"
    redriven = [r for r in runs.records if r.execution_id == first][-2]
    assert redriven.ended_at_ms is None and redriven.slots == []
