"""Workers die, join and leave while mixed traffic flows: kill -9 at random moments, and a
group that grows and shrinks (joins, SIGTERMs, kills). Every request still gets exactly
one final decision, none twice, and no limit is broken."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.topology.admin import create_topics
from tests.apps.faults import app
from tests.faults.harness import (
    APP,
    CountingEngine,
    Outcomes,
    Traffic,
    check_invariants,
    scaled,
)
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = pytest.mark.broker


def _run_with_faults(settings: Settings, tmp_path: Path, workers: list[WorkerProcess],
                     faults: int, fault: Callable[[random.Random, list[WorkerProcess]], None],
                     seed: int) -> None:
    create_topics(settings)
    rng = random.Random(seed)
    traffic = Traffic()
    outcomes = Outcomes(settings)
    for worker in workers:
        worker.start()
    try:
        with Client(app=app, settings=settings, replies=False) as client, \
                CountingEngine(settings) as engine:
            for _ in range(faults):
                traffic.produce(client, scaled(400), rng)
                client.flush()
                # A fault lands at a random point of the work in flight.
                outcomes.wait_until_decided(set(traffic.workflows), timeout_s=180,
                                            progress=rng.uniform(0.2, 0.9))
                fault(rng, workers)
            outcomes.wait_until_decided(set(traffic.workflows), timeout_s=240)
            outcomes.settle()
    finally:
        for worker in workers:
            if worker.alive:
                worker.stop()
        outcomes.close()
    check_invariants(outcomes, traffic, engine)


def test_kill_minus_nine_in_a_loop(settings: Settings, tmp_path: Path) -> None:
    workers = [WorkerProcess(settings, APP, tmp_path / f"w{i}") for i in range(2)]

    def kill_and_restart(rng: random.Random, workers: list[WorkerProcess]) -> None:
        victim = rng.choice(workers)
        victim.kill()
        victim.start()

    _run_with_faults(settings, tmp_path, workers, scaled(6), kill_and_restart, seed=5)


def test_a_group_that_grows_and_shrinks(settings: Settings, tmp_path: Path) -> None:
    pool = [WorkerProcess(settings, APP, tmp_path / f"w{i}") for i in range(3)]
    running = [pool[0]]

    def change(rng: random.Random, workers: list[WorkerProcess]) -> None:
        idle = [w for w in pool if not w.alive]
        action = rng.choice(["join", "join", "kill", "stop"] if len(running) > 1 else ["join"])
        if action == "join" and idle:
            running.append(rng.choice(idle).start())
            return
        victim = rng.choice(running)
        if action == "kill":
            victim.kill()
        else:
            assert victim.stop(timeout=60) == 0, victim.log_tail()
        running.remove(victim)
        if not running or rng.random() < 0.5:
            running.append(victim.start())

    _run_with_faults(settings, tmp_path, running, scaled(8), change, seed=6)
