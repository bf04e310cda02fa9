"""A worker whose wall clock steps forward an hour past every lease (an NTP step, a VM
resumed) frees no slot of a run that reported a moment before: the lease counts the time
the worker itself spent (docs/decisions/clock-steps.md). On the real broker, the worker's
clock driven by a file (`FileClock`): a step moves its wall clock alone; a write moves
both clocks, as time passing does."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import CLOCK_FILE_ENV, FileClock
from sluicegate.schemas.records import Outcome
from sluicegate.topology.admin import create_topics
from tests.apps.faults import app
from tests.faults.harness import APP, MARKS, HoldingEngine, Outcomes
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

HOUR = 3_600_000
WORKFLOW = "oneAtATime"  # limit 1 per account, the default lease of an hour


def _outcomes_of(outcomes: Outcomes, request: str) -> list[Outcome]:
    return [r.outcome for r in outcomes.ledger.records if r.request_id == request]


def test_a_step_of_the_wall_clock_frees_no_slot_of_a_run_that_reported(
        settings: Settings, tmp_path: Path) -> None:
    settings = dataclasses.replace(settings, partitions=1)
    create_topics(settings)
    clock = tmp_path / "clock"
    FileClock.write(clock, time.time_ns() // 1_000_000)
    worker = WorkerProcess(settings, APP, tmp_path / "w", **{CLOCK_FILE_ENV: str(clock)})
    outcomes = Outcomes(settings)
    try:
        with Client(app=app, settings=settings, replies=False) as client, \
                HoldingEngine(settings, {"t"}) as engine:
            worker.start()
            running = client.submit(WORKFLOW, {"account": "t", "n": 1}).request_id
            waiting = client.submit(WORKFLOW, {"account": "t", "n": 2}).request_id
            client.flush()
            outcomes.ledger.until(lambda _: _outcomes_of(outcomes, waiting) == [Outcome.queued]
                                  and _outcomes_of(outcomes, running) == [Outcome.admitted],
                                  timeout=60, what="one running, one queued")
            outcomes.ledger.until(lambda _: len(engine.handed) == 1, timeout=30,
                                  what="the engine holding the running start")
            FileClock.step(clock, 2 * HOUR)
            # A start decided after the step: the worker's loop has run its timers on the
            # stepped clock (every cycle fires what is due before it commits).
            marker = client.submit("note", {"text": "after the step"}).request_id
            client.flush()
            outcomes.wait_until_decided({marker}, timeout_s=60)
            outcomes.settle(2.0)
            assert not [r for r in outcomes.ledger.records
                        if r.outcome is Outcome.lease_expired], "a lease expired on the step"
            assert _outcomes_of(outcomes, waiting) == [Outcome.queued], (
                "the waiting start took the slot of a run still held")
            # An hour of the worker's own time without a report: the lease runs out.
            FileClock.write(clock, int(clock.read_text().split()[0]) + HOUR + 1_000)
            outcomes.wait_until_decided({waiting}, timeout_s=60)
            assert _outcomes_of(outcomes, waiting)[-1] is Outcome.admitted
            assert [r for r in outcomes.ledger.records if r.outcome is Outcome.lease_expired]
    finally:
        if worker.alive:
            assert worker.stop() == 0, worker.log_tail()
        outcomes.close()
