"""A worker frozen (a stopped process, a stalled VM, a long pause) past its session while
timers of its partitions are pending: its partitions move to the other worker, which
fires those timers and admits the parked starts. When the frozen worker wakes, its
clock says the same timers are due; a transaction it commits then, with no records read
in it, must be fenced like any other, not admit the starts a second time
(docs/decisions/fenced-transactions.md)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.schemas.records import Outcome
from sluicegate.topology.admin import create_topics
from tests.apps.frozen import app
from tests.faults.harness import MARKS, Outcomes
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

APP = "tests.apps.frozen"
DOCS = 48


def _wait(condition: object, what: str, timeout_s: float, *workers: WorkerProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f}s:\n" + \
            "\n".join(w.log_tail() for w in workers)
        time.sleep(0.1)


def _ready_partitions(worker: WorkerProcess, since: int = 0) -> int:
    return worker.log.read_text(errors="replace")[since:].count(" ready, ")


def test_a_frozen_worker_wakes_and_does_not_fire_what_moved(settings: Settings,
                                                              tmp_path: Path) -> None:
    create_topics(settings)
    frozen = WorkerProcess(settings, APP, tmp_path / "frozen").start()
    other = WorkerProcess(settings, APP, tmp_path / "other")
    outcomes = Outcomes(settings)
    try:
        _wait(lambda: _ready_partitions(frozen) >= settings.partitions,
              "the first worker's partitions ready", 60, frozen)
        other.start()
        # Both own partitions once the second has restored its share.
        _wait(lambda: _ready_partitions(other) > 0, "the second worker's partitions",
              90, frozen, other)
        requests: dict[str, str] = {}
        with Client(app=app, settings=settings, replies=False) as client:
            for i in range(DOCS):
                requests[client.submit("slowIndex", {"doc": f"d{i}"}).request_id] = f"d{i}"
            client.flush()

        def parked() -> bool:
            outcomes.poll()
            rows = {r.request_id for r in outcomes.ledger.records
                    if r.outcome is Outcome.queued}
            return set(requests) <= rows

        _wait(parked, "every start parked", 60, frozen, other)
        # Frozen with the parked rows committed and its timers 8 s away.
        assert frozen.proc is not None
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            # The other worker takes the frozen one's partitions once its session ends,
            # and admits every parked start when the quiet period ends.
            outcomes.wait_until_decided(set(requests), timeout_s=90)
            woke_at = len(frozen.log.read_text(errors="replace"))
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        # Awake, it learns it lost its partitions and takes its share back by restoring.
        _wait(lambda: _ready_partitions(frozen, woke_at) > 0,
              "the woken worker's partitions restored", 90, frozen, other)
        outcomes.settle(quiet_s=3.0)
    finally:
        for worker in (frozen, other):
            if worker.alive:
                worker.stop()
        outcomes.close()
    final = outcomes.final()
    twice = {r: [row.outcome.value for row in final[r]] for r in requests
             if len(final[r]) > 1}
    assert not twice, f"starts decided twice after the frozen worker woke: {twice}"
    executions = Counter(a.execution_id for a in outcomes.admitted.records)
    assert all(n == 1 for n in executions.values()), executions.most_common(3)
    assert len(executions) == DOCS
    assert "Traceback" not in frozen.log.read_text(), frozen.log_tail(60)

