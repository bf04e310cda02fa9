"""Restoring a task's stores from their changelogs, on the real broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from sluicegate.config import Settings
from sluicegate.engine.recovery import (
    Restoration,
    committed_offsets,
    log_ranges,
    restore_task,
)
from sluicegate.engine.runtime import Worker
from sluicegate.engine.stage import InputRecord, Stage, StageContext
from sluicegate.engine.task import Task
from sluicegate.engine.topology import Node, Topology
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import STATEFUL_STAGES, Topics

pytestmark = pytest.mark.broker

PARTITIONS = (0, 1)


class _Kept(Stage):
    """A store and nothing else: what restore fills."""

    def process(self, ctx: StageContext[None], record: InputRecord) -> None:
        raise AssertionError("a restore processes nothing")


def _kept(settings: Settings, names: tuple[str, ...]) -> Topology:
    """A topology of stages that read nothing and keep a store each, logged to the stage's
    changelog."""
    topics = Topics(settings)
    return Topology(topics.group, tuple(Node(name, _Kept(), (), topics.changelog(name))
                                        for name in names),
                    partitioner=partition_for, dead_letter=_no_dead_letter)


def _no_dead_letter(ctx: StageContext[None], record: InputRecord, reason: str) -> None:
    raise AssertionError("a restore gives up on nothing")


def _write_changelogs(settings: Settings, topics: Topics) -> None:
    """Two committed cycles on every store of two tasks, as the worker writes them: one
    transaction each, so every changelog ends in a transaction marker."""
    producer = Producer(settings.client_config(**{"transactional.id": f"{settings.namespace}t"}))
    producer.init_transactions(30)
    for cycle in ({b"a": b"1", b"b": b"2"}, {b"a": None, b"c": b"3"}):
        producer.begin_transaction()
        for stage in STATEFUL_STAGES:
            for partition in PARTITIONS:
                for key, value in cycle.items():
                    producer.produce(topics.changelog(stage), value, key, partition)
        producer.commit_transaction(30)
    # The commit returns once the coordinator has decided; the markers reach the
    # partitions just after. A worker's restore asks for its committed offsets first
    # (stable only once its last transaction is complete): here, wait for the markers.
    admin = AdminClient(settings.client_config())
    tps = [TopicPartition(topics.changelog(stage), p) for stage in STATEFUL_STAGES
           for p in PARTITIONS]
    deadline = time.monotonic() + 30
    while any(last < 6 for _, last in log_ranges(admin, tps).values()):
        assert time.monotonic() < deadline, "the changelogs' transactions never completed"
        time.sleep(0.05)


def _restore(worker: Worker, settings: Settings) -> tuple[int, float]:
    replayed, started = 0, time.monotonic()
    for partition in PARTITIONS:
        task = Task(partition, worker.topology, settings.state_dir, lambda *a: None,
                    lambda: 0, backend=settings.state_backend)
        try:
            replayed += restore_task(task, worker.restorer, worker.admin)
            for state in task.stateful():
                assert state.store is not None
                assert dict(state.store.items(b"")) == {b"b": b"2", b"c": b"3"}, state.node.name
        finally:
            task.close()
    return replayed, time.monotonic() - started


def test_one_consumer_restores_many_small_stores_without_waiting_on_each(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    _write_changelogs(settings, topics)
    stores = len(STATEFUL_STAGES) * len(PARTITIONS)
    worker = Worker(_kept(settings, STATEFUL_STAGES), settings)
    try:
        replayed, first = _restore(worker, settings)
        # Again on the same state: every store is current but for its changelog's last
        # transaction marker.
        again, second = _restore(worker, settings)
    finally:
        worker.close()

    # Per store: "b" and "c" of the last write, and "a" (its put and its delete in two
    # cycles, replayed from two fetches or one).
    assert stores * 3 <= replayed <= stores * 4
    # A store in memory replays its whole log again; one on disk has it all already.
    assert again == (replayed if settings.state_backend == "memory" else 0)
    # Waiting half a second per store for a batch that never fills, or for the
    # end-of-partition event after an empty fetch, would take at least `stores * 0.5` s.
    assert first < stores * 0.25, f"restoring {stores} stores took {first:.1f}s"
    assert second < stores * 0.25, f"{stores} current stores took {second:.1f}s"


def test_a_long_changelog_is_restored_a_step_at_a_time_and_goes_on_after_a_stop(
        settings: Settings) -> None:
    """A worker restores a task between the records it processes for others: each step
    takes about its budget (at least one fetch). A restoration left half way (its
    partition revoked, the broker gone) goes on from what the store holds."""
    create_topics(settings)
    topics = Topics(settings)
    stage = STATEFUL_STAGES[0]
    n = 6_000  # three fetches' worth at least
    producer = Producer(settings.client_config(**{"transactional.id": f"{settings.namespace}l"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(n):
        producer.produce(topics.changelog(stage), b"v", f"k{i:05d}".encode(), 0)
    producer.commit_transaction(30)
    admin = AdminClient(settings.client_config())
    tp = TopicPartition(topics.changelog(stage), 0)
    deadline = time.monotonic() + 30
    while log_ranges(admin, [tp])[(tp.topic, 0)][1] <= n:
        assert time.monotonic() < deadline, "the transaction never completed"
        time.sleep(0.05)
    worker = Worker(_kept(settings, (stage,)), settings)
    try:
        # A store that keeps what a restoration left half way: RocksDB's.
        task = Task(0, worker.topology, settings.state_dir, lambda *a: None, lambda: 0,
                    backend="rocksdb")
        try:
            # The store was in step with its log (as of the task's clock), which has grown
            # since: a restoration left half way goes on from what the store holds. (A store
            # being rebuilt from nothing starts again: its logs cannot prove that the
            # tombstones past where it stopped are still there; docs/decisions/
            # stale-stores.md.)
            (state,) = task.stateful()
            assert state.store is not None
            state.store.write({}, None, synced=True)
            first = Restoration(task, worker.restorer, worker.admin)
            assert not first.step(0.0)  # one fetch: not all of it
            partway = first.replayed
            assert 0 < partway < n
            first.abandon()
            second = Restoration(task, worker.restorer, worker.admin)
            steps = 1
            while not second.step(0.0):
                steps += 1
            assert steps >= 2
            assert partway + second.replayed == n
            assert len(dict(state.store.items(b"k"))) == n
        finally:
            task.close()
    finally:
        worker.close()


def _open_transaction(settings: Settings, changelog: str, name: str) -> Producer:
    """A transaction left open with one row (`k` = `1`) on partition 0 of `changelog`."""
    producer = Producer(settings.client_config(
        **{"transactional.id": f"{settings.namespace}{name}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(changelog, b"1", b"k", 0)
    producer.flush(30)
    return producer


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_a_restore_reads_past_a_transaction_that_is_still_ending(settings: Settings,
                                                                 outcome: str) -> None:
    """A transaction whose records are on a changelog but whose end is not (still open,
    or committed with its marker still to come): the restore waits for it, and replays its
    rows if it committed, not if it aborted. Stopping at the last stable offset, it was
    done at once without them, and a commit that had happened was lost from the store
    while its offsets said its records were processed."""
    create_topics(settings)
    topics = Topics(settings)
    stage = STATEFUL_STAGES[0]
    producer = _open_transaction(settings, topics.changelog(stage), "o")
    worker = Worker(_kept(settings, (stage,)), settings)
    task = Task(0, worker.topology, settings.state_dir, lambda *a: None, lambda: 0,
                backend=settings.state_backend)
    try:
        restoration = Restoration(task, worker.restorer, worker.admin)
        for _ in range(5):
            assert not restoration.step(0.05), "done before the transaction ended"
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        deadline = time.monotonic() + 30
        while not restoration.step(0.1):
            assert time.monotonic() < deadline, "the restore did not end with the transaction"
        store = task.states[stage].store
        assert store is not None
        assert dict(store.items(b"")) == ({b"k": b"1"} if outcome == "commit" else {})
    finally:
        task.close()
        worker.close()


class _TimesOut:
    """A consumer that times out reading committed offsets, as one was seen to for
    minutes after it was fenced and replaced while the broker had the offsets."""

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed "
                                                               "offsets: Local: Timed out"))


def test_committed_offsets_are_read_through_the_admin_client_when_the_consumer_times_out(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    group = f"{settings.namespace}g"
    tps = [TopicPartition(topics.starts, p) for p in PARTITIONS]
    member = Consumer(settings.client_config(**{"group.id": group}))
    producer = Producer(settings.client_config(**{"transactional.id": f"{settings.namespace}c"}))
    admin = AdminClient(settings.client_config())
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition(tp.topic, tp.partition, 7)
                                              for tp in tps],
                                             member.consumer_group_metadata(), 30)
        # Offsets still being written by an open transaction: not stable, so not given,
        # and the error says what the admin client was told.
        with pytest.raises(KafkaException, match="the consumer timed out, and the"):
            committed_offsets(_TimesOut(), admin, group, tps, timeout_s=3.0)  # type: ignore[arg-type]
        producer.commit_transaction(30)
        deadline = time.monotonic() + 30
        while True:
            try:
                found = committed_offsets(_TimesOut(), admin, group, tps,  # type: ignore[arg-type]
                                          timeout_s=3.0)
                break
            except KafkaException:
                # The commit's marker may reach the offsets a moment after the commit.
                assert time.monotonic() < deadline, "the committed offsets never came"
        assert {(tp.topic, tp.partition, tp.offset) for tp in found} == {
            (tp.topic, tp.partition, 7) for tp in tps}
    finally:
        member.close()


def test_a_restore_waits_at_a_transaction_still_open_and_says_so(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A transaction still open above a changelog's last stable offset (after a broker
    restart one can outlive the transaction timeout, and one the broker lost track of never
    ends): the restore waits for it rather than go on without what it may commit, says so
    in an ERROR line naming the partition and the offsets once it has waited `settle_s`
    (here shortened to a second), and ends once the transaction does."""
    create_topics(settings)
    topics = Topics(settings)
    stage = STATEFUL_STAGES[0]
    producer = _open_transaction(settings, topics.changelog(stage), "h")
    worker = Worker(_kept(settings, (stage,)), settings)
    task = Task(0, worker.topology, settings.state_dir, lambda *a: None, lambda: 0,
                backend=settings.state_backend)
    open_ = True
    try:
        restoration = Restoration(task, worker.restorer, worker.admin, settle_s=1.0)
        started = time.monotonic()
        said: list[str] = []
        while not any(f"{topics.changelog(stage)}[0]: offsets 0 to 0 belong to a transaction "
                      "still open" in line for line in said):
            assert not restoration.step(0.1), "the restore went on past an open transaction"
            assert time.monotonic() - started < 30, "the restore never said it waits"
            said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert time.monotonic() - started >= 1.0
        assert not restoration.step(0.5), "the restore went on past an open transaction"
        producer.abort_transaction(30)
        open_ = False
        while not restoration.step(0.1):
            assert time.monotonic() - started < 60, "the restore did not end with it"
        store = task.states[stage].store
        assert store is not None
        assert dict(store.items(b"")) == {}
    finally:
        if open_:
            producer.abort_transaction(30)
        task.close()
        worker.close()
