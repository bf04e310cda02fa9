"""The demo drains: its reference engine runs a workflow's runs as wide as the workflow's
concurrency limit, the demo's parting advice is a command that works where it ran, and
Ctrl-C stops it however it was started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from examples import demo
from examples.engine import FunctionEngine, widths
from sluicegate.client import Delivery, RecentRuns
from sluicegate.ops.cli.demo import kafka_down_command
from sluicegate.schemas.records import AdmittedKind, AdmittedStart, Origin


class FakeEngine:
    """The Engine's side of the contract, in memory: deliveries in, reports out."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = deliveries
        self.reports: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.begun = RecentRuns()

    def poll(self, timeout: float) -> Delivery | None:
        return self.deliveries.pop(0) if self.deliveries else None

    def started(self, delivery: Delivery) -> bool:
        assert delivery.admitted is not None
        if not self.begun.claim(delivery.admitted.execution_id):
            return False
        with self.lock:
            self.reports.append(("started", delivery.admitted.execution_id))
        return True

    def completed(self, execution_id: str, workflow: str) -> None:
        with self.lock:
            self.reports.append(("completed", execution_id))

    def failed(self, execution_id: str, workflow: str, **_: Any) -> None:
        with self.lock:
            self.reports.append(("failed", execution_id))

    def heartbeat(self, execution_id: str, workflow: str) -> None:
        with self.lock:
            self.reports.append(("heartbeat", execution_id))

    def flush(self) -> None:
        pass


def _delivery(i: int, workflow: str = "generateReport",
              heartbeat_every_ms: int | None = None) -> Delivery:
    return Delivery(admitted=AdmittedStart(
        execution_id=f"e{i}", workflow=workflow,
        payload=json.dumps({"accountId": "a1", "plan": "free"}).encode(),
        declaration_version="v1", origin=Origin.event, kind=AdmittedKind.start, slots=[],
        request_ids=[f"r{i}"], requested_at_ms=0, admitted_at_ms=0,
        lease_ms=None if heartbeat_every_ms is None else 4 * heartbeat_every_ms,
        heartbeat_every_ms=heartbeat_every_ms))


def test_the_engine_heartbeats_a_run_as_often_as_its_admitted_start_asks_while_it_runs(
) -> None:
    now = [100.0]
    release = threading.Event()
    fake = FakeEngine([])
    engine = FunctionEngine(fake, {"generateReport": lambda _: release.wait(5)},
                            clock=lambda: now[0])  # type: ignore[arg-type]
    engine.handle(_delivery(1, heartbeat_every_ms=15_000))
    engine.handle(_delivery(2))  # no lease: no heartbeat asked for
    for _ in range(3):
        engine.beat()
        now[0] += 15.0
    engine.beat()
    assert [r for r in fake.reports if r[0] == "heartbeat"] == [("heartbeat", "e1")] * 3
    release.set()
    engine.run(lambda: True)  # stops at once, waiting for the runs to end
    now[0] += 60.0
    engine.beat()
    assert len([r for r in fake.reports if r[0] == "heartbeat"]) == 3, "not once it ended"


def test_the_engine_runs_as_many_reports_at_once_as_the_limit_allows() -> None:
    assert widths(demo.app) == {"generateReport": 2}
    running = 0
    most = 0
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=5)

    def report(_payload: dict[str, Any]) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        both.wait()  # a single-threaded engine never gets the second one here
        time.sleep(0.05)
        with lock:
            running -= 1

    fake = FakeEngine([_delivery(i) for i in range(6)])
    engine = FunctionEngine(fake, {"generateReport": report}, widths(demo.app))  # type: ignore[arg-type]
    engine.run(lambda: not fake.deliveries)
    assert (engine.completed, engine.failed) == (6, 0)
    assert most == 2, "never more at once than the declared limit"
    assert [kind for kind, _ in fake.reports].count("completed") == 6


def test_the_engine_does_not_run_again_a_start_delivered_twice() -> None:
    calls: list[str] = []
    fake = FakeEngine([_delivery(1), _delivery(2), _delivery(1)])
    engine = FunctionEngine(fake, {"generateReport": lambda p: calls.append(p["accountId"])})  # type: ignore[arg-type]
    engine.run(lambda: not fake.deliveries)
    assert (engine.completed, len(calls)) == (2, 2)
    assert [r for r in fake.reports if r[0] == "started"] == [("started", "e1"),
                                                              ("started", "e2")]


def test_the_parting_command_names_the_venvs_script_when_it_is_not_on_path(
        tmp_path: Path) -> None:
    python = tmp_path / ".venv" / "bin" / "python"
    assert kafka_down_command(9092, executable=str(python), cwd=tmp_path, path="") == (
        ".venv/bin/sluicegate kafka down --port 9092")


def test_the_parting_command_is_plain_when_path_finds_the_same_script(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sluicegate"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert kafka_down_command(19092, executable=str(bin_dir / "python"), cwd=Path("/"),
                              path=str(bin_dir)) == "sluicegate kafka down --port 19092"


def test_ctrl_c_stops_a_process_started_with_sigint_ignored() -> None:
    # A background job of a non-interactive shell (or nohup) starts with SIGINT ignored,
    # and Python keeps it so: the demo and `ledger tail` would run on after Ctrl-C.
    script = ("import sys, time\n"
              "from sluicegate.ops.signals import ctrl_c_stops\n"
              "ctrl_c_stops()\n"
              "try:\n"
              "    print('ready', flush=True)\n"
              "    time.sleep(60)\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted', flush=True)\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "interrupted"
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
