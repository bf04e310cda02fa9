"""What the command line says when it cannot do what it was asked: one line, within
seconds, with an exit code a script can tell apart (2: fix the command or its settings;
1: the world is not as needed). No broker is needed for any of these: they are about
its absence."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluicegate.ops.services.ledger import LedgerDb, ask, fill
from sluicegate.schemas.records import LedgerRecord, Outcome
from tests.integration.cli import ROOT, sluicegate

# The commands issue 17 names, each as an operator would type it.
COMMANDS = {
    "flow": ("workflows", "flow"),
    "pause": ("workflows", "pause", "generateReport", "--reason", "deploying"),
    "cancel-many": ("workflows", "cancel-many", "--workflow", "generateReport", "--reason",
                    "stuck", "--limit", "5"),
    "ledger query": ("ledger", "query", "SELECT count(*) FROM ledger"),
    "topics create": ("topics", "create"),
}
WORKER = ("worker", "--app", "examples.demo")
DEADLINE_S = 5.0


@pytest.mark.parametrize("command", COMMANDS)
def test_no_broker_at_the_bootstrap_is_one_line_within_five_seconds(
        command: str, tmp_path: Path) -> None:
    ran = sluicegate(*COMMANDS[command], bootstrap="127.0.0.1:1", state_dir=tmp_path / "s",
                     timeout=30)
    assert ran.seconds < DEADLINE_S, f"took {ran.seconds:.1f}s"
    assert ran.code == 1
    (line,) = ran.error_lines
    assert line.startswith("error: no Kafka broker answered at 127.0.0.1:1 within 3s")
    assert "Connection refused" in line and "sluicegate kafka status" in line


@pytest.mark.parametrize("command", ["flow"])
def test_a_host_that_does_not_resolve_is_one_line_within_five_seconds(
        command: str, tmp_path: Path) -> None:
    ran = sluicegate(*COMMANDS[command], bootstrap="nosuchhost.invalid:9092",
                     state_dir=tmp_path / "s", timeout=30)
    assert ran.seconds < DEADLINE_S, f"took {ran.seconds:.1f}s"
    assert ran.code == 1
    (line,) = ran.error_lines
    assert "nosuchhost.invalid:9092" in line and "resolve" in line


@pytest.mark.parametrize(("bootstrap", "says"), [
    ("localhost:abc", "the port of 'localhost:abc' must be a number"),
    ("localhost", "'localhost' has no port"),
    ("127.0.0.1:9092,", "'' is not host:port"),
])
@pytest.mark.parametrize("command", [*COMMANDS, "worker"])
def test_a_bootstrap_that_is_not_host_port_is_a_usage_error_before_any_client(
        command: str, bootstrap: str, says: str, tmp_path: Path) -> None:
    ran = sluicegate(*COMMANDS.get(command, WORKER), bootstrap=bootstrap,
                     state_dir=tmp_path / "s", timeout=30)
    assert ran.code == 2
    (line,) = ran.error_lines
    assert line == line.strip() and says in line
    assert ran.seconds < DEADLINE_S


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("SLUICEGATE_PARTITIONS", "abc",
     "error: SLUICEGATE_PARTITIONS='abc': it takes a whole number from 1 to 10000"),
    ("SLUICEGATE_COMMIT_INTERVAL_MS", "60000",
     "error: SLUICEGATE_COMMIT_INTERVAL_MS='60000': it takes a whole number from 1 to 7500"),
    ("SLUICEGATE_KAFKA_SESSION_TIMEOUT_MS", "45000",
     "error: SLUICEGATE_KAFKA_SESSION_TIMEOUT_MS=45000: sluicegate sets session.timeout.ms"
     " itself"),
])
@pytest.mark.parametrize("command", ["topics create", "worker"])
def test_a_setting_sluicegate_does_not_take_is_one_line_naming_the_variable(
        command: str, variable: str, value: str, says: str, tmp_path: Path) -> None:
    ran = sluicegate(*COMMANDS.get(command, WORKER), bootstrap="127.0.0.1:1",
                     state_dir=tmp_path / "s", env={variable: value}, timeout=30)
    assert ran.code == 2
    assert "Traceback" not in ran.stderr
    (line,) = ran.error_lines
    assert line.startswith(says)


def test_timeout_sets_how_long_to_wait_for_the_broker(tmp_path: Path) -> None:
    ran = sluicegate("--timeout", "0.5", "workflows", "flow", bootstrap="127.0.0.1:1",
                     state_dir=tmp_path / "s", timeout=30)
    assert ran.code == 1 and "within 0.5s" in ran.stderr
    assert ran.seconds < 3.0


def test_a_declaration_error_is_its_message_without_a_traceback(tmp_path: Path) -> None:
    ran = sluicegate("topology", "show", "--app", "tests.apps.misspelt",
                     bootstrap="127.0.0.1:9092", state_dir=tmp_path / "s")
    assert ran.code == 2
    assert "Traceback" not in ran.stderr
    (line,) = ran.error_lines
    assert line.startswith("error: workflow misspelt: ") and "did you mean" in line


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    ran = sluicegate("--debug", "topology", "show", "--app", "tests.apps.misspelt",
                     bootstrap="127.0.0.1:9092", state_dir=tmp_path / "s")
    assert ran.code != 0
    assert "Traceback" in ran.stderr and "DeclarationError" in ran.stderr


# -- ledger query is read-only -----------------------------------------------------------


def _ledger_file(path: Path) -> Path:
    with LedgerDb(path) as db:
        fill(db, [
            LedgerRecord(request_id=f"r{i}", workflow="indexDocument", outcome=Outcome.collapsed,
                         requested_at_ms=1_000 + i, decided_at_ms=2_000 + i, key="doc0",
                         execution_id="e1")
            for i in range(3)
        ] + [LedgerRecord(request_id="r3", workflow="indexDocument", outcome=Outcome.admitted,
                          requested_at_ms=1_003, decided_at_ms=2_003, key="doc0",
                          execution_id="e1", folded=3)])
    return path


@pytest.mark.parametrize(("sql", "kind"), [
    ("DELETE FROM ledger WHERE outcome='collapsed'", "DELETE"),
    ("DROP TABLE _offsets", "DROP"),
    ("UPDATE ledger SET folded = 0", "UPDATE"),
    ("INSERT INTO _offsets VALUES ('sg.ledger', 0, 0)", "INSERT"),
])
def test_ledger_query_cannot_change_what_ledger_ask_answers_from(
        sql: str, kind: str, tmp_path: Path) -> None:
    db = _ledger_file(tmp_path / "ledger.duckdb")
    ran = sluicegate("ledger", "query", "--no-refresh", "--db", str(db), sql,
                     bootstrap="127.0.0.1:1", state_dir=tmp_path / "s")
    assert ran.code == 2
    (line,) = ran.error_lines
    assert line == (f"error: the ledger is read-only here: a {kind} statement cannot change "
                    "it (`ledger ask` and `flow` answer from it)")
    with LedgerDb(db) as after:
        (lost,) = ask(after, "lost").rows
        assert lost[-1] == "none lost"
        assert after.offsets("sg.ledger") == {0: 4}


def test_ledger_query_cannot_write_files(tmp_path: Path) -> None:
    db = _ledger_file(tmp_path / "ledger.duckdb")
    target = tmp_path / "out.csv"
    ran = sluicegate("ledger", "query", "--no-refresh", "--db", str(db),
                     f"COPY ledger TO '{target}'", bootstrap="127.0.0.1:1",
                     state_dir=tmp_path / "s")
    assert ran.code == 2 and not target.exists()
    assert "cannot read or write files" in ran.stderr


def test_ledger_query_still_reads(tmp_path: Path) -> None:
    db = _ledger_file(tmp_path / "ledger.duckdb")
    ran = sluicegate("ledger", "query", "--no-refresh", "--db", str(db), "--format", "csv",
                     "SELECT outcome, count(*) AS n FROM ledger GROUP BY 1 ORDER BY 1",
                     bootstrap="127.0.0.1:1", state_dir=tmp_path / "s")
    assert ran.code == 0, ran.stderr
    assert ran.stdout.splitlines() == ["outcome,n", "admitted,1", "collapsed,3"]


# -- ledger ask why at 80 columns --------------------------------------------------------


def test_ask_why_is_one_block_per_request_within_80_columns(tmp_path: Path) -> None:
    reason = ("concurrency: 2 of 2 slots of workflow generateReport in use; number 3 in "
              "line for the next free one")
    with LedgerDb(tmp_path / "ledger.duckdb") as db:
        fill(db, [LedgerRecord(
            request_id="4f1c2b0e-5d1a-4bb4-9a43-6a2f0e8c9d11", workflow="generateReport",
            outcome=Outcome.queued, requested_at_ms=1_000, decided_at_ms=2_000, key="",
            control="concurrency", stage="concurrency", reason=reason,
            deferral="concurrency", position=2, declaration_version="0123456789abcdef")])
    ran = sluicegate("ledger", "ask", "why", "--key", "", "--no-refresh", "--db",
                     str(tmp_path / "ledger.duckdb"), bootstrap="127.0.0.1:1",
                     state_dir=tmp_path / "s")
    assert ran.code == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[0] == "4f1c2b0e-5d1a-4bb4-9a43-6a2f0e8c9d11  generateReport  queued"
    assert "  key          (one key)" in lines
    text = " ".join(line.strip() for line in lines)
    assert reason in text


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:1", "nosuchhost.invalid:9092"])
def test_a_worker_with_no_broker_says_so_in_one_line_within_five_seconds_and_waits(
        bootstrap: str, tmp_path: Path) -> None:
    """A supervisor may start a worker before its broker: the worker waits for it, as it
    does for a broker that goes away later (tests/faults), and says so once, at once."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    environ.update(SLUICEGATE_BOOTSTRAP=bootstrap, SLUICEGATE_STATE_DIR=str(tmp_path / "s"))
    began = time.monotonic()
    worker = subprocess.Popen([sys.executable, "-m", "sluicegate", *WORKER], cwd=ROOT,
                              env=environ, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stderr is not None
        lines: list[str] = []
        while not any("waiting for Kafka" in line for line in lines):
            assert time.monotonic() - began < DEADLINE_S, lines
            lines.append(worker.stderr.readline())
        assert worker.poll() is None  # still waiting, not gone
        (waiting,) = [line for line in lines if "WARNING" in line or "ERROR" in line]
        assert f"waiting for Kafka at {bootstrap}" in waiting
        assert "Traceback" not in "".join(lines)
    finally:
        worker.terminate()
        worker.wait(30)
