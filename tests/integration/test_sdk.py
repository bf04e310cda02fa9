"""The Python SDK on the real broker: producers hear their decisions, engines report runs."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluicegate.client import AsyncClient, Client, Engine, PayloadError, UnknownWorkflow
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.kafkautil import watermarks
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import CommandKind, EngineCommand, RunRow, RunStatus
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def app():  # type: ignore[no-untyped-def]
    return load_app("tests.apps.identity")


def _starts_written(settings: Settings) -> int:
    topics = Topics(settings)
    consumer = Consumer(settings.client_config(**{"group.id": "count"}))
    try:
        return sum(watermarks(consumer, TopicPartition(topics.starts, p))[1]
                   for p in range(settings.partitions))
    finally:
        consumer.close()


def test_a_waiting_caller_hears_admitted_then_existing_for_a_repeat(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)
    with WorkerThread(app, settings), Client(app=app, settings=settings) as client:
        first = client.start("sendReceipt", {"orderId": "o1", "amount": 5},
                             wait_decision=True, timeout=60)
        again = client.start("sendReceipt", {"orderId": "o1", "amount": 5},
                             wait_decision=True, timeout=60)
    assert first.status == "admitted"
    assert first.execution_id is not None
    assert again.status == "existing"
    assert again.execution_id == first.execution_id


def test_a_payload_that_does_not_validate_is_refused_before_anything_is_produced(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)
    with Client(app=app, settings=settings, replies=False) as client:
        with pytest.raises(PayloadError, match="workflow sendReceipt: payload does not validate"):
            client.start("sendReceipt", {"orderId": "o1"})
        with pytest.raises(UnknownWorkflow, match="'nope' is not declared"):
            client.start("nope", {})
    assert _starts_written(settings) == 0


def test_the_asyncio_client_awaits_the_same_decision(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)

    async def go() -> tuple[str, str]:
        async with AsyncClient(app=app, settings=settings) as client:
            a = await client.start("note", {"text": "hi"}, wait_decision=True, timeout=60)
            b = await client.start("sendReceipt", {"orderId": "o9", "amount": 1},
                                   wait_decision=True, timeout=60)
            return a.status, b.status

    with WorkerThread(app, settings):
        assert asyncio.run(go()) == ("admitted", "admitted")


def test_an_engine_runs_admitted_starts_and_the_runs_table_follows_its_reports(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)
    topics = Topics(settings)
    runs = TopicReader(settings, topics.runs, RunRow)
    with WorkerThread(app, settings), Client(app=app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        handle = client.start("note", {"text": "run me"}, wait_decision=True, timeout=60)
        deadline = time.monotonic() + 60
        delivery = None
        while delivery is None or delivery.admitted is None:
            assert time.monotonic() < deadline, "the engine never got the admitted start"
            delivery = engine.poll(0.5)
        assert delivery.admitted.execution_id == handle.execution_id
        engine.started(delivery)
        engine.completed(delivery.admitted.execution_id, "note")
        engine.flush()
        rows = runs.until(lambda rs: any(r.status is RunStatus.completed for r in rs),
                          timeout=60, what="the run completed in sg.runs")
    statuses = [r.status for r in rows if r.execution_id == handle.execution_id]
    # A table: each commit publishes a run's latest row, so two reports that land in one
    # commit cycle show as one change; what does show comes in the run's order.
    lifecycle = [RunStatus.admitted, RunStatus.running, RunStatus.completed]
    assert statuses[-1] is RunStatus.completed
    assert statuses == sorted(statuses, key=lifecycle.index)
    assert len(set(statuses)) == len(statuses)
    assert rows[-1].ended_at_ms is not None


def test_an_engine_receives_the_commands_for_its_runs(settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    command = EngineCommand(command_id="c1", execution_id="ex-1", workflow="note",
                            kind=CommandKind.cancel, issued_at_ms=1, reason="bad deploy")
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    producer.produce(topics.commands, codec.encode(command), b"ex-1")
    producer.flush(10)
    with Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        deadline = time.monotonic() + 60
        got = None
        while got is None:
            assert time.monotonic() < deadline, "the engine never got the command"
            delivery = engine.poll(0.5)
            got = delivery.command if delivery is not None else None
    assert got == command


def _next_command(engine: Engine) -> EngineCommand:
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "the engine never got the command"
        delivery = engine.poll(0.5)
        if delivery is not None and delivery.command is not None:
            return delivery.command


def test_a_command_an_engine_did_not_act_on_reaches_the_next_engine(
        settings: Settings) -> None:
    """An engine that fails while acting on a command (it leaves the group without asking
    for its next delivery) has not consumed it: the engine that takes its partition over
    gets the command again. One that acted on it and asked for more does not pass it on."""
    create_topics(settings)
    topics = Topics(settings)
    group = f"{settings.namespace}engine"
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    for n in (1, 2):
        command = EngineCommand(command_id=f"c{n}", execution_id="ex-1", workflow="note",
                                kind=CommandKind.cancel, issued_at_ms=n, reason="bad deploy")
        producer.produce(topics.commands, codec.encode(command), b"ex-1")
    producer.flush(10)
    with pytest.raises(RuntimeError, match="acting failed"), \
            Engine(group=group, settings=settings) as failing:
        assert _next_command(failing).command_id == "c1"
        raise RuntimeError("acting failed")
    with Engine(group=group, settings=settings) as acting:
        assert _next_command(acting).command_id == "c1"  # again
        assert _next_command(acting).command_id == "c2"  # c1 acted on: its offset stored
    # c2 was the last command delivered and the engine closed cleanly: acted on too, so
    # the group's committed offset is past both.
    partition = partition_for(b"ex-1", settings.partitions)
    reader = Consumer(settings.client_config(**{"group.id": group}))
    try:
        (committed,) = reader.committed([TopicPartition(topics.commands, partition)], 10)
    finally:
        reader.close()
    assert committed.offset == 2
