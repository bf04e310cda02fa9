"""Admitted starts reach the runs stage in-process when the worker owns the run's
partition, and through the runs stage's topic when another worker does
(docs/decisions/in-process-handover.md)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from sluicegate.admission.routing import Router
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedStart,
    LedgerRecord,
    Origin,
    Outcome,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerProcess, WorkerThread

pytestmark = pytest.mark.broker


def _produce(settings: Settings, starts: list[tuple[str, dict[str, str]]]) -> dict[str, int]:
    """The starts, spread over every partition of sg.starts by hand; returns each one's
    execution id and the partition identity decides it on (where the id is placed)."""
    topics = Topics(settings)
    n = settings.partitions
    producer = Producer(settings.client_config())
    decided_on: dict[str, int] = {}
    for i, (workflow, payload) in enumerate(starts):
        start = StartRequest(request_id=uuid.uuid4().hex, workflow=workflow,
                             payload=codec.dump_payload(payload), origin=Origin.event,
                             requested_at_ms=int(time.time() * 1000))
        producer.produce(topics.starts, codec.encode(start), f"k{i}".encode(), i % n)
        execution_id = execution_id_for(workflow, start.request_id, i % n, n)
        assert partition_for(execution_id.encode(), n) == i % n
        decided_on[execution_id] = i % n
    assert producer.flush(10) == 0
    return decided_on


def _runs_table(settings: Settings, n: int) -> dict[str, RunRow]:
    runs = TopicReader(settings, Topics(settings).runs, RunRow)
    try:
        runs.until(lambda rows: len({r.execution_id for r in rows}) >= n, timeout=120,
                   what=f"{n} rows in the runs table")
        runs.settle(0.5)
        return {row.execution_id: row for row in runs.records}
    finally:
        runs.close()


def test_one_worker_hands_every_admission_over_and_the_runs_topic_stays_empty(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    decided_on = _produce(settings, [("note", {"text": f"n{i}"}) for i in range(600)])
    with WorkerThread(load_app("tests.apps.identity"), settings) as worker:
        table = _runs_table(settings, len(decided_on))
        handed = TopicReader(settings, topics.stage("runs"), AdmittedStart)
        admitted = TopicReader(settings, topics.admitted, AdmittedStart)
        admitted.until(lambda rows: len(rows) >= len(decided_on), what="600 admitted")
        assert handed.settle(1.0) == []
        assert worker.processed == len(decided_on)  # the 600 starts, nothing handed in

    assert set(table) == set(decided_on)
    assert {row.status for row in table.values()} == {RunStatus.admitted}
    assert {a.execution_id for a in admitted.settle(0.5)} == set(decided_on)
    for run in admitted.records:
        assert table[run.execution_id].admitted_at_ms == run.admitted_at_ms
        assert table[run.execution_id].payload == run.payload


def _owners(settings: Settings, admin: AdminClient) -> dict[int, str] | None:
    """Which member owns each partition of sg.starts, once the group is stable with two
    members sharing the six partitions; None before that."""
    topics = Topics(settings)
    (future,) = admin.describe_consumer_groups([topics.group]).values()
    group = future.result(timeout=10)
    if group.state is not ConsumerGroupState.STABLE or len(group.members) != 2:
        return None
    owners = {tp.partition: member.member_id for member in group.members
              for tp in member.assignment.topic_partitions if tp.topic == topics.starts}
    return owners if len(owners) == settings.partitions else None


def test_two_workers_write_to_the_runs_topic_only_what_the_other_one_keeps(
        settings: Settings, tmp_path: Path) -> None:
    """A passthrough's run is placed where it is admitted, so it never crosses; a start
    admitted by a control (rateLimit here, keyed by the job) crosses when the other worker
    owns its run's partition."""
    create_topics(settings)
    topics = Topics(settings)
    app = load_app("tests.apps.lifecycle")
    limited = app.workflows["limitedJob"]
    # Admitted by its last hop, the rate limit, on its key's partition.
    hop = Router(app, 0, None).routes["limitedJob"].hops[-1]
    assert hop.stage == "ratelimit"
    admin = AdminClient(settings.client_config())
    workers = [WorkerProcess(settings, "tests.apps.lifecycle", tmp_path / f"w{i}").start()
               for i in range(2)]
    try:
        deadline = time.monotonic() + 90
        owners = None
        while owners is None:
            assert time.monotonic() < deadline, "the two workers never shared the partitions"
            owners = _owners(settings, admin)
            if owners is None:
                time.sleep(0.2)
        assert len(set(owners.values())) == 2
        jobs = [{"jobId": f"j{i}"} for i in range(300)]
        decided_on = _produce(settings, [("flakyJob", job) for job in jobs]
                              + [("limitedJob", job) for job in jobs])
        table = _runs_table(settings, len(decided_on))
        ledger = TopicReader(settings, topics.ledger, LedgerRecord)
        ledger.until(lambda rows: len(rows) >= len(decided_on), what="600 decisions")
        admitted = TopicReader(settings, topics.admitted, AdmittedStart)
        admitted.until(lambda rows: len(rows) >= len(decided_on), what="600 admitted")
        n = settings.partitions
        crossing = set()
        for run in admitted.records:
            if run.workflow == "limitedJob":
                key = Router.key_for(limited, hop, json.loads(run.payload))
                if owners[partition_for(key.encode(), n)] != owners[decided_on[run.execution_id]]:
                    crossing.add(run.execution_id)
        assert 0 < len(crossing) < len(jobs)
        handed = TopicReader(settings, topics.stage("runs"), AdmittedStart)
        handed.until(lambda rows: len(rows) >= len(crossing), what="the crossing admissions")
        assert owners == _owners(settings, admin), "the group rebalanced during the test"
    finally:
        for worker in workers:
            assert worker.stop() == 0, worker.log_tail()

    assert sorted(a.execution_id for a in handed.settle(1.0)) == sorted(crossing)
    assert set(table) == set(decided_on)
    assert {row.status for row in table.values()} == {RunStatus.admitted}
    assert {row.outcome for row in ledger.settle(0.5)} == {Outcome.admitted}
    assert len(ledger.records) == len(decided_on)
