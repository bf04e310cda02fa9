"""`sluicegate runs show` and `sluicegate ledger tail`, run as the real entry point on the
real broker; `GET /inspect/runs/ID` answers the document `runs show --format json` prints."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sluicegate.config import Settings
from sluicegate.ops.inspect import open_server
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Outcome, RunRow, RunStatus, Slot
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
EID = "5d1c0a7e-1111-5000-8000-00000000abcd"


def _env(settings: Settings) -> dict[str, str]:
    return {**os.environ, "SLUICEGATE_BOOTSTRAP": settings.bootstrap,
            "SLUICEGATE_NAMESPACE": settings.namespace,
            "SLUICEGATE_STATE_DIR": str(settings.state_dir)}


def _sluicegate(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluicegate", *args], cwd=ROOT,
                          env=_env(settings), capture_output=True, text=True, timeout=120)


def _write(settings: Settings, records: list[LedgerRecord], runs: list[RunRow]) -> None:
    topics = Topics(settings)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    for record in records:
        producer.produce(topics.ledger, codec.encode(record), record.request_id.encode())
    for row in runs:
        producer.produce(topics.runs, codec.encode(row), row.execution_id.encode())
    assert producer.flush(30) == 0


def _history(settings: Settings) -> None:
    now = int(time.time() * 1000)

    def rec(request_id: str, outcome: Outcome, at: int, **more: object) -> LedgerRecord:
        return LedgerRecord(request_id=request_id, workflow="tourNarration", outcome=outcome,
                            requested_at_ms=now, decided_at_ms=now + at, **more)  # type: ignore[arg-type]

    _write(settings, [
        rec("edit-1", Outcome.queued, 0, key="tour:r1", deferral="debounce",
            control="debounce", due_at_ms=now + 60_000),
        rec("edit-1", Outcome.collapsed, 10, key="tour:r1", execution_id=EID,
            reason="superseded by a later start with debounce key 'tour:r1'"),
        rec("edit-2", Outcome.queued, 11, key="tour:r1", deferral="debounce",
            control="debounce"),
        rec("edit-2", Outcome.admitted, 60, key="tour:r1", execution_id=EID, folded=1),
        rec("unrelated", Outcome.admitted, 5, execution_id="e-other"),
    ], [RunRow(execution_id=EID, workflow="tourNarration", status=RunStatus.running,
               payload=b'{"rowId": "r1"}', declaration_version="v1", admitted_at_ms=now + 60,
               updated_at_ms=now + 70, slots=[Slot("concurrency", "tourNarration\x1facme")],
               keys={})])


def test_runs_show_finds_a_run_by_execution_id_or_request_id_as_http_does(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    _history(settings)
    db = str(tmp_path / "ledger.duckdb")

    shown = _sluicegate(settings, "runs", "show", EID, "--format", "json", "--db", db)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["matched"] == "execution id"
    assert [(r["request_id"], r["outcome"]) for r in doc["ledger"]] == [
        ("edit-1", "queued"), ("edit-1", "collapsed"), ("edit-2", "queued"),
        ("edit-2", "admitted")]
    (run,) = doc["runs"]
    assert (run["status"], run["slots"]) == ("running", [{"stage": "concurrency",
                                                          "key": "acme"}])
    assert run["payload"] == {"rowId": "r1"}  # the JSON object, not a string of it

    text = _sluicegate(settings, "runs", "show", "edit-1", "--db", db)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("edit-1: matched as request id\n")
    assert f"run {EID}  tourNarration  running" in text.stdout
    assert "collapsed" in text.stdout and "superseded by a later start" in text.stdout

    missing = _sluicegate(settings, "runs", "show", "nosuch", "--db", db)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("error: no run or request has the id 'nosuch'")
    assert len(missing.stderr.strip().splitlines()) == 1

    with open_server(settings, port=0) as server, urllib.request.urlopen(
            f"{server.url}/inspect/runs/{EID}", timeout=30) as response:
        assert json.loads(response.read()) == doc


def test_ledger_tail_prints_each_new_decision_of_its_workflow_as_the_demo_does(
        settings: Settings) -> None:
    create_topics(settings)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "ledger", "tail", "--workflow", "perTenant",
         "--app", "tests.apps.concurrency"],
        cwd=ROOT, env={**_env(settings), "COLUMNS": "200"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    out: queue.Queue[str] = queue.Queue()
    err: queue.Queue[str] = queue.Queue()
    for stream, into in ((proc.stdout, out), (proc.stderr, err)):
        threading.Thread(target=lambda s=stream, q=into: [q.put(x) for x in s],
                         daemon=True).start()

    def line(q: queue.Queue[str], marker: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                got = q.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append(got)
            if marker in got:
                return got
        raise AssertionError(f"no line with {marker!r}: {seen}")

    try:
        line(err, "following the decisions of perTenant")
        now = int(time.time() * 1000)
        # One request id: one partition, so the other workflow's row comes first.
        _write(settings, [
            LedgerRecord(request_id="r1", workflow="otherFlow", outcome=Outcome.admitted,
                         requested_at_ms=now, decided_at_ms=now, execution_id="x" * 12),
            LedgerRecord(request_id="r1", workflow="perTenant", outcome=Outcome.dropped,
                         requested_at_ms=now, decided_at_ms=now, key="acme",
                         reason="rateLimit: 1 per 30s for key 'acme'"),
        ], [])
        printed = line(out, "perTenant")
        assert "dropped" in printed and "key=acme" in printed
        assert "(rateLimit: 1 per 30s for key 'acme')" in printed
        assert out.empty()  # otherFlow's row was not printed before it
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0


@pytest.mark.parametrize("command", [["runs", "show", "abc"], ["ledger", "tail"]])
def test_with_kafka_unreachable_the_command_says_so_in_one_line_within_5s(
        command: list[str], tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(bootstrap=f"127.0.0.1:{port}", namespace="down.",
                        state_dir=tmp_path / "state")
    began = time.monotonic()
    done = _sluicegate(settings, *command)
    took = time.monotonic() - began
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: no Kafka broker answered at 127.0.0.1:{port}")
    assert took < 5, took


def test_ledger_tail_refuses_a_workflow_that_is_not_declared(settings: Settings) -> None:
    create_topics(settings)
    done = _sluicegate(settings, "ledger", "tail", "--workflow", "perTenent", "--app",
                       "tests.apps.concurrency")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: no workflow 'perTenent' declared in "
                                   "tests.apps.concurrency; did you mean 'perTenant'?")
