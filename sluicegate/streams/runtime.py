"""The worker: one consumer, one transactional producer, and the exactly-once loop.

Per commit cycle: consume a batch, hand each record to its stage, fire due timers, then
commit — produce the stores' changelog writes, flush, send the consumed offsets with the
group metadata, commit the transaction, and only then write the stores (with the
changelog offsets the broker assigned). Any failure aborts the transaction, drops the
cycle's store writes and rewinds the consumer to the committed offsets. This is the
Kafka Streams exactly-once v2 design: a kill -9 at any instant loses and duplicates
nothing, because outputs, state and input progress commit or vanish together.

A record sent to a stage input that the stage takes handed over (`Stage.handed_over`) is
processed on the spot when this worker owns its partition: the same transaction, no
round trip through the broker (docs/decisions/in-process-handover.md).
"""

from __future__ import annotations

import fcntl
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.kafkautil import check_access
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.registry import RegistryError, configure_codec
from sluicegate.streams.clock import Clock, SystemClock
from sluicegate.streams.control import ControlTable
from sluicegate.streams.decisions import dead_letter
from sluicegate.streams.recovery import restore_task
from sluicegate.streams.stage import Headers, InputRecord, Stage
from sluicegate.streams.task import StageState, Task
from sluicegate.topology.admin import require_topics
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.ops.metrics import WorkerMetrics

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    pass


def _worker_identity(state_dir: Path) -> tuple[str, Any]:
    """A stable id per state directory, and a lock so one process uses it at a time.

    The transactional id derives from it, so a worker restarted after a kill -9 fences
    its predecessor's open transaction at once instead of waiting for it to time out.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = open(state_dir / "worker.lock", "w")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise WorkerError(f"state directory {state_dir} is in use by another worker") from exc
    id_file = state_dir / "worker.id"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    return id_file.read_text().strip(), lock


class Worker:
    def __init__(
        self,
        stages: list[Stage],
        settings: Settings,
        clock: Clock | None = None,
        control: ControlTable | None = None,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings)
        self.stages = stages
        self.control = control
        self.clock = clock or SystemClock()
        self.worker_id, self._lock = _worker_identity(settings.state_dir)
        self.stage_for_topic: dict[str, Stage] = {
            topic: stage for stage in stages for topic in stage.inputs(self.topics)
        }
        self._handed_over: dict[str, Stage] = {
            topic: stage for stage in stages for topic in stage.handed_over(self.topics)
        }
        self.tasks: dict[int, Task] = {}
        # (topic, partition) -> next offset to commit, for records processed this cycle
        self._progress: dict[tuple[str, int], int] = {}
        # (topic, partition) -> the offset of the last record of a store's log this cycle
        self._log_offsets: dict[tuple[str, int], int] = {}
        self._in_txn = False
        self._cycle_started = 0.0
        self._cycle_records = 0
        self.processed = 0
        self.commits = 0
        # Set by `sluicegate worker --metrics-port`; counted per commit, not per record.
        self.metrics: WorkerMetrics | None = None

        self.producer = Producer(settings.client_config(**{
            "transactional.id": f"{settings.namespace}worker-{self.worker_id}",
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "transaction.timeout.ms": 15000,
            "compression.type": "lz4",
        }))
        self.consumer = Consumer(settings.client_config(**{
            "group.id": self.topics.group,
            "client.id": f"worker-{self.worker_id}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # Range gives a worker the same partition numbers of every input topic.
            "partition.assignment.strategy": "range",
            # A killed worker's partitions move after this long (the broker's minimum).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "fetch.wait.max.ms": 20,
            # An input topic created after the worker started (a cancelOn event topic)
            # is noticed within seconds, not at the default five minutes.
            "topic.metadata.refresh.interval.ms": 10000,
        }))
        self.restorer = Consumer(settings.client_config(**{
            "group.id": f"{self.topics.group}-restore",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # A fetch at a changelog's end is held this long by the broker, and the next
            # store's watermark request waits behind it on the connection: at the default
            # (500 ms) every store would cost half a second.
            "fetch.wait.max.ms": 10,
        }))

    @classmethod
    def for_app(cls, app: App, settings: Settings, clock: Clock | None = None) -> Worker:
        """A worker running every stage for `app`'s declarations."""
        from sluicegate.streams.app import build_pipeline

        pipeline = build_pipeline(app, settings)
        return cls(pipeline.stages, settings, clock=clock, control=pipeline.control)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        check_access(self.settings)
        require_topics(self.settings)
        configure_codec(self.settings)
        if self.control is not None:
            self.control.catch_up()
        self.producer.init_transactions(30.0)
        self.consumer.subscribe(
            sorted(self.stage_for_topic),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def run(self, should_stop: Callable[[], bool]) -> None:
        try:
            self.start()
            while not should_stop():
                self.run_once()
            if self._in_txn:
                self._commit()
        finally:
            self.close()

    def close(self) -> None:
        try:
            if self._in_txn:
                self._abort()
            self.consumer.close()
        finally:
            for task in self.tasks.values():
                task.close()
            self.tasks.clear()
            self.restorer.close()
            if self.control is not None:
                self.control.close()
            self.producer.flush(5.0)
            self._lock.close()  # releases the state directory for the next worker

    # -- the loop --------------------------------------------------------------------

    def run_once(self, timeout_s: float = 0.05) -> None:
        # Wait for one record, then take what is already fetched: consume(n, timeout) alone
        # would hold a lone record for the whole timeout waiting for n of them.
        first = self.consumer.poll(timeout_s)
        messages = [] if first is None else [
            first, *self.consumer.consume(self.settings.commit_max_records - 1, timeout=0)]
        try:
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    log.warning("consumer: %s", error)
                    continue
                self._process(msg)
            self._apply_control()
            self._fire_timers()
            if self._in_txn and self._cycle_due():
                self._commit()
        except KafkaException as exc:
            self._recover(exc)

    def _begin(self) -> None:
        if not self._in_txn:
            self.producer.begin_transaction()
            self._in_txn = True
            self._cycle_started = time.monotonic()
            self._cycle_records = 0

    def _cycle_due(self) -> bool:
        elapsed_ms = (time.monotonic() - self._cycle_started) * 1000
        return (elapsed_ms >= self.settings.commit_interval_ms
                or self._cycle_records >= self.settings.commit_max_records)

    def _process(self, msg: Any) -> None:
        partition = msg.partition()
        task = self.tasks.get(partition)
        if task is None:  # a record of a partition revoked within this batch
            return
        if not self._in_txn:
            self._begin()
        topic, offset = msg.topic(), msg.offset()
        self._handle(self.stage_for_topic[topic], task, InputRecord(
            topic, partition, offset, msg.key(), msg.value(), msg.timestamp()[1],
            msg.headers()))
        self._progress[(topic, partition)] = offset + 1
        self._cycle_records += 1
        self.processed += 1

    def _handle(self, stage: Stage, task: Task, record: InputRecord) -> None:
        ctx = task.states[stage.name].ctx
        try:
            stage.process(ctx, record)
        except (KafkaException, RegistryError):
            # A registry that does not answer says nothing about the record: stop (the
            # transaction aborts, nothing is committed) rather than dead-letter it.
            raise
        except Exception as exc:
            log.exception("stage %s failed on %s[%d]@%d", stage.name, record.topic,
                          record.partition, record.offset)
            dead_letter(ctx, record, f"{stage.name} failed: {type(exc).__name__}: {exc}")

    def _apply_control(self) -> None:
        if self.control is None:
            return
        for row in self.control.poll():
            self._begin()
            for task in self.tasks.values():
                for state in task.states.values():
                    state.stage.control_changed(state.ctx, row)

    def _fire_timers(self) -> None:
        now = self.clock.now_ms()
        for task in self.tasks.values():
            for state in task.stateful():
                timers = state.timers
                assert timers is not None
                next_due = timers.next_due
                if next_due is None or next_due > now:
                    continue
                self._begin()
                for due_ms, key, value in timers.due(now):
                    timers.cancel(due_ms, key)
                    state.stage.fire(state.ctx, due_ms, key, value)
                    self._cycle_records += 1

    def _send(self, topic: str, key: bytes | None, value: bytes | None,
              partition: int | None = None, headers: Headers | None = None,
              message: object | None = None) -> None:
        stage = self._handed_over.get(topic)
        if stage is not None and key is not None:
            p = partition_for(key, self.settings.partitions) if partition is None else partition
            task = self.tasks.get(p)
            if task is not None:
                # Handed over: the stage processes it now, in this transaction; it is
                # never written to its topic, so it has no offset.
                self._handle(stage, task, InputRecord(topic, p, -1, key, value,
                                                      self.clock.now_ms(), headers, message))
                return
        while True:
            try:
                if headers is not None:
                    # -1: librdkafka's "unassigned", so the partitioner picks.
                    self.producer.produce(topic, value, key,
                                          -1 if partition is None else partition,
                                          headers=headers)
                elif partition is None:
                    self.producer.produce(topic, value, key)
                else:
                    self.producer.produce(topic, value, key, partition)
                return
            except BufferError:
                self.producer.poll(0.05)

    # -- commit, abort, recover ------------------------------------------------------

    def _commit(self) -> None:
        started = time.monotonic()
        self._log_offsets.clear()
        for task in self.tasks.values():
            for state in task.stateful():
                assert state.tx is not None
                if state.tx.changes:
                    self._produce_logs(state, task.partition)
        undelivered = self.producer.flush(30.0)
        if undelivered:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            f"{undelivered} records undelivered at commit"))
        consumed = [TopicPartition(t, p, o) for (t, p), o in self._progress.items()]
        if consumed:
            self.producer.send_offsets_to_transaction(
                consumed, self.consumer.consumer_group_metadata(), 30.0)
        self.producer.commit_transaction(30.0)
        self._in_txn = False
        self._progress.clear()
        self.commits += 1
        # The transaction is durable; the stores now catch up, each with the offsets of
        # its last records in its logs, in one WriteBatch.
        logged = self._log_offsets
        for task in self.tasks.values():
            for state in task.stateful():
                assert state.tx is not None
                if state.tx.changes:
                    p = task.partition
                    state.tx.commit(logged.get((state.changelog, p)), {
                        table.name: logged[(table.topic, p)] for table in state.tables
                        if (table.topic, p) in logged})
        if self.metrics is not None:
            self.metrics.committed(self, time.monotonic() - started)

    def _produce_logs(self, state: StageState, partition: int) -> None:
        """The cycle's store writes of one stage and partition: each row to its log (the
        changelog, or the topic of a table the stage publishes), in that partition."""
        assert state.tx is not None
        logs: dict[str, list[tuple[bytes, bytes | None]]] = {}
        tables = state.tables
        for key, value in state.tx.changes.items():
            topic, log_key = state.changelog, key
            for table in tables:
                if key.startswith(table.prefix):
                    topic, log_key = table.topic, key[len(table.prefix):]
                    break
            logs.setdefault(topic, []).append((log_key, value))
        produce = self.producer.produce
        for topic, rows in logs.items():
            last = len(rows) - 1
            for i, (key, value) in enumerate(rows):
                while True:
                    try:
                        if i == last:
                            # Delivered in order within a partition: the last record's
                            # offset is the one the store records.
                            produce(topic, value, key, partition, on_delivery=self._delivered)
                        else:
                            produce(topic, value, key, partition)
                        break
                    except BufferError:
                        self.producer.poll(0.05)

    def _delivered(self, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            tp = (msg.topic(), msg.partition())
            if msg.offset() > self._log_offsets.get(tp, -1):
                self._log_offsets[tp] = msg.offset()

    def _abort(self) -> None:
        if self.metrics is not None:
            self.metrics.aborted()
        try:
            self.producer.abort_transaction(30.0)
        finally:
            self._in_txn = False
            for task in self.tasks.values():
                task.discard()
            self._rewind()

    def _rewind(self) -> None:
        """Seek every partition touched this cycle back to its committed offset."""
        touched = [TopicPartition(t, p) for (t, p) in self._progress]
        self._progress.clear()
        if not touched:
            return
        for tp in self.consumer.committed(touched, timeout=30.0):
            offset = tp.offset if tp.offset >= 0 else 0
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, offset))

    def _recover(self, exc: KafkaException) -> None:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.fatal():
            raise WorkerError(f"fatal Kafka error, the worker must restart: {error}") from exc
        log.warning("aborting the cycle after: %s", error)
        if self._in_txn:
            self._abort()

    # -- rebalance -------------------------------------------------------------------

    def _partitions(self, tps: list[TopicPartition]) -> set[int]:
        return {tp.partition for tp in tps}

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        for partition in sorted(self._partitions(tps) - set(self.tasks)):
            task = Task(partition, self.stages, self.topics, self.settings.state_dir,
                        self._send, self.clock.now_ms)
            replayed = restore_task(task, self.restorer, self.topics)
            log.info("partition %d assigned, %d changelog records replayed", partition, replayed)
            self.tasks[partition] = task
            # In a transaction, so a stage can act on what it finds (fail the starts of a
            # workflow that is no longer declared, say).
            self._begin()
            for state in task.stateful():
                state.stage.restored(state.ctx)

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Commit what is done so the next owner starts exactly where this one stopped.
        if self._in_txn:
            try:
                self._commit()
            except KafkaException as exc:
                log.warning("commit on revoke failed, aborting: %s", exc)
                self._abort()
        for partition in self._partitions(tps):
            task = self.tasks.pop(partition, None)
            if task is not None:
                task.close()

    def _on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if self._in_txn:
            try:
                self._abort()
            except KafkaException as exc:
                log.warning("abort after losing partitions failed: %s", exc)
        for partition in self._partitions(tps):
            task = self.tasks.pop(partition, None)
            if task is not None:
                task.close()

