"""Recent dead letters: the records sluicegate could not handle (`sg.deadletter`), newest
first, with their reasons, for the console (`GET /inspect/deadletters`)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.config import Settings
from sluicegate.kafkautil import watermarks
from sluicegate.ops.runs import _iso, payload_text
from sluicegate.schemas import codec
from sluicegate.schemas.records import DeadLetter, StartRequest
from sluicegate.topology.topics import Topics


def describe(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as the console shows it; a start request's workflow and request id
    when the record is one."""
    doc: dict[str, Any] = {
        "at": _iso(letter.at_ms), "at_ms": letter.at_ms, "reason": letter.reason,
        "stage": letter.stage,
        "source": f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
        "key": None if letter.key is None else letter.key.decode("utf-8", "replace"),
        "workflow": None, "request_id": None, "payload": None,
        "bytes": len(letter.value or b""),
    }
    if letter.value is not None:
        try:
            start = codec.decode(StartRequest, letter.value)
        except codec.DecodeError:
            return doc
        doc.update(workflow=start.workflow, request_id=start.request_id,
                   payload=payload_text(start.payload))
    return doc


def recent(settings: Settings, limit: int = 50, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """At most `limit` of the newest dead letters (the last `limit` of each partition,
    merged by time), newest first."""
    topic = Topics(settings).deadletter
    consumer = Consumer(settings.client_config(**{
        "group.id": f"{settings.namespace}deadletter-reader", "enable.auto.commit": False,
        "enable.partition.eof": True, "isolation.level": "read_committed",
        "fetch.wait.max.ms": 20,
    }))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        ends: dict[int, int] = {}
        starts = []
        for p in meta.partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p), timeout_s)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, max(low, high - limit)))
        consumer.assign(starts)
        letters: list[DeadLetter] = []
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                partition, offset = msg.partition(), msg.offset()
                if partition is None or offset is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        ends.pop(partition, None)
                    continue
                value = msg.value()
                if value is not None:
                    with contextlib.suppress(codec.DecodeError):
                        letters.append(codec.decode(DeadLetter, value))
                if offset + 1 >= ends.get(partition, 0):
                    ends.pop(partition, None)
        letters.sort(key=lambda d: d.at_ms, reverse=True)
        return [describe(d) for d in letters[:limit]]
    finally:
        consumer.close()
