"""The concurrency stage on the real broker: limits hold across workers, pools are one
budget, tenants sharing a pool are served in turn, steps mode re-admits, and queue caps
and timeouts.start decide the excess."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client, Engine
from sluicegate.client.engine import Delivery
from sluicegate.config import Settings
from sluicegate.declare import App, load_app
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    LedgerRecord,
    Origin,
    Outcome,
    RunEvent,
    RunEventKind,
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerProcess, WorkerThread

pytestmark = pytest.mark.broker

APP = "tests.apps.concurrency"


@pytest.fixture
def app() -> App:
    return load_app(APP)


class HoldingEngine:
    """An engine in a thread: reports each admitted run started, holds it a short random
    time, then reports it completed."""

    def __init__(self, settings: Settings, hold_s: tuple[float, float] = (0.01, 0.1)) -> None:
        self.engine = Engine(settings=settings, group=f"engine-{uuid.uuid4().hex[:6]}")
        self.hold_s = hold_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        due: list[tuple[float, AdmittedStart]] = []
        try:
            while not self._stop.is_set():
                delivery = self.engine.poll(0.01)
                if delivery is not None and delivery.admitted is not None:
                    self.engine.started(delivery)
                    due.append((time.monotonic() + random.uniform(*self.hold_s),
                                delivery.admitted))
                now = time.monotonic()
                for item in [d for d in due if d[0] <= now]:
                    due.remove(item)
                    self.engine.completed(item[1].execution_id, item[1].workflow)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def __enter__(self) -> HoldingEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.engine.close()
        if self.error is not None:
            raise self.error


def most_in_flight(admitted: Iterable[AdmittedStart], events: Iterable[RunEvent],
                   group: Callable[[AdmittedStart], str]) -> dict[str, int]:
    """The most runs of each group in flight at any instant, from admission (the worker's
    clock) to the engine's completion report. A completion always happens before the
    admission its release allows, so at equal milliseconds completions count first."""
    of = {a.execution_id: group(a) for a in admitted if a.kind is AdmittedKind.start}
    moments = [(a.admitted_at_ms, 1, of[a.execution_id]) for a in admitted
               if a.kind is AdmittedKind.start]
    moments += [(e.at_ms, -1, of[e.execution_id]) for e in events
                if e.kind is RunEventKind.completed and e.execution_id in of]
    now: Counter[str] = Counter()
    most: Counter[str] = Counter()
    for _, step, key in sorted(moments):
        now[key] += step
        most[key] = max(most[key], now[key])
    return dict(most)


def _tenant(admitted: AdmittedStart) -> str:
    return str(json.loads(admitted.payload)["tenant"])


def test_limit_5_per_tenant_holds_across_3_workers_and_all_200_starts_run(
        settings: Settings, tmp_path: Path, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    workers = [WorkerProcess(settings, APP, tmp_path / f"worker-{i}").start() for i in range(3)]
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    try:
        with HoldingEngine(settings, hold_s=(0.02, 0.15)):
            with Client(app=app, settings=settings, replies=False) as client:
                for i in range(200):
                    client.submit("perTenant", {"tenant": f"t{i % 4}", "n": i})
            admitted.until(lambda rows: len(rows) >= 200, timeout=50, what="200 admitted")
            events.until(lambda rows: sum(e.kind is RunEventKind.completed
                                          for e in rows) >= 200, timeout=20, what="200 ended")
        admitted.settle(0.5)
    finally:
        for worker in workers:
            worker.stop()
    assert all(not w.alive for w in workers)
    assert len(admitted.records) == 200
    assert sorted(json.loads(a.payload)["n"] for a in admitted.records) == list(range(200))
    peaks = most_in_flight(admitted.records, events.records, _tenant)
    assert peaks == {f"t{i}": 5 for i in range(4)}, peaks


def test_a_pool_shared_by_two_workflows_never_runs_more_than_its_limit_in_all(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    with WorkerThread(app, settings), HoldingEngine(settings, hold_s=(0.02, 0.1)):
        with Client(app=app, settings=settings, replies=False) as client:
            for i in range(40):
                client.submit("embed" if i % 2 else "summarize", {"tenant": "t", "n": i})
        admitted.until(lambda rows: len(rows) >= 40, timeout=25, what="40 admitted")
        events.until(lambda rows: sum(e.kind is RunEventKind.completed for e in rows) >= 40,
                     timeout=10, what="40 ended")
    assert Counter(a.workflow for a in admitted.records) == {"embed": 20, "summarize": 20}
    assert most_in_flight(admitted.records, events.records, lambda a: "pool") == {"pool": 3}


class StepEngine:
    """An engine driven by the test, one report at a time."""

    def __init__(self, settings: Settings) -> None:
        self.engine = Engine(settings=settings, group=f"engine-{uuid.uuid4().hex[:6]}")
        self.seen: list[AdmittedStart] = []

    def next_admitted(self, timeout: float = 15.0) -> AdmittedStart:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            delivery: Delivery | None = self.engine.poll(0.05)
            if delivery is not None and delivery.admitted is not None:
                self.engine.started(delivery)
                self.engine.flush()
                self.seen.append(delivery.admitted)
                return delivery.admitted
        raise AssertionError(f"no admitted start within {timeout}s; saw {len(self.seen)}")

    def nothing_admitted(self, quiet_s: float = 1.5) -> None:
        deadline = time.monotonic() + quiet_s
        while time.monotonic() < deadline:
            delivery = self.engine.poll(0.05)
            assert delivery is None or delivery.admitted is None, delivery

    def report(self, run: AdmittedStart, kind: RunEventKind) -> None:
        getattr(self.engine, kind.value)(run.execution_id, run.workflow)
        self.engine.flush()

    def close(self) -> None:
        self.engine.close()


def produce_in_order(settings: Settings, starts: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Starts on one partition, so they reach their concurrency key in this order."""
    topics = Topics(settings)
    producer = Producer(settings.client_config())
    ids = []
    for workflow, payload in starts:
        request = StartRequest(request_id=uuid.uuid4().hex, workflow=workflow,
                               payload=json.dumps(payload).encode(), origin=Origin.event,
                               requested_at_ms=int(time.time() * 1000))
        producer.produce(topics.starts, codec.encode(request), request.request_id.encode(),
                         partition=0)
        ids.append(request.request_id)
    assert producer.flush(10) == 0
    return ids


def test_a_pool_serves_tenants_in_turn_so_ten_starts_are_not_stuck_behind_a_thousand(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)

    def count(outcome: Outcome) -> Callable[[list[LedgerRecord]], int]:
        return lambda rows: sum(r.outcome is outcome for r in rows)

    engine = StepEngine(settings)
    try:
        with WorkerThread(app, settings), Client(app=app, settings=settings,
                                                 replies=False) as client:
            for i in range(1000):
                client.submit("fairJob", {"tenant": "A", "n": i})
            client.flush()
            ledger.until(lambda rows: count(Outcome.queued)(rows) >= 996, timeout=25,
                         what="A's thousand decided")
            for i in range(10):
                client.submit("fairJob", {"tenant": "B", "n": i})
            client.flush()
            ledger.until(lambda rows: count(Outcome.queued)(rows) >= 1006, timeout=10,
                         what="B's ten queued")
            running = [engine.next_admitted() for _ in range(4)]
            assert {_tenant(r) for r in running} == {"A"}
            order = []
            for _ in range(20):
                engine.report(running.pop(0), RunEventKind.completed)
                running.append(engine.next_admitted())
                order.append(_tenant(running[-1]))
    finally:
        engine.close()
    assert order.count("B") == 10, order
    assert order == ["A", "B"] * 10


def test_steps_mode_frees_a_suspended_runs_slot_and_readmits_it_before_it_resumes(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    engine = StepEngine(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    try:
        with WorkerThread(app, settings):
            produce_in_order(settings, [("stepper", {"tenant": "t", "n": 1}),
                                        ("stepper", {"tenant": "t", "n": 2})])
            first = engine.next_admitted()
            assert json.loads(first.payload)["n"] == 1
            engine.report(first, RunEventKind.suspended)
            second = engine.next_admitted()
            assert json.loads(second.payload)["n"] == 2, "the suspended run freed its slot"
            engine.report(first, RunEventKind.resumed)
            engine.nothing_admitted()  # the resume waits: the second run holds the slot
            engine.report(second, RunEventKind.completed)
            resumed = engine.next_admitted()
            assert (resumed.execution_id, resumed.kind) == (first.execution_id,
                                                            AdmittedKind.resume)
            engine.report(resumed, RunEventKind.completed)
            ledger.settle(0.5)
    finally:
        engine.close()
    assert [r.outcome for r in ledger.records].count(Outcome.admitted) == 2


def test_runs_mode_keeps_a_suspended_runs_slot(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    engine = StepEngine(settings)
    try:
        with WorkerThread(app, settings):
            produce_in_order(settings, [("runner", {"tenant": "t", "n": 1}),
                                        ("runner", {"tenant": "t", "n": 2})])
            first = engine.next_admitted()
            engine.report(first, RunEventKind.suspended)
            engine.nothing_admitted()
            engine.report(first, RunEventKind.resumed)
            engine.report(first, RunEventKind.completed)
            second = engine.next_admitted()
    finally:
        engine.close()
    assert json.loads(second.payload)["n"] == 2 and second.kind is AdmittedKind.start


def test_over_max_queued_a_start_is_dropped_and_a_start_waiting_past_timeouts_start_expires(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=clock):
        ids = produce_in_order(settings, [("bounded", {"tenant": "t", "n": i})
                                          for i in range(4)])
        ledger.until(lambda rows: len(rows) >= 4, timeout=20, what="four decisions")
        clock.advance(60_000)
        ledger.until(lambda rows: len(rows) >= 6, timeout=10, what="two expiries")
        ledger.settle(0.5)
    outcomes = {r.request_id: [] for r in ledger.records}
    for row in ledger.records:
        outcomes[row.request_id].append(row)
    assert [r.outcome for r in outcomes[ids[0]]] == [Outcome.admitted]
    for waiting, position in ((ids[1], 0), (ids[2], 1)):
        queued, expired = outcomes[waiting]
        assert (queued.outcome, queued.deferral, queued.position) == (
            Outcome.queued, "concurrency", position)
        assert expired.outcome is Outcome.expired
        assert expired.reason is not None and expired.reason.startswith("timeouts.start")
    (dropped,) = outcomes[ids[3]]
    assert dropped.outcome is Outcome.dropped
    assert dropped.reason is not None and dropped.reason.startswith("queue-full")
