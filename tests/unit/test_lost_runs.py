"""A run's lease on the admitted start (docs/decisions/lease-on-the-admitted-start.md)."""

from __future__ import annotations

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Concurrency,
    FailureReport,
    Singleton,
    Timeouts,
    Workflow,
)
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
