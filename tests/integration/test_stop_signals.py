"""SIGTERM and SIGINT from a process's first moment (docs/decisions/stop-from-the-start.md):
a worker told to stop while it is still starting stops cleanly, exit 0 and no traceback,
as it does once running; every other command still ends on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluicegate.config import Settings
from sluicegate.topology.admin import create_topics
from tests.integration.cli import ROOT

pytestmark = [pytest.mark.broker,
              pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                 reason="reads which signals a process catches from /proc")]

DEADLINE_S = 30.0


def _spawn(bootstrap: str, tmp_path: Path, *args: str,
           namespace: str = "stop.") -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    environ.update(SLUICEGATE_BOOTSTRAP=bootstrap, SLUICEGATE_STATE_DIR=str(tmp_path / "s"),
                   SLUICEGATE_NAMESPACE=namespace)
    return subprocess.Popen([sys.executable, "-m", "sluicegate", *args], cwd=ROOT,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(mask, 16) >> (signum - 1) & 1)


def _signal_at_first_handler(proc: subprocess.Popen[str], signum: int) -> None:
    """Send `signum` the moment the process first catches SIGTERM (Python catches SIGINT
    from its own start; sluicegate keeps both, SIGTERM last)."""
    began = time.monotonic()
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() - began < DEADLINE_S, "the signal is never caught"
        time.sleep(0.001)
    proc.send_signal(signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_worker_told_to_stop_while_it_starts_stops_cleanly(
        bootstrap: str, tmp_path: Path, signum: int) -> None:
    worker = _spawn(bootstrap, tmp_path, "worker", "--app", "tests.apps.identity")
    _signal_at_first_handler(worker, signum)
    output, _ = worker.communicate(timeout=DEADLINE_S)
    # Sent while the command line was still importing: before, SIGTERM killed it (-15)
    # and SIGINT showed a traceback.
    assert worker.returncode == 0, output
    assert "Traceback" not in output, output
    assert "stopped before it started" in output, output
    # Nothing was started: no consumer, no transaction.
    assert "assigned partitions" not in output, output


def test_a_worker_told_to_stop_as_it_joins_stops_cleanly(settings: Settings,
                                                         tmp_path: Path) -> None:
    """The other end of the start: SIGTERM at the worker's first log line."""
    create_topics(settings)
    worker = _spawn(settings.bootstrap, tmp_path, "worker", "--app", "tests.apps.identity",
                    namespace=settings.namespace)
    assert worker.stdout is not None
    began = time.monotonic()
    lines = []
    while not lines or "workflows, state in" not in lines[-1]:
        assert time.monotonic() - began < DEADLINE_S, lines
        lines.append(worker.stdout.readline())
    worker.send_signal(signal.SIGTERM)
    output = "".join(lines) + worker.communicate(timeout=DEADLINE_S)[0]
    assert worker.returncode == 0, output
    assert "Traceback" not in output, output


def test_another_command_still_ends_on_a_signal_sent_while_it_starts(
        bootstrap: str, tmp_path: Path) -> None:
    """A kept signal is not swallowed: a command with no graceful stop of its own acts on
    it once it runs (`ledger tail` would otherwise follow the ledger until killed)."""
    tail = _spawn(bootstrap, tmp_path, "ledger", "tail")
    _signal_at_first_handler(tail, signal.SIGTERM)
    output, _ = tail.communicate(timeout=DEADLINE_S)
    assert tail.returncode == -signal.SIGTERM, output
    assert "Traceback" not in output, output
