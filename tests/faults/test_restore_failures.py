"""A failure while a partition joins after its restore fails like a cycle: aborted, read
again, retried, a broken producer replaced, a stage hook that keeps failing given up on;
never the end of the worker (docs/decisions/runtime-faults.md)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sluicegate.admission.stages.identity import IdentityStage
from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.transactions import TransactionalProducer
from sluicegate.schemas.records import Outcome
from sluicegate.topology.admin import create_topics
from tests.apps.faults import app
from tests.faults.harness import MARKS, Outcomes
from tests.integration.kafka_helpers import WorkerThread

pytestmark = MARKS


@pytest.fixture
def one_partition(settings: Settings) -> Iterator[Settings]:
    settings = dataclasses.replace(settings, partitions=1)
    create_topics(settings)
    yield settings


def _admits(settings: Settings, worker: WorkerThread) -> None:
    outcomes = Outcomes(settings)
    try:
        with worker, Client(app=app, settings=settings, replies=False) as client:
            request = client.submit("sendReceipt", {"orderId": "o1", "amount": 1}).request_id
            client.flush()
            outcomes.wait_until_decided({request}, timeout_s=60)
            (row,) = outcomes.final()[request]
            assert row.outcome is Outcome.admitted
            assert worker.error is None
    finally:
        outcomes.close()


def _failing(times: int, make: Any) -> Any:
    """A function that raises `make()` on its first `times` calls, then does nothing."""
    calls = {"n": 0}

    def fail(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] <= times:
            raise make()

    fail.calls = calls  # type: ignore[attr-defined]
    return fail


def test_a_fenced_producer_as_a_partition_joins_is_replaced(
        one_partition: Settings, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    real_begin = TransactionalProducer.begin
    fenced = _failing(1, lambda: KafkaException(KafkaError(
        KafkaError._FENCED, "injected: fenced by a newer instance", fatal=True)))

    def begin(self: TransactionalProducer) -> None:
        fenced()
        real_begin(self)

    monkeypatch.setattr(TransactionalProducer, "begin", begin)
    with caplog.at_level(logging.WARNING):
        _admits(one_partition, WorkerThread(app, one_partition))
    assert fenced.calls["n"] > 1
    assert "replacing the transactional producer" in caplog.text


def test_a_stage_hook_that_fails_once_as_a_partition_joins_is_run_again(
        one_partition: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    real = IdentityStage.restored
    hook = _failing(1, lambda: RuntimeError("injected: a passing failure"))

    def restored(self: IdentityStage, ctx: Any) -> None:
        hook()
        real(self, ctx)

    monkeypatch.setattr(IdentityStage, "restored", restored)
    _admits(one_partition, WorkerThread(app, one_partition))
    assert hook.calls["n"] == 2


def test_a_stage_hook_that_always_fails_as_a_partition_joins_is_given_up_on(
        one_partition: Settings, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    hook = _failing(10**9, lambda: RuntimeError("injected: a deterministic failure"))
    monkeypatch.setattr(IdentityStage, "restored", lambda self, ctx: hook())
    with caplog.at_level(logging.WARNING):
        _admits(one_partition, WorkerThread(app, one_partition))
    given_up = [r for r in caplog.records if r.levelno == logging.ERROR
                and "restored" in r.getMessage()]
    assert len(given_up) == 1, [r.getMessage() for r in given_up]
    assert "identity" in given_up[0].getMessage()
