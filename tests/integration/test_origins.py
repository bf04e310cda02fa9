"""Which controls judge which kind of start (seed 003's table), on the real broker:
concurrency applies to all; throttle and singleton to all but `invoke`; rateLimit,
debounce and idempotency-by-expression to `event` only, and a `direct` start dedupes by
its explicit id."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluicegate.client import Client, Handle
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.lifecycle import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    create_topics(settings)
    with Client(app=app, settings=settings) as client, \
            WorkerThread(app, settings, ManualClock()):
        yield client


def _start(client: Client, workflow: str, job: str, origin: str,
           id: str | None = None) -> Handle:
    # The decision itself, not the error a waiting caller would get for a drop or a skip.
    handle = client.submit(workflow, {"jobId": job}, origin=origin, id=id)
    client.flush()
    return handle.wait()


def _statuses(handles: list[Handle]) -> list[tuple[str, str | None]]:
    return [(h.status, h.deferral) for h in handles]


def test_a_direct_start_skips_rate_limit_that_drops_an_event_start(client: Client) -> None:
    # limitedJob: one run per job a minute.
    assert _start(client, "limitedJob", "j", "event").status == "admitted"
    assert _start(client, "limitedJob", "j", "event").status == "dropped"
    assert [_start(client, "limitedJob", "j", "direct", id=f"d{i}").status
            for i in range(3)] == ["admitted"] * 3


def test_a_direct_start_skips_debounce_and_runs_at_once(client: Client) -> None:
    assert _statuses([_start(client, "debouncedJob", "j", "event")]) == [
        ("queued", "debounce")]
    assert _statuses([_start(client, "debouncedJob", "j", "direct", id="d1"),
                      _start(client, "debouncedJob", "j", "direct", id="d2")]) == [
        ("admitted", None), ("admitted", None)]


def test_a_direct_retry_with_the_same_id_answers_existing_with_the_same_run(
        client: Client, settings: Settings) -> None:
    first = _start(client, "flakyJob", "j", "direct", id="order-1")
    retry = _start(client, "flakyJob", "j", "direct", id="order-1")
    assert (first.status, retry.status) == ("admitted", "existing")
    assert retry.execution_id == first.execution_id
    admitted = TopicReader(settings, Topics(settings).admitted, AdmittedStart)
    assert [a.execution_id for a in admitted.settle()] == [first.execution_id]


def test_an_invoke_start_skips_throttle_and_singleton(client: Client) -> None:
    # throttledJob: one a second; an event start past that waits.
    assert _statuses([_start(client, "throttledJob", "j", "event"),
                      _start(client, "throttledJob", "j", "event")]) == [
        ("admitted", None), ("queued", "throttle")]
    assert [_start(client, "throttledJob", "j", "invoke").status
            for _ in range(3)] == ["admitted"] * 3
    # soloJob: one run per job, newcomers skip; a child started by invoke is not held back.
    assert _start(client, "soloJob", "j", "event").status == "admitted"
    assert _start(client, "soloJob", "j", "event").status == "skipped"
    assert [_start(client, "soloJob", "j", "invoke").status
            for _ in range(2)] == ["admitted"] * 2


def test_concurrency_applies_to_every_origin(client: Client) -> None:
    # gatedJob: two runs in flight.
    handles = [_start(client, "gatedJob", f"j{i}", origin, id=f"{origin}-{i}")
               for i, origin in enumerate(["invoke", "cron", "direct", "event", "invoke"])]
    assert _statuses(handles) == [("admitted", None), ("admitted", None),
                                  ("queued", "concurrency"), ("queued", "concurrency"),
                                  ("queued", "concurrency")]


def test_a_direct_start_of_a_batch_workflow_runs_at_once_as_a_batch_of_one(
        client: Client, settings: Settings) -> None:
    admitted = TopicReader(settings, Topics(settings).admitted, AdmittedStart)
    assert _statuses([_start(client, "batchedJobs", "j1", "event")]) == [("queued", "batch")]
    handle = _start(client, "batchedJobs", "j2", "direct", id="d1")
    assert handle.status == "admitted"
    runs = admitted.until(lambda rows: any(r.execution_id == handle.execution_id for r in rows),
                          what="the direct start's run")
    run = next(r for r in runs if r.execution_id == handle.execution_id)
    assert json.loads(run.payload) == {"items": [{"jobId": "j2"}]}
