"""Without the C extension (installed without a compiler, or turned off with
SLUICEGATE_NO_SPEEDUPS=1) every part of the package takes its Python reference, and a
worker says so once when it starts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from sluicegate.config import Settings
from sluicegate.ops import worker as worker_module
from sluicegate.schemas import native

# Every name the package takes from the extension, and the Python it takes otherwise.
_WHAT_RUNS = """
import importlib
from sluicegate.schemas import codec, native
from sluicegate.topology import keys
# (the package exports the function murmur2 under the module's name)
murmur2 = importlib.import_module("sluicegate.schemas.murmur2")
assert native.speedups is None, native.speedups
assert not codec.NATIVE
assert murmur2.murmur2 is murmur2.python_murmur2
assert murmur2.partition_for is murmur2.python_partition_for
assert keys.uuid5_text is keys.python_uuid5_text
assert keys.placed_uuid_text is keys.python_placed_uuid_text
print(native.missing_because)
"""


def test_turned_off_every_part_runs_its_python_reference() -> None:
    env = {**os.environ, native.TURN_OFF: "1"}
    out = subprocess.run([sys.executable, "-c", _WHAT_RUNS], env=env, capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "turned off (SLUICEGATE_NO_SPEEDUPS is set)"


class _Worker:
    worker_id = "w-1"
    metrics = None

    @classmethod
    def for_app(cls, *args: Any, **kwargs: Any) -> _Worker:
        return cls()

    def run(self, stopping: Any) -> None:
        pass


def _start_a_worker(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                    speedups: Any, because: str | None) -> list[logging.LogRecord]:
    """The log records a worker writes at start, with no broker and no app behind it."""
    monkeypatch.setattr(native, "speedups", speedups)
    monkeypatch.setattr(native, "missing_because", because)
    monkeypatch.setattr(worker_module, "load_app",
                        lambda *args: SimpleNamespace(workflows=[]))
    monkeypatch.setattr(worker_module, "Worker", _Worker)
    monkeypatch.setattr(worker_module, "settle_garbage_collector", lambda: None)
    monkeypatch.setattr(worker_module, "fix_mmap_threshold", lambda: False)
    caplog.set_level(logging.INFO, logger=worker_module.log.name)
    # Off the main thread, so it leaves the test process's signal handlers alone.
    started = threading.Thread(target=worker_module.run_worker,
                               args=("app", Settings(), threading.Event()))
    started.start()
    started.join(timeout=30)
    return [r for r in caplog.records if r.name == worker_module.log.name]


def test_a_worker_without_the_extension_says_so_once_at_start(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    logged = _start_a_worker(monkeypatch, caplog, None, "not built (installed without a C"
                             " compiler?)")
    warnings = [r.getMessage() for r in logged if r.levelno >= logging.WARNING]
    assert warnings == ["the C extension is not built (installed without a C compiler?): the"
                        " codec and execution ids run in pure Python, about 4x the CPU per"
                        " start (install the wheel, or install with a C compiler)"]


def test_a_worker_with_the_extension_warns_of_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    logged = _start_a_worker(monkeypatch, caplog, SimpleNamespace(), None)
    assert [r for r in logged if r.levelno >= logging.WARNING] == []
    assert any(r.getMessage().startswith("worker w-1:") for r in logged)
