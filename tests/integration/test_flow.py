"""The flow view on the real broker: a debounce and a concurrency limit under a worker
with a ManualClock; the CLI and the HTTP endpoint answer the same JSON."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import ManualClock
from sluicegate.ops.cli.root import app as cli
from sluicegate.ops.inspect import FLOW_PATH, open_server
from sluicegate.ops.services.control import write_control
from sluicegate.ops.services.metrics import WorkerMetrics
from sluicegate.schemas.records import ControlRow, LedgerRecord, Outcome, RunRow
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.concurrency import per_tenant
from tests.apps.defer import tour
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

APP = App([tour, per_tenant])
MINUTE = 60_000


def _count(rows: list[LedgerRecord], outcome: Outcome, workflow: str) -> int:
    return sum(1 for r in rows if r.outcome is outcome and r.workflow == workflow)


def _without_now(doc: dict[str, Any]) -> dict[str, Any]:
    """The document less what depends on the moment it was made."""
    doc = json.loads(json.dumps(doc))
    doc.pop("now_ms")
    for wf in doc["workflows"]:
        for line in [wf["total"], *wf["keys"]]:
            line.pop("waiting")
            line.pop("waiting_ms")
    return doc


def test_flow_shows_queued_collapsed_in_flight_and_paused_alike_on_cli_and_http(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    runs = TopicReader(settings, topics.runs, RunRow)
    metrics = WorkerMetrics()
    thread = WorkerThread(APP, settings, clock=clock)
    thread.worker.metrics = metrics
    with thread, Client(app=APP, settings=settings, replies=False) as client:
        for i in range(3):  # three edits of one row, a minute apart: one pending run
            client.submit("tourNarration", {"rowId": "r1", "editedAt": i})
            client.flush()
            ledger.until(lambda rows, n=i + 1: sum(
                r.outcome is Outcome.queued for r in rows) >= n, timeout=30, what="edit queued")
            clock.advance(MINUTE)
        for n in range(7):  # seven jobs of one tenant against a limit of five
            client.submit("perTenant", {"tenant": "acme", "n": n})
        client.flush()
        ledger.until(lambda rows: _count(rows, Outcome.admitted, "perTenant") == 5
                     and _count(rows, Outcome.queued, "perTenant") == 2,
                     timeout=30, what="five admitted, two queued")
        runs.until(lambda rows: len(rows) >= 5, timeout=30, what="five run rows")
        write_control(settings, ControlRow(workflow="tourNarration", paused=True,
                                           at_ms=t0, reason="deploying a fix", by="ana"))

        result = CliRunner().invoke(cli, [
            "workflows", "flow", "--format", "json", "--db", str(tmp_path / "ledger.duckdb"),
            "--bootstrap", settings.bootstrap, "--namespace", settings.namespace])
        assert result.exit_code == 0, result.output
        from_cli = json.loads(result.output)
        with open_server(settings, port=0) as server:
            with urllib.request.urlopen(server.url + FLOW_PATH, timeout=30) as response:
                from_http = json.loads(response.read())
            with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
                scraped = response.read().decode()

    ledger.close()
    runs.close()
    tenant_flow, tour_flow = from_cli["workflows"]  # sorted by name
    assert tour_flow["workflow"] == "tourNarration"
    assert tour_flow["paused"] is True
    assert tour_flow["pause"]["reason"] == "deploying a fix"
    (tour_key,) = tour_flow["keys"]
    assert {k: tour_key[k] for k in ("key", "queued", "collapsed", "dropped", "expired",
                                     "in_flight", "oldest_queued_at_ms")} == {
        "key": "tour:r1", "queued": 1, "collapsed": 2, "dropped": 0, "expired": 0,
        "in_flight": 0, "oldest_queued_at_ms": t0}
    # The clock the worker decided by is a manual one: the wait is measured from the
    # burst's first edit to the moment the view was made.
    assert tour_key["waiting_ms"] == from_cli["now_ms"] - t0
    assert tenant_flow["workflow"] == "perTenant" and tenant_flow["paused"] is False
    (acme,) = tenant_flow["keys"]
    assert (acme["key"], acme["queued"], acme["in_flight"]) == ("acme", 2, 5)
    assert acme["waiting"] is not None
    assert _without_now(from_http) == _without_now(from_cli)
    assert 'sluicegate_queued{workflow="perTenant"} 2.0' in scraped
    assert 'sluicegate_in_flight{workflow="perTenant"} 5.0' in scraped
    assert 'sluicegate_paused{workflow="tourNarration"} 1.0' in scraped
    assert 'sluicegate_decisions_total{outcome="collapsed",workflow="tourNarration"} 2.0' in scraped
    # The worker counted its commits and the records they covered.
    assert metrics.commits._value.get() > 0
    assert metrics.records._value.get() == thread.worker.processed > 0


def test_flow_for_one_workflow_in_text(settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    write_control(settings, ControlRow(workflow="tourNarration", paused=True, at_ms=1,
                                       reason="deploying a fix"))
    result = CliRunner().invoke(cli, [
        "workflows", "flow", "--workflow", "tourNarration", "--db",
        str(tmp_path / "ledger.duckdb"), "--bootstrap", settings.bootstrap,
        "--namespace", settings.namespace])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("tourNarration  PAUSED (deploying a fix)  queued=0")
