"""A run's lease on the real broker: the admitted start carries it to the engine
(docs/decisions/lease-on-the-admitted-start.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluicegate.client import Client, Engine
from sluicegate.client.engine import Delivery
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import ManualClock
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.lifecycle import app as lifecycle_app
from tests.integration.kafka_helpers import WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def app() -> App:
    return lifecycle_app


@pytest.fixture
def topics(settings: Settings) -> Iterator[Topics]:
    create_topics(settings)
    yield Topics(settings)


def _deliveries(engine: Engine, count: int) -> list[Delivery]:
    got: list[Delivery] = []
    deadline = time.monotonic() + 60
    while len(got) < count:
        assert time.monotonic() < deadline, f"the engine got {len(got)} of {count} starts"
        delivery = engine.poll(0.5)
        if delivery is not None and delivery.admitted is not None:
            got.append(delivery)
    return got


def test_an_engine_is_told_each_runs_lease_and_how_often_to_heartbeat(
        settings: Settings, topics: Topics, app: App) -> None:
    with Client(app=app, settings=settings) as client, \
            WorkerThread(app, settings, ManualClock()), \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        leased = client.start("leasedJob", {"jobId": "a"}, wait_decision=True)
        plain = client.start("flakyJob", {"jobId": "b"}, wait_decision=True)
        timed = client.start("slowJob", {"jobId": "c"}, wait_decision=True)
        assert [h.status for h in (leased, plain, timed)] == ["admitted"] * 3
        by_id = {d.admitted.execution_id: d for d in _deliveries(engine, 3) if d.admitted}

    # leasedJob: a concurrency slot leased for 1m, to be reported every 15 s.
    delivery = by_id[leased.execution_id]
    assert (delivery.lease_ms, delivery.heartbeat_every_ms) == (60_000, 15_000)
    # No concurrency slot: no lease. timeouts.finish bounds the run instead of a lease.
    for handle in (plain, timed):
        delivery = by_id[handle.execution_id]
        assert (delivery.lease_ms, delivery.heartbeat_every_ms) == (None, None)
