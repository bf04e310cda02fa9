"""A run's lease on the admitted start, and a run lost when the lease runs out without a
report: failed, its holds freed, a ledger row, its onFailure and a cancel
(docs/decisions/lost-runs.md, docs/decisions/lease-on-the-admitted-start.md)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Concurrency,
    FailureReport,
    Singleton,
    Timeouts,
    Workflow,
)
from sluicegate.schemas.records import CommandKind, Outcome, RunEventKind, RunStatus
from sluicegate.testing import TestDriver

MINUTE = 60_000


class Job(BaseModel):
    tenant: str


FAILED = Workflow(name="jobFailed", payload=FailureReport)
LEASED = Workflow(name="leased", payload=Job, on_failure="jobFailed",
                  concurrency=Concurrency(limit=1, key="tenant", lease="10m"),
                  singleton=Singleton(key="tenant", mode="skip"))
STEPS = Workflow(name="stepped", payload=Job, on_failure="jobFailed",
                 concurrency=Concurrency(limit=1, key="tenant", lease="10m", mode="steps"))
TIMED = Workflow(name="timed", payload=Job, concurrency=Concurrency(limit=1, key="tenant"),
                 timeouts=Timeouts(finish="10m"))
PLAIN = Workflow(name="plain", payload=Job)
APP = App([FAILED, LEASED, STEPS, TIMED, PLAIN])


def test_an_admitted_start_carries_its_lease_and_the_heartbeat_cadence() -> None:
    with TestDriver(APP) as driver:
        driver.start("leased", {"tenant": "t"})
        driver.start("plain", {"tenant": "t"})
        driver.start("timed", {"tenant": "t"})
        leased, plain, timed = driver.admitted
        assert (leased.lease_ms, leased.heartbeat_every_ms) == (10 * MINUTE, 150_000)
        # A run without a concurrency slot has no lease; timeouts.finish replaces it.
        assert (plain.lease_ms, plain.heartbeat_every_ms) == (None, None)
        assert (timed.lease_ms, timed.heartbeat_every_ms) == (None, None)


def test_a_run_silent_for_its_lease_is_lost_failed_reported_and_cancelled() -> None:
    with TestDriver(APP) as driver:
        run = driver.start("leased", {"tenant": "t"})
        driver.report(run.execution_id, RunEventKind.started)
        waiting = driver.start("leased", {"tenant": "u"})  # another tenant: admitted
        driver.report(waiting.execution_id, RunEventKind.started)
        driver.advance(9 * MINUTE)
        driver.report(waiting.execution_id, RunEventKind.heartbeat)
        driver.advance(MINUTE)
        driver.commit()

        lost = [r for r in driver.runs if r.execution_id == run.execution_id][-1]
        assert lost.status is RunStatus.failed
        assert lost.ended_at_ms == driver.now_ms
        assert lost.last_reason is not None and lost.last_reason.startswith("lost:")
        assert "10m" in lost.last_reason
        # The one that heartbeat is still running.
        other = [r for r in driver.runs if r.execution_id == waiting.execution_id][-1]
        assert other.status is RunStatus.running

        (command,) = driver.commands
        assert (command.kind, command.execution_id, command.command_id) == (
            CommandKind.cancel, run.execution_id, f"lease_expired:{run.execution_id}")
        assert command.reason == lost.last_reason
        (row,) = [r for r in driver.ledger if r.outcome is Outcome.lease_expired]
        assert row.execution_id == run.execution_id and row.reason == lost.last_reason
        assert row.request_id.startswith(f"run:{run.execution_id}:lease:")
        (handler,) = [a for a in driver.admitted if a.workflow == "jobFailed"]
        report = json.loads(handler.payload)
        assert report["reason"] == "lease_expired"
        assert report["execution_id"] == run.execution_id
        assert report["error_message"] == lost.last_reason
        assert report["payload"] == {"tenant": "t"}

        # Every hold went back, the singleton key too: a new start of the tenant runs.
        again = driver.start("leased", {"tenant": "t"})
        assert driver.admitted[-1].execution_id == again.execution_id
        # The lost run stays failed, whatever its engine says later.
        driver.report(run.execution_id, RunEventKind.completed)
        driver.commit()
        assert [r for r in driver.runs if r.execution_id == run.execution_id][-1].status \
            is RunStatus.failed
        assert len(driver.commands) == 1


def test_a_suspended_steps_mode_run_holds_no_lease_and_is_not_lost() -> None:
    with TestDriver(APP) as driver:
        run = driver.start("stepped", {"tenant": "t"})
        driver.report(run.execution_id, RunEventKind.started)
        driver.report(run.execution_id, RunEventKind.suspended)
        driver.advance(60 * MINUTE)
        assert driver.commands == []
        assert [r for r in driver.ledger if r.outcome is Outcome.lease_expired] == []
        # Re-admitted to resume: the lease is armed again, and carried on the resume.
        driver.report(run.execution_id, RunEventKind.resumed)
        resume = driver.admitted[-1]
        assert (resume.kind, resume.lease_ms) == ("resume", 10 * MINUTE)
        driver.advance(10 * MINUTE)
        (command,) = driver.commands
        assert command.command_id == f"lease_expired:{run.execution_id}"
