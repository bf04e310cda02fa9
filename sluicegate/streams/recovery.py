"""Restoring a task's stores from their changelogs before the task processes anything.

A store is trusted up to the changelog offset written in the same WriteBatch as its
state; replay goes from there to the end of the committed changelog (read_committed, so
writes of aborted transactions never arrive). The rows of a table the stage publishes
(`Stage.tables`) are replayed the same way from the table's topic, which is their log. A
store whose offset is outside one of its logs' range (the topic was recreated, or
truncated) is wiped and rebuilt from all of them.

One consumer restores every store in turn, from the worker's loop while the task's
partitions are paused, so a store costs what its records cost and no fixed wait: the ends
of all of a task's logs are asked for at once, and a replay takes records as they are
fetched and ends when the consumer's position passes its log's end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, IsolationLevel, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from sluicegate.streams.store import PartitionStore
from sluicegate.streams.task import StageState, Task
from sluicegate.streams.transactions import Stopping
from sluicegate.topology.topics import Topics

log = logging.getLogger(__name__)

_BATCH = 2000
_POLL_S = 0.1


class RestoreError(RuntimeError):
    pass


def restore_task(task: Task, consumer: Consumer, admin: AdminClient, topics: Topics,
                 stopping: Callable[[], bool] = lambda: False,
                 timeout_s: float = 120.0) -> int:
    """Bring every store of `task` to the end of its logs; returns records replayed.
    Raises RestoreError (or a KafkaException) when the logs cannot be read, and
    `Stopping` as soon as `stopping()` says so.

    A log's end is its last stable offset (read_committed): a transaction still open on
    it (a worker that lost the partition and has not yet been fenced) can commit nothing
    there any more once the caller has read the partition's committed offsets, which
    wait for it to end (KIP-447)."""
    # (state, topic, the store key prefix of its rows, the table's name or None)
    logs: list[tuple[StageState, str, bytes, str | None]] = []
    for state in task.stateful():
        logs.append((state, state.changelog, b"", None))
        logs += [(state, table.topic, table.prefix, table.name) for table in state.tables]
    ranges = log_ranges(admin, [TopicPartition(topic, task.partition)
                                for _, topic, _, _ in logs])
    replayed = 0
    for state in task.stateful():
        store = state.store
        assert store is not None
        mine = [(topic, prefix, table, ranges[(topic, task.partition)])
                for owner, topic, prefix, table in logs if owner is state]
        for topic, _, table, (low, high) in mine:
            at = store.changelog_offset if table is None else store.table_offset(table)
            if not low <= at + 1 <= high:
                log.warning("store %s/%d at offset %d is outside %s [%d, %d): rebuilding",
                            state.stage.name, task.partition, at, topic, low, high)
                store.wipe()
                break
        for topic, prefix, table, (low, high) in mine:
            at = store.changelog_offset if table is None else store.table_offset(table)
            start = max(at + 1, low)
            if start < high:
                replayed += _replay(store, consumer, TopicPartition(topic, task.partition, start),
                                    high, timeout_s, stopping, prefix, table)
    return replayed


def log_ranges(admin: AdminClient, tps: list[TopicPartition],
               timeout_s: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
    """(first offset, last stable offset) of each partition, asked for all at once: two
    requests for a task's every log, where a watermark query per log costs a round trip
    each (a restored task has one log per stateful stage, and more for its tables)."""
    ends: list[dict[tuple[str, int], int]] = []
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        futures = admin.list_offsets({tp: spec for tp in tps},
                                     isolation_level=IsolationLevel.READ_COMMITTED,
                                     request_timeout=timeout_s)
        ends.append({(tp.topic, tp.partition): future.result(timeout=timeout_s).offset
                     for tp, future in futures.items()})
    return {tp: (ends[0][tp], ends[1][tp]) for tp in ends[0]}


def _replay(store: PartitionStore, consumer: Consumer, tp: TopicPartition, high: int,
            timeout_s: float, stopping: Callable[[], bool], prefix: bytes = b"",
            table: str | None = None) -> int:
    # A consumer assigned a topic whose leader it has not looked up waits for its next
    # metadata refresh before it fetches (most of a second); asked for, it answers at once.
    consumer.list_topics(tp.topic, timeout=10.0)
    consumer.assign([tp])
    deadline = time.monotonic() + timeout_s
    replayed = 0
    done = False
    while not done:
        if stopping():
            consumer.unassign()
            raise Stopping(f"restoring {tp.topic}[{tp.partition}]")
        if time.monotonic() > deadline:
            consumer.unassign()
            raise RestoreError(f"restoring {tp.topic}[{tp.partition}] did not reach offset {high}")
        # Wait for one record, then take what is already fetched: consume(n, timeout) alone
        # waits the whole timeout for n records, which a small changelog never has (half a
        # second or more per store, every store of every task, inside the rebalance).
        first = consumer.poll(_POLL_S)
        messages = [] if first is None else [first, *consumer.consume(_BATCH - 1, timeout=0)]
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
        # Transaction markers occupy offsets too, so the last data record sits below
        # `high - 1`; the position moves past them, and says at once that the replay is
        # done, where the end-of-partition event would come only after an empty fetch.
        if not done and consumer.position([tp])[0].offset >= high:
            done = True
    consumer.unassign()
    return replayed
