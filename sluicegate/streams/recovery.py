"""Restoring a task's stores from their changelogs before the task processes anything.

A store is trusted up to the changelog offset written in the same WriteBatch as its
state; replay goes from there to the end of the committed changelog (read_committed, so
writes of aborted transactions never arrive). The rows of a table the stage publishes
(`Stage.tables`) are replayed the same way from the table's topic, which is their log. A
store whose offset is outside one of its logs' range (the topic was recreated, or
truncated) is wiped and rebuilt from all of them.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.kafkautil import watermarks
from sluicegate.streams.store import PartitionStore
from sluicegate.streams.task import Task
from sluicegate.topology.topics import Topics

log = logging.getLogger(__name__)

_BATCH = 2000


class RestoreError(RuntimeError):
    pass


def restore_task(task: Task, consumer: Consumer, topics: Topics, timeout_s: float = 120.0) -> int:
    """Bring every store of `task` to the end of its logs; returns records replayed."""
    replayed = 0
    for state in task.stateful():
        store = state.store
        assert store is not None and state.timers is not None
        # (topic, the store key prefix of its rows, the table's name or None: the changelog)
        logs: list[tuple[str, bytes, str | None]] = [
            (state.changelog, b"", None),
            *((table.topic, table.prefix, table.name) for table in state.tables)]
        ranges = [watermarks(consumer, TopicPartition(topic, task.partition))
                  for topic, _, _ in logs]
        for (topic, _, table), (low, high) in zip(logs, ranges, strict=True):
            at = store.changelog_offset if table is None else store.table_offset(table)
            if not low <= at + 1 <= high:
                log.warning("store %s/%d at offset %d is outside %s [%d, %d): rebuilding",
                            state.stage.name, task.partition, at, topic, low, high)
                store.wipe()
                break
        for (topic, prefix, table), (low, high) in zip(logs, ranges, strict=True):
            at = store.changelog_offset if table is None else store.table_offset(table)
            start = max(at + 1, low)
            if start < high:
                replayed += _replay(store, consumer, TopicPartition(topic, task.partition, start),
                                    high, timeout_s, prefix, table)
    return replayed


def _replay(store: PartitionStore, consumer: Consumer, tp: TopicPartition, high: int,
            timeout_s: float, prefix: bytes = b"", table: str | None = None) -> int:
    consumer.assign([tp])
    deadline = time.monotonic() + timeout_s
    replayed = 0
    done = False
    while not done:
        if time.monotonic() > deadline:
            raise RestoreError(f"restoring {tp.topic}[{tp.partition}] did not reach offset {high}")
        messages = consumer.consume(_BATCH, timeout=0.5)
        changes: dict[bytes, bytes | None] = {}
        last = -1
        for msg in messages:
            # One consumer restores every store in turn: an end-of-partition event or a
            # record fetched for the changelog before this one may still arrive, and must
            # not end (or feed) this replay.
            if msg.topic() != tp.topic or msg.partition() != tp.partition:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    done = True
                    continue
                raise RestoreError(f"restoring {tp.topic}[{tp.partition}]: {error}")
            key = msg.key()
            if key is None:
                continue
            changes[prefix + key] = msg.value()
            last = msg.offset() or 0
        if last >= 0:
            if table is None:
                store.write(changes, last)
            else:
                store.write(changes, None, {table: last})
            replayed += len(changes)
            # Transaction markers occupy offsets too: the last data record may sit below
            # `high - 1`, so the end is known only by EOF or by passing the last marker.
            if last >= high - 1:
                done = True
    consumer.unassign()
    return replayed
