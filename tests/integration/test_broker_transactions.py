"""Exactly-once works on the one-node broker: transactions commit, abort, and fence readers."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = pytest.mark.broker


def _topic(bootstrap: str) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=30).values():
        future.result(timeout=30)
    return name


def _read_all(bootstrap: str, topic: str, isolation: str, timeout: float = 30.0) -> list[bytes]:
    """Every record `isolation` lets through, from the start to the end of partition 0."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    # assign, not subscribe: no group join needed to read one partition.
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(err)
            value = msg.value()
            assert value is not None
            values.append(value)
        raise AssertionError(f"no end of partition within {timeout}s; read {values}")
    finally:
        consumer.close()


def _producer(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"}
    )
    producer.init_transactions(30)
    return producer


def test_read_committed_sees_only_committed_batches(bootstrap: str) -> None:
    topic = _topic(bootstrap)
    producer = _producer(bootstrap)

    def batch(values: list[bytes], commit: bool) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # the aborted records really reach the log first
            producer.abort_transaction(30)

    committed_1, aborted, committed_2 = [b"c1", b"c2", b"c3"], [b"a1", b"a2"], [b"c4"]
    batch(committed_1, commit=True)
    batch(aborted, commit=False)
    batch(committed_2, commit=True)

    assert _read_all(bootstrap, topic, "read_committed") == committed_1 + committed_2
    assert _read_all(bootstrap, topic, "read_uncommitted") == committed_1 + aborted + committed_2


def test_consumed_offsets_commit_with_the_transaction(bootstrap: str) -> None:
    # Consume-transform-produce, the shape of sluicegate's runtime: the input offset is
    # committed to __consumer_offsets inside the output transaction.
    source, sink = _topic(bootstrap), _topic(bootstrap)
    seed = Producer({"bootstrap.servers": bootstrap})
    seed.produce(source, b"in")
    assert seed.flush(30) == 0

    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    try:
        consumer.subscribe([source])
        deadline = time.monotonic() + 30
        msg = None
        while msg is None and time.monotonic() < deadline:
            candidate = consumer.poll(0.5)
            if candidate is not None and candidate.error() is None:
                msg = candidate
        assert msg is not None, "the seeded record never arrived"

        producer = _producer(bootstrap)
        producer.begin_transaction()
        producer.produce(sink, b"out:" + (msg.value() or b""))
        producer.send_offsets_to_transaction(
            [TopicPartition(source, 0, (msg.offset() or 0) + 1)],
            consumer.consumer_group_metadata(),
            30,
        )
        producer.commit_transaction(30)

        (committed,) = consumer.committed([TopicPartition(source, 0)], timeout=30)
        assert committed.offset == 1
    finally:
        consumer.close()
    assert _read_all(bootstrap, sink, "read_committed") == [b"out:in"]
