"""The worker: one consumer, one transactional producer, and the exactly-once loop, running
a `Topology` (engine/topology.py): the stages and their wiring, the global tables, and
what it is told of the application around them, of which it imports nothing. The cycle
itself (dispatch, handover, timers, retry and give-up, the commit's order) is the
`Executor`'s (engine/executor.py), to which the worker is the Kafka behind its `CycleIO`;
the worker keeps the consumer, rebalancing, fencing, restore and aborts.

Per commit cycle: consume a batch, hand each record to its stage, fire due timers, then
commit — produce the stores' changelog writes, flush, send the consumed offsets with the
group metadata, commit the transaction, and only then write the stores (with the
changelog offsets the broker assigned). This is the Kafka Streams exactly-once v2 design:
a kill -9 at any instant loses and duplicates nothing, because outputs, state and input
progress commit or vanish together.

Any failure aborts the cycle: its store writes are dropped and every partition it read
from goes back to where the cycle began, so each of its records is read again
(docs/decisions/runtime-faults.md):
- a record whose processing fails (a stage raises, or one of its outputs cannot be
  written) is retried once in the replayed cycle; failing again, it is given to its
  stage's `unprocessable` hook (a dead letter with the reason, and the ledger row its
  request needs) instead of `process`, and the partition moves on;
- a broker that is away, or a transaction that fails, aborts the cycle the same way; a
  producer that turns fatal or hangs is replaced (engine/transactions.py); when the
  commit's own outcome is unknown, every task is restored from its changelogs and every
  partition rewound to the offsets the broker has, so nothing is applied twice.

A task is restored from the loop, not in the assignment callback: its partitions stay
paused until its stores have caught up with their changelogs.

A record sent to a stage input that the stage takes handed over (`Node.handed_over`) is
processed with the others its slice of the batch sent, in the order sent, when this
worker owns its partition: the same transaction, no round trip through the broker. One
sent to an input handed over in order (`Node.handed_over_in_order`: a control's, where
order is the point) is, too, but only once the worker has read everything sent to that
partition before it; until then it goes through the topic
(docs/decisions/in-process-handover.md).
"""

from __future__ import annotations

import fcntl
import logging
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sluicegate.config import TRANSACTION_TIMEOUT_MS, Settings
from sluicegate.engine.allocator import give_back_free_memory
from sluicegate.engine.clock import Clock, SystemClock
from sluicegate.engine.executor import Delivered, Executor, HandoverFailed, RecordFailed
from sluicegate.engine.recovery import (
    Restoration,
    RestoreError,
    committed_offsets,
    log_ranges,
)
from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.engine.store import StoreUnwritable, format_bytes, free_bytes
from sluicegate.engine.task import Task
from sluicegate.engine.topology import Topology
from sluicegate.engine.transactions import (
    MAX_BACKOFF_S,
    CallHung,
    Stopping,
    TransactionalProducer,
    describe,
    error_of,
    is_fatal,
    sleep_unless_stopping,
)
from sluicegate.kafkautil import ClientErrors, KafkaUnreachable, require_broker

log = logging.getLogger(__name__)


class CommitMetrics(Protocol):
    """What the worker tells a metrics exporter (`sluicegate worker --metrics-port`):
    each commit, with how long it took, and each aborted transaction."""

    def committed(self, worker: Worker, seconds: float) -> None: ...

    def aborted(self) -> None: ...


# Produce errors that say the record itself cannot be written. Any other Kafka error is
# about the broker or the transaction, and says nothing against the record.
_RECORD_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError._INVALID_ARG, KafkaError.INVALID_MSG,
    KafkaError._BAD_MSG,
})
# Errors no retry can fix: the worker stops with one line saying so.
_CONFIG_ERRORS = frozenset({
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL, KafkaError.INVALID_CONFIG,
})
# How long a record may wait for room in the producer's queue.
_QUEUE_WAIT_S = 30.0
# Within a batch, whether the cycle is due is asked every this many records: a clock read
# per record would cost the passthrough, and 32 gated starts take a few milliseconds.
_SLICE = 32
# How long the ends of the in-order inputs are waited for, and then not asked for again.
_ENDS_TIMEOUT_S = 5.0
# What `_last_trouble` holds while the broker refuses this worker's timestamps.
_CLOCK_REFUSED = "INVALID_TIMESTAMP"
# How often the same restore trouble is said again while it lasts.
_TROUBLE_REPEAT_S = 30.0


# The offsets of a transaction refused for the group membership they carry: the worker
# was away past its session, and its partitions moved.
_FENCED_MEMBER = frozenset({KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                            KafkaError.FENCED_INSTANCE_ID})


def producer_tuning(settings: Settings) -> dict[str, Any]:
    """The transactional producer's settings beside its id (bench.rawpipe's baseline uses
    them too, so the two compare like for like).

    A record is seen by the read_committed readers downstream only once its transaction
    commits, and the commit flushes whatever the producer still holds: lingering up to
    the commit interval costs no visible latency, and batches a cycle's records into
    far fewer, larger requests than a 5 ms linger did at steady arrivals (Kafka Streams
    sets its producers' linger.ms to 100 for the same reason;
    docs/decisions/producer-linger.md)."""
    return {
        "partitioner": "murmur2_random",
        "linger.ms": max(5, settings.commit_interval_ms),
        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        "compression.type": "lz4",
    }


class WorkerError(RuntimeError):
    """The worker cannot go on: a configuration or authorisation problem, said in one line."""


class _Released:
    """Takes the place of a consumer the worker destroyed without a close."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the worker's consumer is closed")


def _report(delivered: Delivered, err: KafkaError | None, msg: Any) -> None:
    if err is None:
        delivered(msg.topic(), msg.partition(), msg.offset())


def _worker_identity(state_dir: Path) -> tuple[str, Any]:
    """A stable id per state directory, and a lock so one process uses it at a time.

    The transactional id and the static group membership derive from it, so a worker
    restarted after a kill -9 fences its predecessor's open transaction at once and takes
    its partitions back without a rebalance.
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
        topology: Topology,
        settings: Settings,
        clock: Clock | None = None,
        leave_on_stop: bool = False,
    ) -> None:
        """`leave_on_stop`: a worker that is not coming back (a scale-down, the old half of
        a rolling upgrade onto new directories) joins as a dynamic member, which leaves the
        group when it stops, so its partitions move at once; by default it is a static
        member, whose partitions wait for it across a restart (docs/operations.md)."""
        self.settings = settings
        self.topology = topology
        self._leave_on_stop = leave_on_stop
        # What aborts a cycle to read it again as it was, and what of it says nothing
        # against the record being processed.
        self._cycle_errors: tuple[type[Exception], ...] = (
            KafkaException, StoreUnwritable, *topology.service_errors)
        self._not_the_records: tuple[type[Exception], ...] = (
            Stopping, CallHung, StoreUnwritable, *topology.service_errors)
        self.clock = clock or SystemClock()
        self.worker_id, self._lock = _worker_identity(settings.state_dir)
        # The cycle: dispatch, handover, timers, poison tracking, the commit's order.
        self.executor = Executor(topology, self, settings.partitions, settings.poison_after,
                                 bool(settings.log_derived))
        # When the ends of the in-order inputs may be asked for again after the broker did
        # not answer.
        self._ends_asked_after = 0.0
        # Tasks that process, and tasks whose stores are being restored (their partitions
        # are paused meanwhile; None: its stores are opened by the next restore step).
        self.tasks: dict[int, Task] = self.executor.tasks
        self._restoring: dict[int, Task | None] = {}
        # The consumer is closing: its rebalance callbacks leave the tasks alone.
        self._closing = False
        # Whether the state directory's disk is known to have no room (said once).
        self._disk_full = False
        self._restore_at = 0.0
        self._restore_backoff = 0.1
        # The restoration under way (one task at a time), the offsets committed on its
        # partitions when it began, and when it began.
        self._restoration: Restoration | None = None
        self._restore_offsets: list[TopicPartition] = []
        self._restore_started = 0.0
        # (topic, partition) -> the offset committed there, for the partitions of the tasks
        # that process: sent again with a cycle that read no record (timers, table rows,
        # a join), so that its transaction is fenced like any other if this worker is no
        # longer the group's member that owns them (docs/decisions/fenced-transactions.md).
        self._committed: dict[tuple[str, int], int] = {}
        self._in_txn = False
        self._commit_asked = False
        self._cycle_started = 0.0
        self._cycle_records = 0
        self._failed_cycles = 0
        # What aborted the last cycles, and the last restore steps, while they keep failing.
        self._last_trouble = ""
        self._last_restore_trouble = ""
        # When the restore trouble began, and when it was last said.
        self._restore_trouble_since = 0.0
        self._restore_trouble_said = 0.0
        # When the consumer last had to be replaced (monotonic seconds).
        self._consumer_fatal: list[float] = []
        self._stop: Callable[[], bool] = lambda: False
        self.processed = 0
        self.commits = 0
        # Set by `sluicegate worker --metrics-port`; counted per commit, not per record.
        self.metrics: CommitMetrics | None = None

        self._clients = ClientErrors(f"worker {self.worker_id}")
        self._txn = TransactionalProducer(settings.client_config(**{
            "transactional.id": f"{settings.namespace}worker-{self.worker_id}",
            **producer_tuning(settings),
            **self._clients.config("producer"),
        }), self._stopping, settings)
        self.consumer = self._new_consumer()
        self.admin = self._new_admin()
        self.restorer = Consumer(settings.client_config(**{
            "group.id": f"{topology.group}-restore",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # A fetch at a changelog's end is held this long by the broker, and the next
            # store's watermark request waits behind it on the connection: at the default
            # (500 ms) every store would cost half a second.
            "fetch.wait.max.ms": 10,
            **self._clients.config("restore consumer"),
        }))

    def _new_admin(self) -> AdminClient:
        return AdminClient(self.settings.client_config(**self._clients.config("admin")))

    def _new_consumer(self) -> Consumer:
        return Consumer(self.settings.client_config(**{
            "group.id": self.topology.group,
            "client.id": f"worker-{self.worker_id}",
            # Static membership: a worker restarted with the same state directory takes
            # its partitions back at once, without a rebalance of the group; a static
            # member never leaves the group when it stops (docs/decisions/
            # runtime-faults.md), so one that is not coming back is a dynamic member.
            **({} if self._leave_on_stop else {
                "group.instance.id": f"{self.settings.namespace}worker-{self.worker_id}"}),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # Range gives a worker the same partition numbers of every input topic.
            "partition.assignment.strategy": "range",
            # A killed worker's partitions move after this long (the broker's minimum).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            # The broker answers a fetch once it holds this much for it, or after
            # fetch.wait.max.ms: at steady arrivals, a fetch every 20 ms per broker rather
            # than one per few records, each answered, decoded and queued by librdkafka on
            # the worker's CPU (docs/decisions/consumer-fetch-batching.md).
            "fetch.min.bytes": 65536,
            "fetch.wait.max.ms": 20,
            # An input topic created after the worker started (a cancelOn event topic)
            # is noticed within seconds, not at the default five minutes.
            "topic.metadata.refresh.interval.ms": 10000,
            **self._clients.config("consumer"),
        }))

    # -- lifecycle -------------------------------------------------------------------

    def _stopping(self) -> bool:
        return self._stop()

    def start(self) -> None:
        """Get ready to process: a broker that is not there yet is waited for, and so are
        the topology's startup steps; a refused login raises KafkaAuthError, another
        configuration problem WorkerError, a step what it raises (a missing topic,
        TopologyError)."""
        # Short timeouts: a broker that is not there is said at once (one line, within
        # seconds), and tried again until it answers.
        self._until_kafka_answers("answer", lambda: require_broker(self.settings, 1.0))
        for step in self.topology.startup:
            self._until_kafka_answers(step.what, step.run)
        for table in self.topology.global_tables:
            self._until_kafka_answers(f"read the {table.name} table", table.catch_up)
        # Joining the group takes a few round trips, done by the client in the background
        # meanwhile: a restarted worker then has its partitions as soon as it is ready.
        self._subscribe()
        self._txn.init()

    def _subscribe(self) -> None:
        self.consumer.subscribe(
            sorted(self.executor.node_for_topic),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _until_kafka_answers(self, what: str, step: Callable[[], object]) -> None:
        backoff = 0.5
        said = False
        while True:
            try:
                step()
                return
            # Anything else (a refused login, a missing topic) no retry fixes: it raises,
            # saying what to do in one line.
            except (KafkaException, KafkaUnreachable, TimeoutError) as exc:
                self._check_config(exc)
                if not said:
                    log.warning("waiting for Kafka at %s to %s: %s", self.settings.bootstrap,
                                what, describe(exc))
                    said = True
            sleep_unless_stopping(backoff, self._stopping)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def run(self, should_stop: Callable[[], bool]) -> None:
        self._stop = should_stop
        try:
            self.start()
            while not should_stop():
                self.run_once()
            self._finish()
        except Stopping:
            log.info("stopped while waiting on Kafka; the open transaction is left to the "
                     "broker to abort")
        finally:
            self.close()

    def _finish(self) -> None:
        """Commit the last cycle, so the partitions' next owner starts after it."""
        if not self._in_txn:
            return
        try:
            self._commit()
        except self._cycle_errors as exc:
            log.warning("the last cycle did not commit (%s): its records are read again by "
                        "the partitions' next owner", describe(exc))

    def close(self) -> None:
        """Give back the partitions and the state directory. Bounded: a broker that is
        away is not waited for (an open transaction is aborted by the broker, or fenced
        by this state directory's next worker)."""
        stopped = self._stop
        self._stop = lambda: True  # nothing below waits on the broker
        # Nothing left open: the last cycle committed, and the stores hold what it wrote.
        synced = not self._in_txn
        try:
            if self._in_txn and not stopped():
                try:
                    self._txn.abort()
                except (KafkaException, Stopping) as exc:
                    log.debug("abort at close: %s", describe(exc))
            # Whatever is open is abandoned: the revocation below must not commit it.
            self._in_txn = False
            self._close_consumer()
        finally:
            self._drop_all(synced)
            if not self._leave_on_stop:
                # The last reference to a static member's client: destroyed now, without a
                # close (see _close_consumer), so it heartbeats no more.
                self.consumer = cast(Consumer, _Released())
            try:
                self.restorer.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("restore consumer close: %s", describe(exc))
            for table in self.topology.global_tables:
                table.close()
            self._txn.close()
            self._lock.close()  # releases the state directory for the next worker

    # -- the loop --------------------------------------------------------------------

    def run_once(self, timeout_s: float = 0.05) -> None:
        if self._restoring and time.monotonic() >= self._restore_at:
            # A restore step fails as a cycle does: aborted, read again, retried.
            try:
                self._restore_step()
            except RecordFailed as failure:
                self._abort(failure, [])
            except HandoverFailed as failure:
                self._abort(failure.cause, [])
            except self._cycle_errors as exc:
                self._cycle_trouble(exc)
                self._abort(exc, [])
        # Wait for one record, then take what is already fetched: consume(n, timeout) alone
        # would hold a lone record for the whole timeout waiting for n of them.
        first = self.consumer.poll(self._wait_s(timeout_s))
        messages = [] if first is None else [
            first, *self.consumer.consume(self.settings.commit_max_records - 1, timeout=0)]
        # The records before this index were committed by a slice of this batch.
        committed = 0
        executor = self.executor
        try:
            for i, msg in enumerate(messages):
                error = msg.error()
                if error is not None:
                    self._consumer_error(error)
                    continue
                self._process(msg)
                if i % _SLICE == _SLICE - 1:
                    if executor.handoffs:
                        executor.hand_over_queued()
                    if self._in_txn and self._cycle_due():
                        # A batch takes as long as its records do: the cycle commits when
                        # it is due, not when the batch is done
                        # (docs/decisions/cycle-slices.md).
                        self._end_cycle()
                        committed = i + 1
            if executor.handoffs:
                executor.hand_over_queued()
            executor.unit = None
            if executor.catching:
                self._caught_up()
            self._end_cycle()
        except RecordFailed as failure:
            executor.suspect(failure)
            self._abort(failure, messages[committed:])
        except HandoverFailed as failure:
            self._abort(failure.cause, messages[committed:])
        except self._cycle_errors as exc:
            # The broker's, a service's (a registry's) or the disk's trouble, not the
            # records': the cycle is aborted and read again (after a backoff, if it keeps
            # failing).
            self._cycle_trouble(exc)
            self._abort(exc, messages[committed:])

    def _cycle_trouble(self, exc: BaseException) -> None:
        """Say what aborts a cycle; the same trouble again is said once."""
        self._check_config(exc)
        if isinstance(exc, StoreUnwritable):
            self._no_room(exc)
            return
        error = error_of(exc)
        if error is not None and error.code() == KafkaError.INVALID_TIMESTAMP:
            self._clock_refused()
            return
        said = describe(exc)
        if error is not None and error.code() in _FENCED_MEMBER:
            # The transaction was refused for the membership it carried (docs/decisions/
            # fenced-transactions.md): said as such, not as the broker's long list.
            said = (f"{error.name()}: the group no longer counts this worker as the owner "
                    f"of its partitions (it was away past its session): what it did since "
                    f"is dropped, and it joins the group again")
        log.log(logging.DEBUG if said == self._last_trouble else logging.WARNING,
                "aborting the cycle after: %s", said)
        self._last_trouble = said

    def _clock_refused(self) -> None:
        """The broker refuses the time this worker's records are stamped with: said in one
        ERROR line, once until a commit goes through again."""
        if self._last_trouble == _CLOCK_REFUSED:
            return
        self._last_trouble = _CLOCK_REFUSED
        now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        log.error("the broker refuses the timestamps of this worker's records "
                  "(INVALID_TIMESTAMP): this machine's clock reads %s, and a topic takes only "
                  "records stamped within its message.timestamp.after.max.ms (1 h by default) "
                  "ahead of the broker's clock and message.timestamp.before.max.ms behind it; "
                  "put the clock right (NTP): no cycle commits until then", now)

    def _no_room(self, exc: StoreUnwritable) -> None:
        """The state directory's disk has no room: said in one ERROR line, once until a
        commit goes through again."""
        if self._disk_full:
            log.debug("still no room: %s", exc)
            return
        self._disk_full = True
        state_dir = self.settings.state_dir
        log.error("the state directory %s has no room (%s free): %s; no cycle commits "
                  "until there is, and the stores are rebuilt from their logs then",
                  state_dir, format_bytes(free_bytes(state_dir)), exc.reason)

    def _wait_s(self, most_s: float) -> float:
        """How long the loop may wait for a record: `most_s`, or until the open cycle is
        due if that is sooner. A cycle commits when it is due, not a poll's timeout later:
        every record in it waits for that commit (docs/decisions/cycle-slices.md)."""
        if not self._in_txn:
            return most_s
        due = self._cycle_started + self.settings.commit_interval_ms / 1000
        return min(most_s, max(0.0, due - time.monotonic()))

    def _end_cycle(self) -> None:
        """What the cycle does before it may commit: the global tables' changed rows, due
        timers; then the commit if it is due."""
        self.executor.apply_tables()
        self._cycle_records += self.executor.fire_timers(self.clock.now_ms())
        if self._in_txn and self._cycle_due():
            self._commit()

    def _consumer_error(self, error: KafkaError) -> None:
        if error.code() in _CONFIG_ERRORS:
            raise WorkerError(f"the consumer cannot go on: {error.name()}: {error.str()}")
        if error.fatal() or error.code() == KafkaError._FATAL:
            self._replace_consumer(error)
            return
        log.debug("consumer: %s", error)

    def _replace_consumer(self, error: KafkaError) -> None:
        """A consumer in a fatal state (librdkafka fences a static member by its own
        rejoin after a broker restart) is replaced by a new one with the same
        group.instance.id, which joins the group again and takes its partitions back. The
        cycle is aborted and the tasks closed: they are restored once reassigned."""
        now = time.monotonic()
        self._consumer_fatal = [t for t in self._consumer_fatal if now - t < 300] + [now]
        if len(self._consumer_fatal) > 3:
            raise WorkerError(
                f"the consumer was fenced {len(self._consumer_fatal)} times in 5 minutes "
                f"({error.str()}): does another worker use a copy of this state directory "
                f"({self.settings.state_dir}, worker id {self.worker_id})?")
        log.warning("the consumer cannot go on (%s): replacing it (same group.instance.id)",
                    error.str())
        if self._in_txn:
            self._abort(KafkaException(KafkaError(KafkaError._STATE, "consumer replaced")), [])
        self._drop_all()
        old, self.consumer = self.consumer, self._new_consumer()
        try:
            old.close()  # its callbacks see it is no longer this worker's consumer
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing the replaced consumer: %s", describe(exc))
        self._subscribe()

    def begin_transaction(self) -> None:
        if not self._in_txn:
            self._txn.begin()
            self._in_txn = True
            self._commit_asked = False
            self._cycle_started = time.monotonic()
            self._cycle_records = 0

    def _cycle_due(self) -> bool:
        elapsed_ms = (time.monotonic() - self._cycle_started) * 1000
        return (elapsed_ms >= self.settings.commit_interval_ms
                or self._cycle_records >= self.settings.commit_max_records)

    def _process(self, msg: Any) -> None:
        partition = msg.partition()
        task = self.tasks.get(partition)
        if task is None:
            if partition in self._restoring:
                # Fetched before its partition was paused: read it again once restored.
                self._seek(TopicPartition(msg.topic(), partition, msg.offset()))
            return  # else: a record of a partition revoked within this batch
        if not self._in_txn:
            self.begin_transaction()
        self.executor.process(task, InputRecord(msg.topic(), partition, msg.offset(), msg.key(),
                                                msg.value(), msg.timestamp()[1], msg.headers()))
        self._cycle_records += 1
        self.processed += 1

    def about_the_record(self, exc: BaseException) -> bool:
        """Whether a failure while processing a record is the record's (retry it, then give
        up on it) rather than the broker's or a service's (retry the cycle as it was)."""
        if isinstance(exc, self._not_the_records):
            return False
        if isinstance(exc, KafkaException):
            error = error_of(exc)
            return error is not None and error.code() in _RECORD_ERRORS
        return True

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                partition: int | None, headers: Headers | None,
                delivered: Delivered | None = None) -> None:
        """Write a record in the open transaction, waiting for room in the producer's
        queue (`delivered`: told its offset once the broker has it)."""
        producer = self._txn.producer
        deadline = None
        while True:
            try:
                if delivered is not None:
                    assert partition is not None
                    if headers is None:
                        producer.produce(topic, value, key, partition,
                                         on_delivery=partial(_report, delivered))
                    else:
                        producer.produce(topic, value, key, partition, headers=headers,
                                         on_delivery=partial(_report, delivered))
                elif headers is not None:
                    # -1: librdkafka's "unassigned", so the partitioner picks.
                    producer.produce(topic, value, key, -1 if partition is None else partition,
                                     headers=headers)
                elif partition is None:
                    producer.produce(topic, value, key)
                else:
                    producer.produce(topic, value, key, partition)
                return
            except BufferError:
                deadline = self._wait_for_room(deadline)

    @property
    def caught_up(self) -> bool:
        """Whether every partition this worker owns is processing, and every in-order
        input it owns is handed over (or goes through its topic only)."""
        return bool(self.tasks) and not self._restoring and not self.executor.catching

    def _caught_up(self) -> None:
        """After a batch: the in-order inputs whose consumer has now read past everything
        sent to them before are handed over from here on (`Executor.release`). Only after
        the whole batch, since a consumer's position counts what it returned, processed
        or not."""
        catching = self.executor.catching
        if not self._restoring and any(c.target is None for c in catching.values()):
            self._learn_ends()
        waiting = [TopicPartition(topic, p) for (topic, p), c in catching.items()
                   if c.target is not None]
        if waiting:
            self.executor.release({(tp.topic, tp.partition): tp.offset
                                   for tp in self.consumer.position(waiting)})

    def _learn_ends(self) -> None:
        """No task is left restoring: each catching partition's end is its high watermark
        now, below which is whatever the joined tasks' inputs' previous owners wrote (the
        consumer reads past it once their transactions have ended, committed or not; the
        last stable offset could still be short of one that committed); asked for all at
        once. Where the broker does not answer, asked again a few seconds later, the
        records meanwhile going through the topics at each commit."""
        if time.monotonic() < self._ends_asked_after:
            return
        catching = self.executor.catching
        unknown = [TopicPartition(topic, p) for (topic, p), c in catching.items()
                   if c.target is None]
        try:
            ranges = log_ranges(self.admin, unknown, _ENDS_TIMEOUT_S)
        except (KafkaException, TimeoutError) as exc:
            log.info("the ends of the stage topics taken in order are not known yet (%s): "
                     "their records go through the topics, asking again in %.0fs",
                     describe(exc), _ENDS_TIMEOUT_S)
            self._ends_asked_after = time.monotonic() + _ENDS_TIMEOUT_S
            return
        for tp, (low, end) in ranges.items():
            # -1: nothing was ever there, or nothing is left; nothing to read first.
            catching[tp].target = -1 if end <= low else end

    def _wait_for_room(self, deadline: float | None) -> float:
        """The producer's queue is full: serve deliveries for a moment, and give up (the
        cycle aborts) when there has been no room for a while: the broker is away."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + _QUEUE_WAIT_S
        elif now > deadline:
            raise KafkaException(KafkaError(
                KafkaError._QUEUE_FULL, f"no room in the producer's queue for "
                f"{_QUEUE_WAIT_S:.0f}s: {len(self._txn.producer)} records wait for the broker"))
        if self._stopping():
            raise Stopping("produce")
        self._txn.producer.poll(0.05)
        return deadline

    # -- commit, abort, recover ------------------------------------------------------

    def _commit(self) -> None:
        started = time.monotonic()
        on_disk = self.settings.state_backend != "memory"
        free = free_bytes(self.settings.state_dir) if on_disk else 0
        if on_disk and free < self.settings.min_free_bytes:
            # Never commit what the stores may not be able to write.
            raise StoreUnwritable(self.settings.state_dir, f"less than "
                                  f"{format_bytes(self.settings.min_free_bytes)} free")
        self.executor.commit()
        if self.metrics is not None:
            self.metrics.committed(self, time.monotonic() - started)

    def produce_log(self, topic: str, partition: int,
                    rows: list[tuple[bytes, bytes | None]], delivered: Delivered) -> None:
        produce = self._txn.producer.produce
        last = len(rows) - 1
        for i, (key, value) in enumerate(rows):
            deadline = None
            while True:
                try:
                    if i == last:
                        # Delivered in order within a partition: the last record's offset
                        # is the one the store records.
                        produce(topic, value, key, partition,
                                on_delivery=partial(_report, delivered))
                    else:
                        produce(topic, value, key, partition)
                    break
                except BufferError:
                    deadline = self._wait_for_room(deadline)

    def commit_transaction(self, consumed: dict[tuple[str, int], int]) -> None:
        offsets = [TopicPartition(t, p, o) for (t, p), o in (consumed or self._fence()).items()]
        self._txn.commit(offsets, self.consumer.consumer_group_metadata(), self._asked)
        self._in_txn = False
        self._committed.update(consumed)
        if self._failed_cycles:
            log.info("committing again after %d aborted cycles", self._failed_cycles)
            self._failed_cycles = 0
            self._last_trouble = ""
        if self._disk_full:
            log.info("the state directory %s has room again (%s free): committing",
                     self.settings.state_dir, format_bytes(free_bytes(self.settings.state_dir)))
            self._disk_full = False
        self.commits += 1
        self._clients.reached()

    def stores_behind(self, exc: StoreUnwritable) -> None:
        """A store could not write what committed (no room on its disk): every task is
        rebuilt from its logs, from stores opened anew (RocksDB refuses every write after
        a failed flush)."""
        self._no_room(exc)
        self._restore_all(reopen=True)

    def _asked(self) -> None:
        self._commit_asked = True

    def _fence(self) -> dict[tuple[str, int], int]:
        """For a cycle that read no record: the offsets already committed on the partitions
        of the tasks that process, committed again. A transaction that carries no offsets
        carries no group generation either, and the broker would commit it even if this
        worker had been frozen past its session and its partitions had moved: the timers
        it fires on waking would admit again what their new owner admitted."""
        tasks = self.tasks
        return {tp: offset for tp, offset in self._committed.items() if tp[1] in tasks}

    def _abort(self, cause: BaseException, batch: list[Any]) -> None:
        """Undo the cycle: drop its store writes, end its transaction, and go back to where
        it began, so that every record it read (and every record of `batch` it did not get
        to) is read again. When the commit was asked for, whether it happened is unknown
        until the broker answers: every task is then restored from its logs and rewound
        to the offsets the broker has."""
        if self.metrics is not None:
            self.metrics.aborted()
        self._failed_cycles += 1
        # Whether the broker may have committed it after all.
        uncertain = self._commit_asked
        began = self._in_txn
        self._in_txn = False
        self._commit_asked = False
        targets = dict(self.executor.discard())
        for msg in batch:
            if msg.error() is None:
                targets.setdefault((msg.topic(), msg.partition()), msg.offset())
        for (topic, partition), offset in targets.items():
            if partition in self.tasks or partition in self._restoring:
                self._seek(TopicPartition(topic, partition, offset))
        # A producer replaced here aborts nothing itself: its successor's init fences it,
        # and the broker aborts what it left open, which was never asked to commit. With
        # no transaction begun (its begin failed, as a partition joined) there is nothing
        # to abort, only a fatal producer to replace.
        if began or is_fatal(cause):
            self._txn.abort(cause)
        if uncertain:
            self._restore_all()
        if self._failed_cycles > 1:
            # The same trouble again: do not spin on it.
            sleep_unless_stopping(min(0.1 * 2 ** (self._failed_cycles - 2), MAX_BACKOFF_S),
                                  self._stopping)

    def _seek(self, tp: TopicPartition) -> None:
        try:
            self.consumer.seek(tp)
        except KafkaException as exc:
            # Not assigned any more (a rebalance is under way): its next owner starts at
            # the committed offset anyway.
            log.debug("seek %s[%d] to %d: %s", tp.topic, tp.partition, tp.offset, describe(exc))

    def _check_config(self, exc: BaseException) -> None:
        error = error_of(exc)
        if error is not None and error.code() in _CONFIG_ERRORS:
            raise WorkerError(f"Kafka refused this worker: {error.name()}: {error.str()}")

    # -- restore ---------------------------------------------------------------------

    def _restore_all(self, reopen: bool = False) -> None:
        """Every task goes back through restore: its stores catch up with their logs and
        its partitions are rewound to the offsets the broker has. `reopen`: its stores are
        closed and opened anew first."""
        for partition in list(self.tasks):
            task = self.tasks.pop(partition)
            self._restoring[partition] = task
            if reopen:
                self._reopen(partition)
        self.executor.forget_in_order(set(self._restoring))
        self.consumer.pause([tp for tp in self.consumer.assignment()
                             if tp.partition in self._restoring])
        self._restore_at = 0.0

    def _restore_step(self) -> None:
        """Take the restoration of the next paused task a step further (begun if none
        is under way); once its stores are at the ends of their logs, the task joins the
        ones that process. A broker that does not answer is tried again later, with the
        task still paused."""
        if self._restoration is None:
            partition = min(self._restoring)
            tps = [tp for tp in self.consumer.assignment() if tp.partition == partition]
            try:
                # Opened here, not in the assignment callback: a store that cannot be
                # opened is said, and tried again, without leaving the loop.
                opening = self._restoring[partition]
                if opening is None:
                    opening = self._restoring[partition] = self._new_task(partition)
                # The committed offsets first: reading them waits for a transaction still
                # writing offsets on these partitions (their previous owner's) to end.
                committed = committed_offsets(self.consumer, self.admin,
                                              self.topology.group, tps)
                self._restoration = Restoration(opening, self.restorer, self.admin,
                                                self._stopping)
            except (KafkaException, RestoreError, StoreUnwritable) as exc:
                self._restore_failed(partition, exc)
                return
            self._restore_offsets = committed
            self._restore_started = time.monotonic()
        restoration = self._restoration
        task = restoration.task
        # Alone, a restoration goes at full speed; beside tasks that process, a step at a
        # time, so their records are not held up for a long log's whole replay.
        budget = (self.settings.restore_step_ms if self.tasks
                  else self.settings.restore_alone_ms) / 1000
        try:
            done = restoration.step(budget)
        except (KafkaException, RestoreError, StoreUnwritable) as exc:
            self._restoration = None
            self._restore_failed(task.partition, exc)
            return
        if not done:
            return
        self._restoration = None
        self._restore_backoff = 0.1
        partition = task.partition
        del self._restoring[partition]
        self.tasks[partition] = task
        for key in [key for key in self._committed if key[1] == partition]:
            del self._committed[key]
        for tp in self._restore_offsets:
            if tp.offset >= 0:
                self._committed[(tp.topic, tp.partition)] = tp.offset
            # No offset committed yet: from the start, as auto.offset.reset says.
            offset = tp.offset if tp.offset >= 0 else -2
            self._seek(TopicPartition(tp.topic, tp.partition, offset))
        self.consumer.resume([tp for tp in self.consumer.assignment()
                              if tp.partition == partition])
        self.executor.join_in_order(partition, {tp.topic: tp.offset
                                                for tp in self._restore_offsets})
        self._last_restore_trouble = ""
        try:
            self.executor.join(task)
        except BaseException:
            # Failed like a cycle (the caller aborts it): the task joins again, its
            # stores already restored, once the abort has rewound what the cycle read.
            task.discard()
            del self.tasks[partition]
            self._restoring[partition] = task
            self.executor.forget_in_order({partition})
            self.consumer.pause([tp for tp in self.consumer.assignment()
                                 if tp.partition == partition])
            raise
        log.info("partition %d ready, %d changelog records replayed in %.2fs", partition,
                 restoration.replayed, time.monotonic() - self._restore_started)
        if not self._restoring:
            # Every partition restored: what the restores freed goes back to the system.
            give_back_free_memory()

    def _new_task(self, partition: int) -> Task:
        return Task(partition, self.topology, self.settings.state_dir, self.executor.send,
                    self.clock.now_ms, self.settings.max_record_bytes,
                    monotonic=self.clock.monotonic_ms, backend=self.settings.state_backend,
                    log_derived=bool(self.settings.log_derived))

    def _reopen(self, partition: int) -> None:
        """A restoring task's stores are closed (what they could not write is in their
        logs) and opened anew by the next restore step."""
        task = self._restoring.get(partition)
        self._restoring[partition] = None
        if task is None:
            return
        if self._restoration is not None and self._restoration.task is task:
            self._restoration.abandon()
            self._restoration = None
        try:
            task.close()
        except StoreUnwritable as exc:
            log.debug("closing partition %d's stores: %s", partition, exc)

    def _restore_failed(self, partition: int, exc: BaseException) -> None:
        self._check_config(exc)
        if isinstance(exc, StoreUnwritable):
            self._no_room(exc)
            self._reopen(partition)
        else:
            said = describe(exc)
            now = time.monotonic()
            # The same trouble again is said once, and again every half minute it lasts: a
            # partition that cannot be restored is not left silent.
            again = said == self._last_restore_trouble
            quiet = again and now - self._restore_trouble_said < _TROUBLE_REPEAT_S
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "restoring partition %d: %s; trying again%s", partition, said,
                    " (still, since %.0fs ago)" % (now - self._restore_trouble_since)
                    if again and not quiet else "")
            if not again:
                self._restore_trouble_since = now
            if not quiet:
                self._restore_trouble_said = now
            self._last_restore_trouble = said
        # The admin client keeps the leader epochs it saw before a broker restart and does
        # not refresh them when the broker refuses them (FENCED_LEADER_EPOCH): a new one
        # asks afresh.
        self.admin = self._new_admin()
        self._restore_at = time.monotonic() + self._restore_backoff
        self._restore_backoff = min(self._restore_backoff * 2, MAX_BACKOFF_S)

    def _stop_restoring(self, partitions: set[int]) -> None:
        """A restoration under way for one of `partitions` (revoked, lost) stops."""
        if self._restoration is not None and self._restoration.task.partition in partitions:
            self._restoration.abandon()
            self._restoration = None

    def _close_consumer(self) -> None:
        """Close the consumer of a worker that leaves its group (`leave_on_stop`), which
        says so to the group on its way out. A static member's is not closed: closing
        tells its group nothing (its membership runs out with its session, or its next
        start takes it back), and a group join that completes as the worker stops hands
        the close an assignment whose `assign` then waits for ever, holding the
        interpreter (confluentinc/librdkafka#4884; a worker told to stop as it joined
        never exited). Its client is destroyed without a close when the worker goes. The
        rebalance callbacks a close runs leave the tasks alone (`_closing`): they are
        closed after it. (Verified by looping a SIGTERM at the worker's first line: 1 hang
        in 9 before, none in 25 after.)"""
        self._closing = True
        if not self._leave_on_stop:
            return
        try:
            self.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("consumer close: %s", describe(exc))

    # -- rebalance -------------------------------------------------------------------

    def _partitions(self, tps: list[TopicPartition]) -> set[int]:
        return {tp.partition for tp in tps}

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        consumer.assign(tps)
        if consumer is not self.consumer or self._closing:
            return  # a replaced consumer's last word, or the closing one's
        new = sorted(self._partitions(tps) - set(self.tasks) - set(self._restoring))
        log.info("assigned partitions %s", sorted(self._partitions(tps)))
        if new:
            self.executor.hold_in_order()
        for partition in new:
            self._restoring[partition] = None
        consumer.pause([tp for tp in tps if tp.partition in self._restoring])
        self._restore_at = 0.0

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if consumer is not self.consumer or self._closing:
            return
        log.info("partitions %s revoked", sorted(self._partitions(tps)))
        # Commit what is done so the next owner starts exactly where this one stopped.
        synced = True
        if self._in_txn:
            try:
                self._commit()
            except self._cycle_errors as exc:
                log.warning("commit on revoke failed, aborting: %s", describe(exc))
                self._abort(exc, [])
                synced = False
        self._drop(tps, synced)

    def _on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if consumer is not self.consumer or self._closing:
            return
        log.warning("partitions %s lost (this worker's group membership ended)",
                    sorted(self._partitions(tps)))
        if self._in_txn:
            try:
                self._abort(KafkaException(KafkaError(KafkaError._STATE, "partitions lost")),
                            [])
            except KafkaException as exc:
                log.warning("abort after losing partitions failed: %s", describe(exc))
        self._drop(tps)

    def _drop_all(self, synced: bool = False) -> None:
        """Close every task. `synced`: the tasks that process committed all they did, so
        their stores are in step with their logs as of now (docs/decisions/
        stale-stores.md); not said of a task still restoring, nor after losing partitions
        another worker may have written to since."""
        self._stop_restoring(set(self._restoring))
        for task in self.tasks.values():
            self._close(task, synced)
        for restoring in self._restoring.values():
            if restoring is not None:
                self._close(restoring, False)
        self.tasks.clear()
        self._restoring.clear()
        executor = self.executor
        self.executor.forget_in_order({tp[1] for tp in (
            *executor.drained, *executor.catching, *executor.topic_only, *executor.joined_at)})

    def _drop(self, tps: list[TopicPartition], synced: bool = False) -> None:
        self._stop_restoring(self._partitions(tps))
        self.executor.forget_in_order(self._partitions(tps))
        for partition in self._partitions(tps):
            task = self.tasks.pop(partition, None)
            if task is not None:
                self._close(task, synced)
            else:
                restoring = self._restoring.pop(partition, None)
                if restoring is not None:
                    self._close(restoring, False)

    def _close(self, task: Task, synced: bool) -> None:
        """Close a task's stores; a disk with no room for their last flush is said (what
        they could not write is in their logs, replayed when the partition is restored)."""
        try:
            task.close(synced)
        except StoreUnwritable as exc:
            self._no_room(exc)

