"""Pause and unpause from the command line, end to end on the real broker."""

from __future__ import annotations

import json
import random
import time

import pytest
from typer.testing import CliRunner

from sluicegate.admission.control import ControlTable
from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.ops.cli.root import app as cli
from sluicegate.schemas.records import AdmittedStart, ControlRow, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.lifecycle import app, without_flaky
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker
runner = CliRunner()


def _cli(settings: Settings, *args: str) -> str:
    # Names are checked against these declarations (a fresh namespace has seen none).
    declared = [] if "--app" in args else ["--app", "tests.apps.lifecycle"]
    result = runner.invoke(cli, ["workflows", *args, *declared, "--bootstrap",
                                 settings.bootstrap, "--namespace", settings.namespace])
    assert result.exit_code == 0, result.output
    return result.output


def _queued(rows: list[LedgerRecord]) -> int:
    return sum(r.outcome is Outcome.queued and r.deferral == "pause" for r in rows)


def test_pause_collects_100_starts_and_unpause_admits_all_100_in_priority_order(
        settings: Settings) -> None:
    # One partition, so the order the engine reads sg.admitted in is one total order.
    settings = settings.with_(partitions=1)
    create_topics(settings)
    topics = Topics(settings)
    assert "paused rankedJob" in _cli(settings, "pause", "rankedJob", "--reason",
                                      "deploying a fix", "--by", "ops@example")
    control = TopicReader(settings, topics.control, ControlRow)
    (row,) = control.until(lambda rows: len(rows) >= 1, what="the pause row")
    assert (row.workflow, row.paused, row.reason, row.by) == (
        "rankedJob", True, "deploying a fix", "ops@example")
    assert control.keys == [b"pause:rankedJob"]

    ranks = list(range(100))
    random.Random(7).shuffle(ranks)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with Client(app=app, settings=settings, replies=False) as client, \
            WorkerThread(app, settings, ManualClock()):
        for n, rank in enumerate(ranks):
            client.submit("rankedJob", {"n": n, "rank": rank})
        client.flush()
        ledger.until(lambda rows: _queued(rows) >= 100, what="100 starts queued by the pause")
        admitted.settle()
        assert admitted.records == []

        _cli(settings, "unpause", "rankedJob")
        admitted.until(lambda rows: len(rows) >= 100, what="100 admitted after unpause")
        ledger.until(lambda rows: len(rows) >= 200, what="100 admitted decisions")
        ledger.settle()
        admitted.settle()

    order = [json.loads(a.payload)["rank"] for a in admitted.records]
    assert order == sorted(ranks, reverse=True)
    outcomes: dict[str, list[Outcome]] = {}
    for r in ledger.records:
        outcomes.setdefault(r.request_id, []).append(r.outcome)
    assert len(outcomes) == 100
    assert all(seen == [Outcome.queued, Outcome.admitted] for seen in outcomes.values())


def test_a_pause_reaches_a_running_worker_within_about_a_second_and_loses_nothing(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings):
        assert client.start("rankedJob", {"n": 0, "rank": 0},
                            wait_decision=True).status == "admitted"
        _cli(settings, "pause", "rankedJob", "--reason", "maintenance")
        paused_at = time.monotonic()
        statuses = []
        # Probe until a start is parked; every probe before that was admitted at once.
        while not statuses or statuses[-1] != "queued":
            assert time.monotonic() - paused_at < 3.0, f"not paused after 3s: {statuses}"
            handle = client.start("rankedJob", {"n": len(statuses) + 1, "rank": 0},
                                  wait_decision=True)
            statuses.append(handle.status)
        took = time.monotonic() - paused_at
        assert handle.deferral == "pause"
        _cli(settings, "unpause", "rankedJob", "--reason", "done")
        admitted.until(lambda rows: len(rows) >= len(statuses) + 1, what="the parked probe")
        admitted.settle()

    assert took < 2.0
    assert sorted(json.loads(a.payload)["n"] for a in admitted.records) == list(
        range(len(statuses) + 1))


def test_pause_needs_a_reason_and_with_an_app_a_declared_name(settings: Settings) -> None:
    missing = runner.invoke(cli, ["workflows", "pause", "rankedJob"])
    assert missing.exit_code != 0 and "--reason" in missing.output
    typo = runner.invoke(cli, ["workflows", "pause", "rankedJb", "--reason", "x",
                               "--app", "tests.apps.lifecycle", "--bootstrap",
                               settings.bootstrap, "--namespace", settings.namespace])
    assert typo.exit_code == 2
    assert ("no workflow 'rankedJb' declared in tests.apps.lifecycle; did you mean "
            "'rankedJob'") in typo.output



def test_starts_collected_or_delayed_for_a_workflow_removed_while_paused_fail_at_restore(
        settings: Settings) -> None:
    """Paused flakyJob collects two starts, and a third waits for its `at` an hour away;
    a worker restored with declarations that no longer have flakyJob fails all three at
    once (`failed`, onFailure told), and `unpause` with those declarations deletes the
    pause row that nothing else could clear."""
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    _cli(settings, "pause", "flakyJob", "--reason", "retiring it")
    control = TopicReader(settings, topics.control, ControlRow)
    control.until(lambda rows: len(rows) >= 1, what="the pause row")
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with Client(app=app, settings=settings, replies=False) as client, \
            WorkerThread(app, settings, clock):
        collected = [client.submit("flakyJob", {"jobId": f"j{i}"}) for i in range(2)]
        delayed = client.submit("flakyJob", {"jobId": "later"}, at=clock.now_ms() + 3_600_000)
        client.flush()
        ledger.until(lambda rows: _queued(rows) >= 2 and any(
            r.deferral == "delayed" for r in rows), what="two collected, one delayed")

    moved = settings.with_(state_dir=settings.state_dir.parent / "state-after")
    with WorkerThread(without_flaky, moved, clock):
        ledger.until(lambda rows: sum(r.outcome is Outcome.failed for r in rows) >= 3,
                     timeout=30, what="three failed starts")
        admitted.until(lambda rows: sum(a.workflow == "jobFailed" for a in rows) >= 3,
                       timeout=30, what="three onFailure runs")
    failed = [r for r in ledger.records if r.outcome is Outcome.failed]
    assert sorted(r.request_id for r in failed) == sorted(
        h.request_id for h in [*collected, delayed])
    assert {r.reason for r in failed} == {"workflow removed from the declarations"}
    assert not [a for a in admitted.records if a.workflow == "flakyJob"]
    reports = [json.loads(a.payload) for a in admitted.records if a.workflow == "jobFailed"]
    assert {r["workflow"] for r in reports} == {"flakyJob"}

    refused = runner.invoke(cli, ["workflows", "unpause", "neverPaused", "--app",
                                  "tests.apps.lifecycle:without_flaky", "--bootstrap",
                                  settings.bootstrap, "--namespace", settings.namespace])
    assert refused.exit_code == 2 and "not paused" in refused.output
    out = _cli(settings, "unpause", "flakyJob", "--app", "tests.apps.lifecycle:without_flaky")
    assert "deleted its pause row" in out
    table = ControlTable(settings)
    try:
        table.catch_up()
        assert "flakyJob" not in table.rows
    finally:
        table.close()
