"""Rejected starts a producer in another language can match, on the real broker: the
worker answers on the producer's reply partition under its own request id, even when the
record does not decode (docs/decisions/matchable-rejections.md)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Origin, Outcome, Reply, StartRequest
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

app = load_app("tests.apps.identity")


def _answers(settings: Settings, topics: Topics, partition: int, request_ids: set[str],
             ) -> dict[str, Reply]:
    """What a producer waiting on one partition of the replies topic hears, by request id,
    until every one of `request_ids` is answered."""
    consumer = Consumer(settings.client_config(**{
        "group.id": f"waiting-producer-{time.monotonic_ns()}", "enable.auto.commit": False,
        "isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(topics.replies, partition, 0)])
    heard: dict[str, Reply] = {}
    deadline = time.monotonic() + 60
    try:
        while not request_ids <= heard.keys():
            assert time.monotonic() < deadline, f"no answer to {request_ids - heard.keys()}"
            for msg in consumer.consume(100, timeout=0.2):
                if msg.error() is None and msg.value() is not None:
                    reply = codec.decode(Reply, msg.value())
                    heard[reply.request_id] = reply
    finally:
        consumer.close()
    return heard


def test_a_producer_hears_the_rejection_of_a_start_the_worker_cannot_decode(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    partition = settings.partitions - 1
    start = StartRequest(request_id="go-1", workflow="note", payload=b'{"text":"hi"}',
                         origin=Origin.event, requested_at_ms=int(time.time() * 1000),
                         reply_partition=partition, wait=True)
    frame = codec.encode(start)
    # A foreign producer whose Avro library computed another fingerprint.
    producer.produce(topics.starts, frame[:2] + bytes(8) + frame[10:], b"go-1")
    # One that wrote JSON, and said who it is in the headers.
    producer.produce(topics.starts, b'{"request_id":"go-2"}', b"go-2", headers=[
        ("sluicegate.request_id", b"go-2"), ("sluicegate.workflow", b"note"),
        ("sluicegate.reply_partition", str(partition).encode())])
    # One that names a reply partition the replies topic does not have.
    producer.produce(topics.starts, codec.encode(StartRequest(
        request_id="go-3", workflow="note", payload=b'{"text":"hi"}', origin=Origin.event,
        requested_at_ms=1, reply_partition=settings.partitions + 5)), b"go-3")
    assert producer.flush(10) == 0
    with WorkerThread(app, settings), Client(app=app, settings=settings) as client:
        heard = _answers(settings, topics, partition, {"go-1", "go-2"})
        # The partitions go on: a good start after them is admitted.
        assert client.start("note", {"text": "after"}, wait_decision=True).status == "admitted"
        ledger.until(lambda rows: {"go-1", "go-2", "go-3"} <= {r.request_id for r in rows},
                     what="the three rejections in the ledger")

    assert {k: (r.outcome, r.execution_id) for k, r in heard.items()} == {
        "go-1": (Outcome.rejected, None), "go-2": (Outcome.rejected, None)}
    assert "unknown schema fingerprint" in (heard["go-1"].reason or "")
    assert "read from the record's headers" in (heard["go-2"].reason or "")
    rows = {r.request_id: r for r in ledger.records if r.request_id.startswith("go-")}
    assert {k: (r.outcome, r.workflow) for k, r in rows.items()} == {
        "go-1": (Outcome.rejected, "note"), "go-2": (Outcome.rejected, "note"),
        "go-3": (Outcome.rejected, "note")}
    assert "is not a partition of" in (rows["go-3"].reason or "")
