"""The broker goes away and comes back while two workers process mixed traffic: nothing
restarts the workers, and every request still gets exactly one final decision, none twice,
with no limit broken.

The outages differ on purpose: a short one, one longer than the consumer's session
timeout (the group must be joined again), and one longer than the workers' transaction
timeout (the broker aborts their open transactions, and their producers come back fenced:
each must be replaced under the same transactional id).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.topology.admin import create_topics
from tests.apps.faults import app
from tests.faults.harness import (
    APP,
    MARKS,
    SCALE,
    CountingEngine,
    FaultBroker,
    KnownFault,
    Outcomes,
    Traffic,
    run_with_faults,
)
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

# Seconds the broker stays down, each time: shorter than the session timeout (6 s), longer
# than it, longer than the transaction timeout (15 s). `make faults` adds longer ones.
OUTAGES = [3.0, 9.0, 18.0] if SCALE <= 1 else [3.0, 9.0, 18.0, 25.0, 37.0, 20.0]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[FaultBroker]:
    broker = FaultBroker(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.stop()


# Now and then (2 runs in 12 on 2026-12-07) a transaction's offset commit stays pending after
# a broker restart, and a worker restoring a partition waits on it for ever: the broker
# answers every read of the committed offsets with this error. Not fixed yet (the issue
# notes of 2026-12-07); the test says so rather than fail on it, and fails on anything else.
UNSTABLE = "UNSTABLE_OFFSET_COMMIT"
# A restore that waits at a transaction still open says so every minute: three times, and
# the transaction has stayed open over two minutes (the same fault, seen from a changelog).
HANGING = "belong to a transaction still open after"

# Each outage costs the workers up to a minute more than it lasts (their transactions and
# group memberships time out and are made again), a fault test's 300 s is not enough on a
# slow machine.
RIDE_OUT_LIMIT_S = 600


@pytest.mark.timeout(RIDE_OUT_LIMIT_S * max(1.0, SCALE))
def test_workers_ride_out_broker_restarts(broker: FaultBroker, tmp_path: Path) -> None:
    settings = Settings(bootstrap=broker.bootstrap, namespace=f"r{uuid.uuid4().hex[:6]}.",
                        state_dir=tmp_path / "state", commit_interval_ms=100)
    workers = [WorkerProcess(settings, APP, tmp_path / f"w{i}") for i in range(2)]

    def outage(down_s: float, rng: random.Random) -> None:
        alive = [worker.alive for worker in workers]
        broker.down()
        time.sleep(down_s)  # the fault itself: how long the broker is away
        broker.up()
        assert alive == [True, True], "\n".join(w.log_tail() for w in workers)

    def stuck() -> str | None:
        for i, worker in enumerate(workers):
            said = worker.log.read_text(errors="replace")
            if said.count(UNSTABLE) >= 3:
                return (f"worker {i} cannot read its partitions' committed offsets: the broker "
                        f"keeps answering {UNSTABLE} (an offset commit of a transaction that "
                        "never ends: a known fault, not fixed yet)")
            if said.count(HANGING) >= 3:
                return (f"worker {i} waits to restore a partition at a transaction that "
                        "stays open (a known fault, not fixed yet)")
        return None

    try:
        run_with_faults(settings, workers, [partial(outage, s) for s in OUTAGES], seed=2,
                        limit_s=RIDE_OUT_LIMIT_S, stuck=stuck)
    except KnownFault as fault:
        pytest.xfail(str(fault))
    for worker in workers:
        assert "Traceback" not in worker.log.read_text(), worker.log_tail(60)
        assert "the worker must restart" not in worker.log.read_text()


def _wait_for_line(worker: WorkerProcess, text: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in worker.log.read_text(errors="replace"):
        assert worker.alive, worker.log_tail()
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{worker.log_tail()}"
        time.sleep(0.1)


def test_a_worker_waits_for_a_broker_that_is_not_there_yet(broker: FaultBroker,
                                                           tmp_path: Path) -> None:
    settings = Settings(bootstrap=broker.bootstrap, namespace=f"w{uuid.uuid4().hex[:6]}.",
                        state_dir=tmp_path / "state")
    create_topics(settings)
    broker.down()
    worker = WorkerProcess(settings, APP, tmp_path / "w").start()
    outcomes: Outcomes | None = None
    try:
        _wait_for_line(worker, "waiting for Kafka")
        broker.up()
        traffic = Traffic()
        with Client(app=app, settings=settings, replies=False) as client:
            traffic.produce(client, 50, random.Random(3))
        outcomes = Outcomes(settings)
        with CountingEngine(settings):
            outcomes.wait_until_decided(set(traffic.workflows), timeout_s=120)
        assert worker.alive
    finally:
        worker.stop()
        if outcomes is not None:
            outcomes.close()
    lines = worker.log.read_text().splitlines()
    # One line says it waits, not one per client per reconnection attempt.
    assert sum("Kafka" in line for line in lines) <= 4, "\n".join(lines)


def test_a_worker_told_to_stop_while_the_broker_is_away_stops_within_seconds(
        broker: FaultBroker, tmp_path: Path) -> None:
    settings = Settings(bootstrap=broker.bootstrap, namespace=f"s{uuid.uuid4().hex[:6]}.",
                        state_dir=tmp_path / "state")
    create_topics(settings)
    worker = WorkerProcess(settings, APP, tmp_path / "w").start()
    outcomes = Outcomes(settings)
    traffic = Traffic()
    with Client(app=app, settings=settings, replies=False) as client:
        traffic.produce(client, 100, random.Random(4))
        client.flush()
        outcomes.wait_until_decided(set(traffic.workflows), timeout_s=60, progress=0.5)
        outcomes.close()
        traffic.produce(client, 2000, random.Random(5))
        client.flush()
    broker.down()
    # Long enough for the worker to be inside a commit that cannot complete.
    time.sleep(3.0)
    started = time.monotonic()
    assert worker.stop(timeout=30) == 0, worker.log_tail()
    assert time.monotonic() - started < 8.0, worker.log_tail()
    assert "Traceback" not in worker.log.read_text(), worker.log_tail(60)
