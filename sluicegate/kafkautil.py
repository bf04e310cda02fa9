"""Small Kafka client helpers shared by the runtime, the SDK and the tools."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """(low, high) offsets of a partition, retrying while the broker is still electing its
    leader (a topic created a moment ago answers NOT_LEADER for a short while)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=min(10.0, timeout_s),
                                                       cached=False)
            return low, high
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or code in (
                KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION))
            if not retriable or time.monotonic() > deadline:
                raise
            if code == KafkaError._UNKNOWN_PARTITION:
                # The client's metadata predates the topic: ask for it explicitly.
                consumer.list_topics(tp.topic, timeout=5.0)
            time.sleep(0.1)
