"""Engines on a share group (KIP-932) on the real broker: instances beyond the partition
count all take starts, a start an instance took and never acknowledged goes to another
when it is killed and runs once (dedupe by execution id), and the concurrency limit holds
by the engines' own clocks. Each engine instance is a process
(tests/integration/share_engine.py), so a kill is a real SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.schemas.records import AdmittedStart, RunEvent, RunEventKind
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import ROOT, TopicReader, WorkerProcess, settings_env
from tests.integration.share_engine import SharedRuns

pytestmark = pytest.mark.broker

APP = "tests.apps.share_engines"
LIMIT = 3  # shareJob's concurrency limit


class ShareEngineProcess:
    """One engine instance of tests/integration/share_engine.py, logging to a file."""

    def __init__(self, settings: Settings, group: str, name: str, begun: Path, logs: Path,
                 capacity: int = 1, hang: bool = False) -> None:
        self.name = name
        self.log = logs / f"engine-{name}.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.share_engine", "--group", group,
                 "--name", name, "--begun", str(begun), "--capacity", str(capacity),
                 *(["--hang"] if hang else [])],
                cwd=ROOT, env=settings_env(settings, logs / "unused-state"),
                stdout=out, stderr=subprocess.STDOUT)

    def lines(self, kind: str) -> list[str]:
        """The execution ids of its output lines of `kind` (started, dropped, completed)."""
        return [line.split()[1] for line in self.log.read_text(errors="replace").splitlines()
                if line.startswith(kind + " ")]

    def until_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while "up" not in self.log.read_text(errors="replace").splitlines():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.tail()
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 20) -> str:
        return f"engine {self.name}:\n" + "\n".join(
            self.log.read_text(errors="replace").splitlines()[-lines:])


def of_kind(events: Iterable[RunEvent], kind: RunEventKind) -> list[RunEvent]:
    return [e for e in events if e.kind is kind]


def most_running(events: list[RunEvent], ended_at_ms: dict[str, int] | None = None) -> int:
    """The most runs running at once by the engines' clocks: from each `started` report's
    `at_ms` to its `completed` one's (or to `ended_at_ms`, for a run whose instance was
    killed). At equal milliseconds an end counts first: a slot freed is what lets the next
    start in."""
    moments = [(e.at_ms, 1) for e in of_kind(events, RunEventKind.started)]
    moments += [(e.at_ms, -1) for e in of_kind(events, RunEventKind.completed)]
    moments += [(at_ms, -1) for at_ms in (ended_at_ms or {}).values()]
    running = most = 0
    for _, step in sorted(moments):
        running += step
        most = max(most, running)
    return most


@pytest.fixture
def one_partition(settings: Settings, tmp_path: Path) -> Settings:
    """The test's settings with one partition per topic, its topics created."""
    one = settings.with_(partitions=1)
    create_topics(one)
    return one


def test_five_engine_instances_on_one_partition_all_take_starts_and_the_limit_holds(
        one_partition: Settings, tmp_path: Path) -> None:
    settings = one_partition
    events = TopicReader(settings, Topics(settings).run_events, RunEvent)
    worker = WorkerProcess(settings, APP, tmp_path / "worker").start()
    group = f"share-engines-{uuid.uuid4().hex[:6]}"
    SharedRuns.create(tmp_path / "begun.db")
    engines = [ShareEngineProcess(settings, group, f"e{i}", tmp_path / "begun.db", tmp_path)
               for i in range(5)]
    submitted = 0
    try:
        for engine in engines:
            engine.until_up()
        with Client(app=APP, settings=settings, replies=False) as client:
            # A start every tenth of a second or so until every instance has run one: one
            # partition, five instances, each taking a start whenever it has room.
            deadline = time.monotonic() + 120
            while not all(engine.lines("started") for engine in engines):
                assert time.monotonic() < deadline and submitted < 1000, (
                    f"after {submitted} starts: "
                    + "\n".join(engine.tail() for engine in engines))
                client.submit("shareJob", {"n": submitted, "holdMs": 300})
                submitted += 1
                events.poll(0.1)
        events.until(lambda rows: len(of_kind(rows, RunEventKind.completed)) >= submitted,
                     timeout=60, what=f"{submitted} runs completed")
        events.settle(1.0)
    finally:
        for engine in engines:
            engine.stop()
        worker.stop()
    started = Counter(e.execution_id for e in of_kind(events.records, RunEventKind.started))
    completed = Counter(e.execution_id for e in of_kind(events.records, RunEventKind.completed))
    assert len(started) == submitted and set(started.values()) == {1}
    assert completed == started
    by_instance = Counter(e.run_id.split(":")[0] for e in
                          of_kind(events.records, RunEventKind.started) if e.run_id)
    assert set(by_instance) == {"e0", "e1", "e2", "e3", "e4"}, by_instance
    assert most_running(events.records) <= LIMIT


def test_a_killed_instances_unacknowledged_starts_go_to_the_others_and_each_run_runs_once(
        one_partition: Settings, tmp_path: Path) -> None:
    settings = one_partition
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    worker = WorkerProcess(settings, APP, tmp_path / "worker").start()
    group = f"share-engines-{uuid.uuid4().hex[:6]}"
    begun = tmp_path / "begun.db"
    SharedRuns.create(begun)
    survivors: list[ShareEngineProcess] = []
    try:
        with Client(app=APP, settings=settings, replies=False) as client:
            for n in range(12):
                client.submit("shareJob", {"n": n, "holdMs": 300})
        # The first three are admitted (the limit) before any engine is there: the first
        # instance takes what its fetches bring, begins one (it has room for one) and
        # acknowledges none of them.
        admitted.until(lambda rows: len(rows) >= LIMIT, timeout=60, what="3 admitted")
        victim = ShareEngineProcess(settings, group, "victim", begun, tmp_path, hang=True)
        events.until(lambda rows: len(of_kind(rows, RunEventKind.started)) == 1,
                     timeout=60, what="the first instance's run started")
        (held,) = victim.lines("started")
        victim.kill()
        killed_at_ms = int(time.time() * 1000)
        survivors = [ShareEngineProcess(settings, group, f"s{i}", begun, tmp_path)
                     for i in range(4)]
        # The held run is begun and never ends (it holds its slot until its lease runs
        # out); the eleven others run on the survivors, the victim's unacknowledged ones
        # when the share group gives them back.
        try:
            events.until(lambda rows: len(of_kind(rows, RunEventKind.completed)) >= 11,
                         timeout=120, what="11 runs completed by the survivors")
            # The held start goes to a survivor, which finds it begun and drops it.
            deadline = time.monotonic() + 60
            while not any(held in s.lines("dropped") for s in survivors):
                assert time.monotonic() < deadline, "the held start never reached a survivor"
                time.sleep(0.2)
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n" + "\n".join(s.tail() for s in [victim, *survivors])) from None
        events.settle(1.0)
    finally:
        for engine in survivors:
            engine.stop()
        worker.stop()
    runs = {a.execution_id for a in admitted.settle(0.5)}
    assert len(runs) == 12
    started = Counter(e.execution_id for e in of_kind(events.records, RunEventKind.started))
    assert set(started) == runs and set(started.values()) == {1}
    completed = Counter(e.execution_id for e in of_kind(events.records, RunEventKind.completed))
    assert set(completed) == runs - {held} and set(completed.values()) == {1}
    assert sorted(eid for s in survivors for eid in s.lines("completed")) == sorted(
        runs - {held})
    # The held run counts as running until its instance was killed.
    assert most_running(events.records, {held: killed_at_ms}) <= LIMIT
