"""Restoring a task's stores from their changelogs before the task processes anything.

A store is trusted up to the changelog offset written in the same WriteBatch as its
state; replay goes from there to the end of the committed changelog (read_committed, so
writes of aborted transactions never arrive). The rows of a table the stage publishes
(`Node.tables`) are replayed the same way from the table's topic, which is their log. A
store is wiped and rebuilt from all of them when the logs cannot prove it: its offset is
outside one of its logs' range (the topic was recreated, or truncated), or it was last in
step with them longer ago than half their `delete.retention.ms`, after which the log
cleaner may have removed tombstones it never saw (docs/decisions/stale-stores.md).

One consumer restores every store in turn, from the worker's loop while the task's
partitions are paused, so a store costs what its records cost and no fixed wait: the ends
of all of a task's logs are asked for at once, and a replay takes records as they are
fetched and ends when the consumer's position passes its log's end. A restoration goes a
step at a time (`Restoration.step`), between which the loop processes the partitions
already restored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from sluicegate.config import TRANSACTION_TIMEOUT_MS
from sluicegate.engine.store import Store
from sluicegate.engine.task import StageState, Task
from sluicegate.engine.transactions import Stopping, describe, error_of

log = logging.getLogger(__name__)

_BATCH = 2000
_POLL_S = 0.1
# The broker's default `delete.retention.ms` (a day): assumed for a log whose configuration
# this worker may not read.
DEFAULT_DELETE_RETENTION_MS = 86_400_000


# How long a replay waits at a log's last stable offset for the transactions above it to
# end before it says so (it waits on): twice the longest a live producer's transaction
# stays open before the broker aborts it (docs/decisions/restore-to-the-high-watermark.md).
HANGING_AFTER_S = 2 * TRANSACTION_TIMEOUT_MS / 1000
# And how often it says so again while it waits.
HANGING_REPEAT_S = 60.0


class RestoreError(RuntimeError):
    pass


class Restoration:
    """Bringing every store of one task to the end of its logs, a step at a time, so the
    worker's loop goes on processing its other partitions between steps (a task with a
    long changelog does not hold up the ones already restored).

    The ends of all the task's logs are asked for at once when it begins. A log's end is
    its high watermark, which every record written to it so far is below, and the replay
    (read_committed) reaches it only once each transaction among them has ended: its
    records then replayed if it committed, skipped if it aborted. Not its last stable
    offset: a transaction that has committed may not have its marker on the log yet (the
    coordinator writes the markers after it answers the commit, and the marker on the
    offsets topic, which the caller's read of the committed offsets waits for, can come
    first), and a replay to the last stable offset would leave out what that transaction
    wrote while its offsets say its records were processed
    (docs/decisions/restore-to-the-high-watermark.md). Nothing new is written to these
    logs meanwhile: the task's previous owner has committed or been fenced, and this
    worker writes them only once the task processes. `step` raises RestoreError (or a
    KafkaException) when a log cannot be read or stops short of its end for `timeout_s`,
    and `Stopping` as soon as `stopping()` says so; the restore consumer is then left
    unassigned, and a new Restoration goes on from what the stores hold."""

    def __init__(self, task: Task, consumer: Consumer, admin: AdminClient,
                 stopping: Callable[[], bool] = lambda: False,
                 timeout_s: float = 120.0, settle_s: float = HANGING_AFTER_S) -> None:
        self.task = task
        self.consumer = consumer
        self.stopping = stopping
        self.timeout_s = timeout_s
        self.settle_s = settle_s
        self.admin = admin
        # Since when the replay of the current log has read nothing new, and when it last
        # said that it waits at an open transaction.
        self._stable_end_since: float | None = None
        self._said_open_at: float | None = None
        self.replayed = 0
        # (state, topic, the store key prefix of its rows, the table's name or None)
        logs: list[tuple[StageState, str, bytes, str | None]] = []
        for state in task.stateful():
            logs.append((state, state.changelog, b"", None))
            logs += [(state, table.topic, table.prefix, table.name) for table in state.tables]
        # Every record after the ends read below was written after this moment: a store
        # replayed to them is in step with its logs as of then.
        self._read_at = task.now_ms()
        ranges = log_ranges(admin, [TopicPartition(topic, task.partition)
                                    for _, topic, _, _ in logs])
        # The stages whose stores hold something, which their logs must still prove.
        kept = {state.node.name for state in task.stateful()
                if state.store is not None and state.store.holds_rows}
        retention = delete_retention(admin, sorted({topic for owner, topic, _, _ in logs
                                                    if owner.node.name in kept}))
        # What is left to replay: (store, the log from where the store is, its end, ...).
        self._left: list[tuple[Store, TopicPartition, int, bytes, str | None]] = []
        for state in task.stateful():
            store = state.store
            assert store is not None
            mine = [(topic, prefix, table, ranges[(topic, task.partition)])
                    for owner, topic, prefix, table in logs if owner is state]
            if state.node.name in kept:
                why = unproven(store, min(retention[t] for t, _, _, _ in mine),
                               self._read_at)
                for topic, _, table, (low, high) in mine:
                    at = store.changelog_offset if table is None else store.table_offset(table)
                    if why is None and not low <= at + 1 <= high:
                        why = f"at offset {at} is outside {topic} [{low}, {high})"
                if why is not None:
                    log.warning("store %s/%d %s: rebuilding it from its logs",
                                state.node.name, task.partition, why)
                    store.wipe()
            for topic, prefix, table, (low, high) in mine:
                at = store.changelog_offset if table is None else store.table_offset(table)
                start = max(at + 1, low)
                if start < high:
                    self._left.append((store, TopicPartition(topic, task.partition, start),
                                       high, prefix, table))
            if not any(left[0] is store for left in self._left):
                store.mark_synced(self._read_at)
        # The stores the restoration writes (or wiped): their derived rows are made again
        # once it ends, as are those of a store in memory, which hold none yet.
        self._written: list[Store] = [state.store for state in task.stateful()
                                      if state.store is not None
                                      and (not state.store.persistent
                                           or any(left[0] is state.store
                                                  for left in self._left))]
        self._derived = False
        self._assigned = False
        self._deadline = 0.0

    @property
    def done(self) -> bool:
        return not self._left and self._derived

    def step(self, budget_s: float) -> bool:
        """Replay for about `budget_s` (at least one fetch); True once every log is."""
        until = time.monotonic() + budget_s
        while self._left:
            if self.stopping():
                self.abandon()
                raise Stopping(f"restoring partition {self.task.partition}")
            store, tp, high, prefix, table = self._left[0]
            if not self._assigned:
                # A consumer assigned a topic whose leader it has not looked up waits for
                # its next metadata refresh before it fetches (most of a second); asked
                # for, it answers at once.
                self.consumer.list_topics(tp.topic, timeout=10.0)
                self.consumer.assign([tp])
                self._assigned = True
                self._deadline = time.monotonic() + self.timeout_s
                self._stable_end_since = None
                self._said_open_at = None
            if self._fetch(store, tp, high, prefix, table):
                self.consumer.unassign()
                self._assigned = False
                self._left.pop(0)
                if not any(left[0] is store for left in self._left):
                    store.mark_synced(self._read_at)
            elif time.monotonic() > self._deadline:
                self.abandon()
                raise RestoreError(f"restoring {tp.topic}[{tp.partition}] did not reach "
                                   f"offset {high}")
            if time.monotonic() >= until:
                break
        if not self._left and not self._derived:
            self.task.rebuild_derived(self._written)
            self._derived = True
        return self.done

    def abandon(self) -> None:
        """Stop here: the stores keep what was replayed (each write with its offset)."""
        if self._assigned:
            self.consumer.unassign()
            self._assigned = False

    def _fetch(self, store: Store, tp: TopicPartition, high: int, prefix: bytes,
               table: str | None) -> bool:
        """One fetch of `tp` into `store`; True when the log is replayed to `high`."""
        consumer = self.consumer
        # Wait for one record, then take what is already fetched: consume(n, timeout) alone
        # waits the whole timeout for n records, which a small changelog never has (half a
        # second or more per store, every store of every task, inside the rebalance).
        first = consumer.poll(_POLL_S)
        messages = [] if first is None else [first, *consumer.consume(_BATCH - 1, timeout=0)]
        changes: dict[bytes, bytes | None] = {}
        last = -1
        for msg in messages:
            # One consumer restores every store in turn: an end-of-partition event or a
            # record fetched for the log before this one may still arrive, and must not
            # end (or feed) this replay.
            if msg.topic() != tp.topic or msg.partition() != tp.partition:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RestoreError(f"restoring {tp.topic}[{tp.partition}]: {error}")
            key = msg.key()
            if key is None:
                continue
            changes[prefix + key] = msg.value()
            last = msg.offset() or 0
        if last >= 0:
            write_replayed(store, changes, last, table)
            self.replayed += len(changes)
            # A log that keeps coming is not stuck, however long it is.
            self._deadline = time.monotonic() + self.timeout_s
        # Transaction markers occupy offsets too, so the last data record sits below
        # `high - 1`; the position moves past them, and says at once that the replay is
        # done, where the end-of-partition event would come only after an empty fetch.
        # That event alone is not the end: read_committed, it comes at the last stable
        # offset, below a transaction whose marker is still to come.
        at = consumer.position([tp])[0].offset
        if at >= high:
            return True
        # Nothing returned yet: where the replay began.
        at = at if at >= 0 else tp.offset
        now = time.monotonic()
        if last >= 0 or self._stable_end_since is None:
            self._stable_end_since = now
            self._said_open_at = None
        elif (now - self._stable_end_since > self.settle_s
              and (self._said_open_at is None
                   or now - self._said_open_at > HANGING_REPEAT_S)
              and at >= log_ranges(self.admin, [tp], committed=True)[(tp.topic,
                                                                      tp.partition)][1]):
            # Nothing new for that long, at the last stable offset: a transaction still
            # open above it (after a broker restart, one can outlive the transaction
            # timeout by a while; one the broker lost track of never ends). The replay
            # waits on: going on without what it wrote would lose it if it commits
            # (a store short of a freed slot, a queued start). Said now and every minute.
            self._said_open_at = now
            log.error("%s[%d]: offsets %d to %d belong to a transaction still open after "
                      "%.0fs: partition %d waits for it to end (if it never does, a hanging "
                      "transaction: kafka-transactions.sh find-hanging, then abort)",
                      tp.topic, tp.partition, at, high - 1, now - self._stable_end_since,
                      self.task.partition)
        if self._said_open_at is not None:
            # Waiting for a transaction to end is not a replay that stopped short.
            self._deadline = now + self.timeout_s
        return False


def write_replayed(store: Store, changes: dict[bytes, bytes | None], last: int,
                   table: str | None) -> None:
    """Rows replayed from one of a store's logs (its changelog, or `table`'s topic), with
    the offset `last` of the last of them, which the store records in the same write."""
    if table is None:
        store.write(changes, last)
    else:
        store.write(changes, None, {table: last})


def restore_task(task: Task, consumer: Consumer, admin: AdminClient,
                 stopping: Callable[[], bool] = lambda: False,
                 timeout_s: float = 120.0) -> int:
    """Bring every store of `task` to the end of its logs at once; returns records
    replayed (a `Restoration` run to its end)."""
    restoration = Restoration(task, consumer, admin, stopping, timeout_s)
    while not restoration.step(60.0):
        pass
    return restoration.replayed


def unproven(store: Store, retention_ms: int, now_ms: int) -> str | None:
    """Why the store's logs can no longer prove what it holds, or None when they can: a
    tombstone stays in a compacted log at least `delete.retention.ms` after it was written,
    so every one written after the store was last in step with its logs is still there
    while that was less than the retention ago (half of it, for the clocks of the worker
    and the broker, and the cleaner's own timing)."""
    synced = store.synced_at_ms
    if synced is None:
        return "has no record of when it was last in step with its logs"
    if now_ms - synced >= retention_ms // 2:
        return (f"was last in step with its logs {(now_ms - synced) / 1000:.0f}s ago, longer "
                f"than half their delete.retention.ms ({retention_ms / 1000:.0f}s): the log "
                f"cleaner may have removed tombstones it never saw")
    return None


def delete_retention(admin: AdminClient, topics: list[str],
                     timeout_s: float = 10.0) -> dict[str, int]:
    """Each topic's `delete.retention.ms`, asked for at once; a topic whose configuration
    this worker may not read is taken to have the broker's default."""
    if not topics:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                     request_timeout=timeout_s)
    retention = {}
    for resource, future in futures.items():
        try:
            entries = future.result(timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED):
                raise
            log.warning("the configuration of %s cannot be read (%s): taking its "
                        "delete.retention.ms to be the broker's default", resource.name,
                        describe(exc))
            entries = {}
        entry = entries.get("delete.retention.ms")
        retention[resource.name] = (int(entry.value) if entry is not None and entry.value
                                    else DEFAULT_DELETE_RETENTION_MS)
    return retention


def log_ranges(admin: AdminClient, tps: list[TopicPartition], timeout_s: float = 10.0,
               committed: bool = False) -> dict[tuple[str, int], tuple[int, int]]:
    """(first offset, high watermark) of each partition, asked for all at once: two
    requests for a task's every log, where a watermark query per log costs a round trip
    each (a restored task has one log per stateful stage, and more for its tables). The
    high watermark, not the last stable offset: a reader that must have read every
    committed record written so far reads to it (see `Restoration`). `committed`: the
    last stable offset instead."""
    ends: list[dict[tuple[str, int], int]] = []
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        futures = admin.list_offsets({tp: spec for tp in tps},
                                     isolation_level=IsolationLevel.READ_COMMITTED
                                     if committed else IsolationLevel.READ_UNCOMMITTED,
                                     request_timeout=timeout_s)
        ends.append({(tp.topic, tp.partition): future.result(timeout=timeout_s).offset
                     for tp, future in futures.items()})
    return {tp: (ends[0][tp], ends[1][tp]) for tp in ends[0]}


# How long the probe that a broker answers waits, before the admin client asks a group's
# coordinator (`committed_offsets`).
_PROBE_S = 3.0


def committed_offsets(consumer: Consumer, admin: AdminClient, group: str,
                      tps: list[TopicPartition], timeout_s: float = 10.0) -> list[TopicPartition]:
    """The offsets committed on `tps`, stable ones only: a transaction still writing
    offsets on them is waited for (KIP-447), as the restore needs. Asked of the consumer;
    when it times out, asked again through the admin client, which answers what the
    broker says: the stable offsets (a consumer once seen to time out here for minutes
    after it was fenced and replaced, while the broker had them), or why not
    (UNSTABLE_OFFSET_COMMIT: a transaction that wrote offsets on these partitions has
    not ended), which the error raised then says.

    The admin client asks only once a broker has just answered it: its request to a
    group's coordinator aborts the whole process when the connection drops under it
    (confluentinc/librdkafka#4605, fixed by the still open #5397; seen here in 6 of 48 runs
    of the broker-restart test, each right after such a request timed out during an
    outage), and the consumer times out here mostly because the broker is away
    (docs/decisions/committed-offsets-not-asked-into-an-outage.md)."""
    try:
        return list(consumer.committed(tps, timeout=timeout_s))
    except KafkaException as exc:
        error = error_of(exc)
        if error is None or error.code() != KafkaError._TIMED_OUT:
            raise
        try:
            admin.list_topics(timeout=min(timeout_s, _PROBE_S))
        except KafkaException as down:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, (
                f"the committed offsets could not be read: the consumer timed out, and no "
                f"broker answered ({describe(down)})"))) from exc
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(tp.topic, tp.partition) for tp in tps])
        try:
            found = admin.list_consumer_group_offsets(
                [request], require_stable=True, request_timeout=timeout_s)[group].result(
                    timeout=timeout_s + 1)
        except (KafkaException, TimeoutError) as again:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, (
                f"the committed offsets could not be read: the consumer timed out, and "
                f"the admin client said {describe(again)}"))) from exc
        offsets = list(found.topic_partitions or [])
        failed = next((tp for tp in offsets if tp.error is not None), None)
        if failed is not None:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, (
                f"the committed offsets could not be read: the consumer timed out, and "
                f"the broker said {failed.error} for {failed.topic}[{failed.partition}]"))
            ) from exc
        log.info("the consumer timed out reading the committed offsets of %s; read "
                 "through the admin client instead", _partitions_text(tps))
        return offsets


def _partitions_text(tps: list[TopicPartition]) -> str:
    partitions = sorted({tp.partition for tp in tps})
    return "partition " + ", ".join(str(p) for p in partitions)
