"""A store that comes back to a worker after the log cleaner removed tombstones it never
saw is rebuilt from its logs, not trusted (docs/decisions/stale-stores.md).

The time scale is shortened: the changelogs keep a tombstone for one second
(`delete.retention.ms`), roll a segment a second and clean at once, and the broker's
cleaner looks every second. A workflow of one run at a time per account; its account t0
holds a running start and two queued ones on worker A; worker B then owns the partition,
admits and completes all three (the holder and queue rows become tombstones, which the
cleaner then removes); then A owns the partition again with its old store: in the same
process (it lost the partition and got it back) and after a restart on its kept
directory. Trusting that store, A had a ghost holder for a run that ended long ago: a new
start of t0 stayed queued for ever, and the ghost's queued starts could be admitted a
second time. (The holder of a run admitted in the same task is made from the run's row
rather than logged, docs/decisions/holders-from-run-rows.md: the queue rows are the
tombstones here.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.store import BACKENDS
from sluicegate.schemas.records import Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.faults import app
from tests.faults.harness import APP, MARKS, HoldingEngine, Outcomes, alter_configs
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

HELD = "t0"
WORKFLOW = "oneAtATime"


@contextlib.contextmanager
def tombstones_kept_one_second(settings: Settings) -> Iterator[None]:
    """Every changelog of the namespace keeps a tombstone for a second and is cleaned as
    soon as it can be; the broker's cleaner looks every second (put back afterwards)."""
    admin = AdminClient(settings.client_config())
    topics = Topics(settings)
    changelogs = [t for t in admin.list_topics(timeout=10).topics
                  if t.startswith(topics.changelog(""))]
    assert changelogs, "the namespace has no changelog topics"
    short = {"delete.retention.ms": "1000", "segment.ms": "1000",
             "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "0"}
    for topic in changelogs:
        alter_configs(settings, ConfigResource(ResourceType.TOPIC, topic), dict(short))
    brokers = [str(b) for b in admin.list_topics(timeout=10).brokers]
    for broker in brokers:
        alter_configs(settings, ConfigResource(ResourceType.BROKER, broker),
                      {"log.cleaner.backoff.ms": "1000"})
    try:
        yield
    finally:
        for broker in brokers:
            alter_configs(settings, ConfigResource(ResourceType.BROKER, broker),
                          {"log.cleaner.backoff.ms": None})


def _deleted_and_cleaned(settings: Settings, marker: bytes) -> tuple[set[bytes], set[bytes]]:
    """Of the concurrency changelog's keys that contain `marker` (read from the start,
    read_committed): those whose last record is a tombstone, and all those present."""
    topic = Topics(settings).changelog("concurrency")
    consumer = Consumer(settings.client_config(**{
        "group.id": f"test-changelog-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        last: dict[bytes, bytes | None] = {}
        while True:
            msgs = consumer.consume(5000, timeout=2.0)
            if not msgs:
                break
            eof = False
            for msg in msgs:
                if msg.error() is not None:
                    eof = True
                    continue
                if msg.key() is not None and marker in msg.key():
                    last[msg.key()] = msg.value()
            if eof:
                break
    finally:
        consumer.close()
    deleted = {k for k, v in last.items() if v is None}
    return deleted, set(last)


def _until_cleaned(settings: Settings, client: Client, deleted: set[bytes],
                   timeout_s: float = 150.0) -> None:
    """Until none of `deleted` (keys of t0's rows that were deleted) is left in the
    changelog; fresh starts of other accounts meanwhile roll its segments: two at once per
    account, so the second waits behind the first and its queue row is logged (a start
    admitted at once logs no row of this changelog)."""
    deadline = time.monotonic() + timeout_s
    n = 0
    while True:
        for _ in range(5):
            for twice in range(2):
                client.submit(WORKFLOW, {"account": f"filler{n}", "n": twice})
            n += 1
        client.flush()
        _, present = _deleted_and_cleaned(settings, HELD.encode())
        if not deleted & present:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the log cleaner left {len(deleted & present)} of t0's "
                                 f"deleted rows in the changelog after {timeout_s:.0f}s")
        time.sleep(1.0)


def _worker(settings: Settings, path: Path, worker_id: str) -> WorkerProcess:
    """A worker whose id (and so its place in the range assignor's order) is given."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "worker.id").write_text(worker_id)
    return WorkerProcess(settings, APP, path)


def _park_on(worker: WorkerProcess, client: Client, outcomes: Outcomes) -> list[str]:
    """t0's first start runs (held by the engine), its next two queue behind it."""
    ids = [client.submit(WORKFLOW, {"account": HELD, "n": i}).request_id for i in range(3)]
    client.flush()
    outcomes.ledger.until(lambda rows: {(r.request_id, r.outcome) for r in rows} >= {
        (ids[0], Outcome.admitted), (ids[1], Outcome.queued), (ids[2], Outcome.queued)},
        timeout=60, what=f"t0's starts decided on {worker.state_dir.name}")
    return ids


def _handed_over_and_cleaned(settings: Settings, client: Client, engine: HoldingEngine,
                             outcomes: Outcomes, ids: list[str]) -> None:
    """The other worker completes t0's three runs; then the cleaner removes their rows."""
    engine.release(HELD)
    outcomes.wait_until_decided(set(ids), timeout_s=60)
    executions = {rows[0].execution_id for rows in outcomes.final().values()
                  if rows[0].request_id in ids}
    outcomes.ledger.until(lambda _: executions <= engine.completed, timeout=60,
                          what="t0's runs completed")
    deleted, _ = _deleted_and_cleaned(settings, HELD.encode())
    assert deleted, "t0's queue rows were never deleted"
    _until_cleaned(settings, client, deleted)


def _assert_rebuilt(worker: WorkerProcess, client: Client, outcomes: Outcomes) -> None:
    """A new start of t0 is admitted at once (nothing of t0 is in flight), and nothing was
    admitted twice."""
    fourth = client.submit(WORKFLOW, {"account": HELD, "n": 3}).request_id
    client.flush()
    outcomes.wait_until_decided({fourth}, timeout_s=60)
    (row,) = outcomes.final()[fourth]
    assert row.outcome is Outcome.admitted, (row.outcome, row.reason, worker.log_tail())
    outcomes.settle(3.0)
    twice = [r for r, rows in outcomes.final().items() if len(rows) > 1]
    assert not twice, f"requests decided more than once: {twice[:5]}"
    executions = Counter(a.execution_id for a in outcomes.admitted.records)
    assert not [e for e, n in executions.items() if n > 1], "an execution admitted twice"
    if worker.settings.state_backend == "rocksdb":
        # A store in memory is rebuilt at every assignment, and never says so.
        assert "rebuilding it from its logs" in worker.log.read_text()


@dataclasses.dataclass
class Scene:
    """Workers A and B on one partition, B's id sorting first (the range assignor gives it
    the partition when both are in the group), a client, the engine holding t0's runs."""

    a: WorkerProcess
    b: WorkerProcess
    client: Client
    engine: HoldingEngine
    outcomes: Outcomes


@contextlib.contextmanager
def scene(settings: Settings, tmp_path: Path,
          backend: str) -> Iterator[tuple[Settings, Scene]]:
    settings = dataclasses.replace(settings, partitions=1, state_backend=backend)
    create_topics(settings)
    a = _worker(settings, tmp_path / "a", "bbbbbbbbbbbb")
    b = _worker(settings, tmp_path / "b", "aaaaaaaaaaaa")
    outcomes = Outcomes(settings)
    try:
        with tombstones_kept_one_second(settings), \
                Client(app=app, settings=settings, replies=False) as client, \
                HoldingEngine(settings, {HELD}) as engine:
            yield settings, Scene(a, b, client, engine, outcomes)
    finally:
        for worker in (a, b):
            if worker.alive:
                worker.stop()
        outcomes.close()


@pytest.mark.both_backends
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_kept_across_a_restart_is_rebuilt_once_its_tombstones_are_cleaned(
        settings: Settings, tmp_path: Path, backend: str) -> None:
    with scene(settings, tmp_path, backend) as (settings, s):
        s.a.start()
        ids = _park_on(s.a, s.client, s.outcomes)
        assert s.a.stop() == 0, s.a.log_tail()
        s.b.start()
        _handed_over_and_cleaned(settings, s.client, s.engine, s.outcomes, ids)
        assert s.b.stop() == 0, s.b.log_tail()
        s.a.start()
        _assert_rebuilt(s.a, s.client, s.outcomes)


@pytest.mark.both_backends
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_of_a_partition_lost_and_got_back_is_rebuilt_once_its_tombstones_are_cleaned(
        settings: Settings, tmp_path: Path, backend: str) -> None:
    with scene(settings, tmp_path, backend) as (settings, s):
        s.a.start()
        ids = _park_on(s.a, s.client, s.outcomes)
        s.b.start()  # takes the partition from A
        _handed_over_and_cleaned(settings, s.client, s.engine, s.outcomes, ids)
        # B leaves for good; A, which kept running, gets the partition back.
        assert s.b.stop() == 0, s.b.log_tail()
        _assert_rebuilt(s.a, s.client, s.outcomes)
        assert s.a.alive, "A did not keep running"
