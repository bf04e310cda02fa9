"""Workers die, join and leave while mixed traffic flows: kill -9 at random moments, and a
group that grows and shrinks (joins, SIGTERMs, kills). Every request still gets exactly
one final decision, none twice, and no limit is broken."""

from __future__ import annotations

import random
from pathlib import Path

from sluicegate.config import Settings
from tests.faults.harness import APP, MARKS, run_with_faults, scaled
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS


def test_kill_minus_nine_in_a_loop(settings: Settings, tmp_path: Path) -> None:
    workers = [WorkerProcess(settings, APP, tmp_path / f"w{i}") for i in range(2)]

    def kill_and_restart(rng: random.Random) -> None:
        victim = rng.choice(workers)
        victim.kill()
        victim.start()

    run_with_faults(settings, workers, [kill_and_restart] * scaled(6), seed=5)


def test_a_group_that_grows_and_shrinks(settings: Settings, tmp_path: Path) -> None:
    pool = [WorkerProcess(settings, APP, tmp_path / f"w{i}") for i in range(3)]
    running = [pool[0]]

    def change(rng: random.Random) -> None:
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

    run_with_faults(settings, running, [change] * scaled(8), seed=6)
