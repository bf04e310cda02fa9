"""A step of the wall clock (an NTP step, a VM resumed) is not time that passed for the
engines: a run's lease and its finish timeout count the time the worker itself spent
(docs/decisions/clock-steps.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Timeouts, Workflow
from sluicegate.engine.clock import FileClock, ManualClock
from sluicegate.engine.timers import TIMER_PREFIX
from sluicegate.schemas.records import Outcome, RunEventKind
from sluicegate.testing import TestDriver

HOUR = 3_600_000
MINUTE = 60_000


class Job(BaseModel):
    tenant: str


LEASED = Workflow(name="leased", payload=Job,
                  concurrency=Concurrency(limit=1, key="tenant", lease="10m"))
TIMED = Workflow(name="timed", payload=Job, concurrency=Concurrency(limit=1, key="tenant"),
                 timeouts=Timeouts(finish="10m"))
APP = App([LEASED, TIMED])


def _outcomes(driver: TestDriver, outcome: Outcome) -> list[str]:
    return [r.request_id for r in driver.ledger if r.outcome is outcome]


def test_a_forward_step_of_the_wall_clock_frees_no_slot_of_a_run_that_reported() -> None:
    with TestDriver(APP) as driver:
        first = driver.start("leased", {"tenant": "t"})
        driver.report(first.execution_id, RunEventKind.started)
        waiting = driver.start("leased", {"tenant": "t"})
        driver.clock.step(HOUR)
        driver.advance(1)  # the lease's timer is due by the wall clock now
        assert _outcomes(driver, Outcome.lease_expired) == []
        assert [a.execution_id for a in driver.admitted] == [first.execution_id], (
            "the waiting start took a slot its holder still uses")
        # Ten minutes of the worker's own time without a report: the lease runs out.
        driver.advance(10 * MINUTE)
        assert len(_outcomes(driver, Outcome.lease_expired)) == 1
        assert driver.admitted[-1].execution_id == waiting.execution_id


def test_after_a_forward_step_a_report_still_moves_the_lease_on() -> None:
    with TestDriver(APP) as driver:
        first = driver.start("leased", {"tenant": "t"})
        driver.advance(8 * MINUTE)
        driver.clock.step(HOUR)
        driver.advance(1)
        driver.report(first.execution_id, RunEventKind.heartbeat)
        driver.advance(9 * MINUTE)
        assert _outcomes(driver, Outcome.lease_expired) == []
        driver.advance(MINUTE)
        assert len(_outcomes(driver, Outcome.lease_expired)) == 1


def test_a_backward_step_makes_a_lease_last_longer_never_shorter() -> None:
    with TestDriver(APP) as driver:
        driver.start("leased", {"tenant": "t"})
        driver.clock.step(-HOUR)
        driver.advance(10 * MINUTE)
        assert _outcomes(driver, Outcome.lease_expired) == [], "the wall clock is behind"
        driver.advance(HOUR)
        assert len(_outcomes(driver, Outcome.lease_expired)) == 1


def test_a_forward_step_does_not_cancel_a_run_before_its_finish_timeout() -> None:
    with TestDriver(APP) as driver:
        run = driver.start("timed", {"tenant": "t"})
        driver.report(run.execution_id, RunEventKind.started)
        driver.advance(5 * MINUTE)
        driver.clock.step(HOUR)
        driver.advance(1)
        assert driver.commands == []
        driver.advance(5 * MINUTE)
        (command,) = driver.commands
        assert command.execution_id == run.execution_id
        assert "within 10m" in (command.reason or "")


def test_a_restored_partition_counts_a_lease_from_its_taking() -> None:
    with TestDriver(APP) as driver:
        driver.start("leased", {"tenant": "t"})
        driver.advance(9 * MINUTE)
        driver.commit()
        driver.restart()
        driver.clock.step(HOUR)
        driver.advance(1)
        assert _outcomes(driver, Outcome.lease_expired) == []
        driver.advance(10 * MINUTE)
        assert len(_outcomes(driver, Outcome.lease_expired)) == 1


def test_a_manual_clock_steps_its_wall_time_alone() -> None:
    clock = ManualClock(1_000)
    clock.advance(10)
    clock.step(-500)
    clock.advance(5)
    assert (clock.now_ms(), clock.monotonic_ms()) == (515, 15)


def test_a_file_clock_step_moves_the_wall_clock_of_its_readers_alone(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    FileClock.write(path, 1_000)
    FileClock.step(path, HOUR)
    FileClock.write(path, 1_000 + HOUR + 50)
    clock = FileClock(path)
    assert (clock.now_ms(), clock.monotonic_ms()) == (1_000 + HOUR + 50, 1_050)


def _runs_rows(driver: TestDriver) -> dict[bytes, bytes]:
    stage = driver.stage("runs")
    store = driver.store("runs")
    return {key: value for prefix in stage.derived for key, value in store.items(prefix)}


def test_a_runs_deadlines_are_derived_from_its_row_and_never_logged() -> None:
    """The backstops and their timers are made again from the run rows at a restore: a
    finish timeout as it was, a lease from the run's admission (then counted from the
    taking, above); an ended run has none. None of them reaches the changelog."""
    with TestDriver(APP) as driver:
        leased = driver.start("leased", {"tenant": "a"})
        timed = driver.start("timed", {"tenant": "b"})
        ended = driver.start("leased", {"tenant": "c"})
        driver.advance(MINUTE)
        driver.report(leased.execution_id, RunEventKind.started)
        driver.report(ended.execution_id, RunEventKind.completed)
        driver.commit()
        kept = _runs_rows(driver)
        derived = driver.derive("runs")
        def of(rows: dict[bytes, bytes], handle: object) -> set[bytes]:
            return {k for k in rows if k.endswith(handle.execution_id.encode())}  # type: ignore[attr-defined]

        # The finish timeout's rows are the same; the lease's moved with the report.
        assert of(kept, timed) == of(derived, timed) and len(of(derived, timed)) == 2
        assert len(of(derived, leased)) == 2  # its backstop and its lease's timer
        assert of(kept, ended) == of(derived, ended) == set()
        assert not [w for w in driver.sent(driver.topics.changelog("runs"))
                    if w.key is not None and w.key.startswith(driver.stage("runs").derived)]
        driver.restart()
        assert _runs_rows(driver) == derived
        # The finish timeout fires when it always would have.
        driver.advance(9 * MINUTE - 1)
        assert _outcomes(driver, Outcome.failed) == []
        driver.advance(1)
        assert [r.execution_id for r in driver.ledger
                if r.outcome is Outcome.failed] == [timed.execution_id]


def test_while_rolling_from_a_release_before_derived_rows_a_runs_deadlines_are_logged() -> None:
    """SLUICEGATE_LOG_DERIVED: the backstops and their timers are logged rows, as a worker
    of the release before keeps them, and a restart keeps them as they were."""
    with TestDriver(APP, Settings(partitions=1, log_derived=1)) as driver:
        timed = driver.start("timed", {"tenant": "b"})
        driver.commit()
        logged = [w.key for w in driver.sent(driver.topics.changelog("runs"))
                  if w.key is not None and w.key.endswith(timed.execution_id.encode())]
        # Its backstop row, and its finish timer among the logged timers.
        assert len(logged) == 2 and any(k.startswith(TIMER_PREFIX) for k in logged)
        driver.restart()
        driver.advance(10 * MINUTE)
        assert [r.execution_id for r in driver.ledger
                if r.outcome is Outcome.failed] == [timed.execution_id]
