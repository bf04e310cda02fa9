"""An idempotency key with a ttl is kept while its run is live and `ttl` after it ends."""

from __future__ import annotations

import time

import pytest

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import RunRow, RunStatus
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

HOUR_MS = 3600 * 1000


def test_a_ttl_key_answers_existing_until_an_hour_after_its_run_ended(settings: Settings) -> None:
    create_topics(settings)
    app = load_app("tests.apps.identity:app_with_ttl")
    clock = ManualClock()
    runs = TopicReader(settings, Topics(settings).runs, RunRow)
    with WorkerThread(app, settings, clock=clock), Client(app=app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        first = client.start("windowed", {"jobId": "j1"}, wait_decision=True, timeout=60)
        assert first.status == "admitted"
        # Live: the key is held however long the run takes.
        clock.advance(2 * HOUR_MS)
        live = client.start("windowed", {"jobId": "j1"}, wait_decision=True, timeout=60)
        assert (live.status, live.execution_id) == ("existing", first.execution_id)

        deadline = time.monotonic() + 60
        delivery = None
        while delivery is None or delivery.admitted is None:
            assert time.monotonic() < deadline
            delivery = engine.poll(0.5)
        engine.started(delivery)
        engine.completed(first.execution_id or "", "windowed")
        engine.flush()
        runs.until(lambda rows: any(r.status is RunStatus.completed for r in rows),
                   what="the run's end in sg.runs")

        clock.advance(HOUR_MS - 1000)
        within = client.start("windowed", {"jobId": "j1"}, wait_decision=True, timeout=60)
        assert (within.status, within.execution_id) == ("existing", first.execution_id)
        clock.advance(2000)
        # The run's release reaches identity on its own topic: until it has, the key is
        # still held, so ask again until the answer changes.
        deadline = time.monotonic() + 30
        after = client.start("windowed", {"jobId": "j1"}, wait_decision=True, timeout=60)
        while after.status == "existing" and time.monotonic() < deadline:
            assert after.execution_id == first.execution_id
            after = client.start("windowed", {"jobId": "j1"}, wait_decision=True, timeout=60)
    assert after.status == "admitted"
    assert after.execution_id != first.execution_id
