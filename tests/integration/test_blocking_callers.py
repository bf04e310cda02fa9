"""Blocking callers on the real broker: `run()` / `start(wait=True)` return the ended
run's row, are refused where a start can wait in the queue, and singleton and rateLimit
still answer at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from sluicegate.client import (
    AsyncClient,
    BlockingCallerRefused,
    Client,
    Engine,
    RateLimited,
    SingletonHeld,
)
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import RunStatus
from sluicegate.topology.admin import create_topics
from tests.apps.lifecycle import app
from tests.integration.kafka_helpers import WorkerThread

pytestmark = pytest.mark.broker


class FakeEngine:
    """Runs flakyJob and limitedJob to the end: completed, or failed when the job id says
    so. Other workflows' runs start and keep running."""

    def __init__(self, settings: Settings) -> None:
        self.engine = Engine(group=f"{settings.namespace}engine", settings=settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            delivery = self.engine.poll(0.1)
            if delivery is None or delivery.admitted is None:
                continue
            run = delivery.admitted
            self.engine.started(delivery)
            if run.workflow not in ("flakyJob", "limitedJob"):
                continue
            if b"fail" in run.payload:
                self.engine.failed(run.execution_id, run.workflow, retries_spent=2,
                                   error_message="it broke")
            else:
                self.engine.completed(run.execution_id, run.workflow)
            self.engine.flush()

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.close()


@pytest.fixture
def running(settings: Settings) -> Iterator[Client]:
    create_topics(settings)
    with Client(app=app, settings=settings) as client, FakeEngine(settings), \
            WorkerThread(app, settings, ManualClock()):
        yield client


def test_run_blocks_until_the_run_ended_and_returns_its_row(running: Client) -> None:
    row = running.run("flakyJob", {"jobId": "ok-1"})
    assert row.status is RunStatus.completed and row.workflow == "flakyJob"
    failed = running.start("flakyJob", {"jobId": "fail-1"}, wait=True)
    assert failed.status == "admitted" and failed.result is not None
    assert (failed.result.status, failed.result.last_reason, failed.result.retries_spent) == (
        RunStatus.failed, "it broke", 2)
    assert failed.result.execution_id == failed.execution_id


def test_a_retried_direct_run_with_the_same_id_answers_with_the_same_ended_run(
        running: Client) -> None:
    first = running.start("flakyJob", {"jobId": "ok-2"}, id="order-2", origin="direct",
                          wait=True)
    again = running.start("flakyJob", {"jobId": "ok-2"}, id="order-2", origin="direct",
                          wait=True)
    assert (first.status, again.status) == ("admitted", "existing")
    assert again.execution_id == first.execution_id
    assert again.result == first.result and first.result is not None
    assert first.result.status is RunStatus.completed


def test_singleton_and_rate_limit_answer_a_blocking_caller_at_once(running: Client) -> None:
    # soloJob's runs keep running (the engine never ends them): the key stays held.
    holder = running.start("soloJob", {"jobId": "s"}, wait_decision=True)
    with pytest.raises(SingletonHeld) as held:
        running.run("soloJob", {"jobId": "s"}, timeout=20)
    assert held.value.execution_id == holder.execution_id

    assert running.run("limitedJob", {"jobId": "r"}).status is RunStatus.completed
    with pytest.raises(RateLimited) as limited:
        running.run("limitedJob", {"jobId": "r"}, timeout=20)
    assert limited.value.retry_after_ms is not None and limited.value.retry_after_ms > 0


@pytest.mark.parametrize(("workflow", "control"), [
    ("gatedJob", "concurrency"), ("debouncedJob", "debounce"), ("throttledJob", "throttle")])
def test_blocking_callers_are_refused_for_workflows_that_defer(
        settings: Settings, workflow: str, control: str) -> None:
    create_topics(settings)
    with Client(app=app, settings=settings) as client:
        for call in (lambda: client.run(workflow, {"jobId": "x"}),
                     lambda: client.start(workflow, {"jobId": "x"}, wait=True)):
            with pytest.raises(BlockingCallerRefused) as refused:
                call()
            message = str(refused.value)
            assert f"workflow {workflow} declares {control}" in message
            assert "run() / start(wait=True) blocks for the run's result" in message


def test_a_delayed_start_cannot_be_waited_on(settings: Settings) -> None:
    create_topics(settings)
    with Client(app=app, settings=settings) as client, \
            pytest.raises(BlockingCallerRefused, match="delayed start"):
        client.start("flakyJob", {"jobId": "x"}, at=2_000_000_000_000, wait=True)


def test_the_asyncio_client_runs_and_waits_like_the_sync_one(running: Client) -> None:
    async def go() -> tuple[RunStatus, str, bool]:
        async with AsyncClient(app=app, settings=running.settings) as client:
            row = await client.run("flakyJob", {"jobId": "ok-async"})
            handle = await client.start("flakyJob", {"jobId": "fail-async"}, wait=True)
            with pytest.raises(BlockingCallerRefused):
                await client.run("gatedJob", {"jobId": "x"})
            assert handle.result is not None
            return row.status, handle.status, handle.result.status is RunStatus.failed

    assert asyncio.run(go()) == (RunStatus.completed, "admitted", True)
