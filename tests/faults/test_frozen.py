"""A worker frozen (a stopped process, a stalled VM, a long pause) past its session while
timers of its partitions are pending: its partitions move to the other worker, which
fires those timers and admits the parked starts. When the frozen worker wakes, its
clock says the same timers are due; a transaction it commits then, with no records read
in it, must be fenced like any other, not admit the starts a second time
(docs/decisions/fenced-transactions.md).

Two ways to wake: the whole process stopped and continued (librdkafka then says the
membership was lost at the first poll, before any timer fires), and a worker frozen
between a poll and its commit, which fires the timers and commits before it polls
again: only the broker can refuse that transaction."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluicegate.admission.worker import Worker
from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
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



class _Frozen:
    """A worker's consumer as the worker sees it while frozen just after a poll returned:
    it polls nothing and serves no event (no rebalance reaches the worker), and still
    hands out the group membership it had (member id, generation) for the commit. The
    real consumer is closed, as a frozen one goes silent: the group's coordinator ends
    its membership when its session runs out."""

    def __init__(self, consumer: Any) -> None:
        self.metadata = consumer.consumer_group_metadata()

    def consumer_group_metadata(self) -> Any:
        return self.metadata

    def poll(self, timeout: float | None = None) -> None:
        return None

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Any]:
        return []

    def assignment(self) -> list[Any]:
        return []

    def position(self, partitions: list[Any]) -> list[Any]:
        return []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _parked(outcomes: Outcomes, requests: set[str]) -> bool:
    outcomes.poll()
    return requests <= {r.request_id for r in outcomes.ledger.records
                        if r.outcome is Outcome.queued}


def test_a_worker_frozen_between_poll_and_commit_is_fenced(
        settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    create_topics(settings)
    clock = ManualClock(int(time.time() * 1000))
    worker = Worker.for_app(app, dataclasses.replace(settings, state_dir=tmp_path / "frozen"),
                            clock=clock)
    other = WorkerProcess(settings, APP, tmp_path / "other")
    outcomes = Outcomes(settings)
    try:
        worker.start()
        deadline = time.monotonic() + 60
        while not worker.caught_up:
            assert time.monotonic() < deadline, "the worker did not restore its partitions"
            worker.run_once()
        requests: set[str] = set()
        with Client(app=app, settings=settings, replies=False) as client:
            for i in range(DOCS):
                requests.add(client.submit("slowIndex", {"doc": f"d{i}"}).request_id)
            client.flush()
        deadline = time.monotonic() + 60
        while not _parked(outcomes, requests):
            assert time.monotonic() < deadline, "the starts were not parked"
            worker.run_once()
        # Frozen: from here on it polls nothing. The other worker joins, takes every
        # partition once this one's session has run out, and admits every start at the
        # end of its quiet period (8 s of its own, real, clock).
        real, worker.consumer = worker.consumer, _Frozen(worker.consumer)  # type: ignore[assignment]
        real.close()  # its rebalance callbacks are a consumer's the worker no longer has
        other.start()
        outcomes.wait_until_decided(requests, timeout_s=90)
        # Awake, between a poll and its commit: its clock says the timers are due; it
        # fires them and commits before it would poll again.
        clock.advance(60_000)
        commits, failed = worker.commits, worker._failed_cycles
        deadline = time.monotonic() + 30
        while worker.commits == commits and worker._failed_cycles == failed:
            assert time.monotonic() < deadline, (
                "the woken worker did not try to commit", clock.now_ms(), worker._in_txn,
                [(p, st.node.name, st.timers.next_due if st.timers else None)
                 for p, t in worker.tasks.items() for st in t.stateful()])
            worker.run_once()
        outcomes.settle(quiet_s=3.0)
    finally:
        worker.close()
        if other.alive:
            other.stop()
        outcomes.close()
    final = outcomes.final()
    twice = {r: [row.outcome.value for row in final[r]] for r in requests
             if len(final[r]) > 1}
    assert not twice, f"starts admitted again by the woken worker: {twice}"
    executions = Counter(a.execution_id for a in outcomes.admitted.records)
    assert len(executions) == DOCS and set(executions.values()) == {1}, executions
    assert worker.commits == commits, "the woken worker committed what moved"
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and r.name.startswith("sluicegate")]
    assert any("no longer counts this worker as the owner" in line for line in said), said
