"""A worker that is not coming back leaves the group when it stops (`--leave-on-stop`), so
its partitions move to the others at once instead of after the session timeout, during
which a static member's partitions make no decision (docs/operations.md)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sluicegate.config import Settings
from sluicegate.topology.admin import create_topics
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = pytest.mark.broker

APP = "tests.apps.faults"
# The worker's session timeout (engine/runtime.py): how long a static member's partitions
# wait for it.
SESSION_TIMEOUT_S = 6.0


def _assignments(worker: WorkerProcess) -> list[set[int]]:
    return [{int(p) for p in re.findall(r"\d+", found)} for found in
            re.findall(r"assigned partitions \[([\d, ]*)\]", worker.log.read_text())]


def _until(what: str, done: object, deadline_s: float, worker: WorkerProcess) -> float:
    started = time.monotonic()
    while not done():  # type: ignore[operator]
        assert time.monotonic() - started < deadline_s, f"{what}: {worker.log_tail()}"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_worker_that_leaves_on_stop_hands_its_partitions_over_at_once(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    every = set(range(settings.partitions))
    stayer = WorkerProcess(settings, APP, tmp_path / "stayer").start()
    leaver = WorkerProcess(settings, APP, tmp_path / "leaver", "--leave-on-stop")
    try:
        _until("the first worker owns every partition",
               lambda: _assignments(stayer) and _assignments(stayer)[-1] == every, 60, stayer)
        leaver.start()
        _until("the two share the partitions",
               lambda: _assignments(leaver) and _assignments(leaver)[-1], 60, leaver)
        _until("the first gave some up",
               lambda: _assignments(stayer)[-1] != every, 60, stayer)
        seen = len(_assignments(stayer))
        assert leaver.stop() == 0, leaver.log_tail()
        took = _until("the partitions came back",
                      lambda: any(a == every for a in _assignments(stayer)[seen:]),
                      3 * SESSION_TIMEOUT_S, stayer)
        assert took < SESSION_TIMEOUT_S - 1, (
            f"{took:.1f}s after the stop: the partitions waited for the session timeout")
    finally:
        for worker in (stayer, leaver):
            if worker.alive:
                worker.stop()
