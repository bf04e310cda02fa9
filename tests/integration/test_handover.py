"""Admitted starts reach the runs stage in-process when the worker owns the run's
partition, and through the runs stage's topic when another worker does
(docs/decisions/in-process-handover.md)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

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
    PendingStart,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.testing import TestDriver
from sluicegate.topology.admin import create_topics
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import (
    TopicReader,
    WorkerProcess,
    WorkerThread,
    partition_owners,
    shared_by_two,
)

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
    workers = [WorkerProcess(settings, "tests.apps.lifecycle", tmp_path / f"w{i}").start()
               for i in range(2)]
    try:
        owners = shared_by_two(settings)
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
        assert owners == partition_owners(settings), "the group rebalanced during the test"
    finally:
        for worker in workers:
            assert worker.stop() == 0, worker.log_tail()

    assert sorted(a.execution_id for a in handed.settle(1.0)) == sorted(crossing)
    assert set(table) == set(decided_on)
    assert {row.status for row in table.values()} == {RunStatus.admitted}
    assert {row.outcome for row in ledger.settle(0.5)} == {Outcome.admitted}
    assert len(ledger.records) == len(decided_on)


# -- a control's topic: handed over in order (docs/decisions/in-process-handover.md) -----

def _gated_starts(settings: Settings, tag: str, tenants: int) -> list[StartRequest]:
    return [StartRequest(request_id=f"{tag}-{t}", workflow="soloJob",
                         payload=codec.dump_payload({"tenant": f"t{t}", "n": 0}),
                         origin=Origin.event, requested_at_ms=int(time.time() * 1000))
            for t in range(tenants)]


def _decisions(settings: Settings, n: int) -> dict[str, Outcome]:
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    try:
        ledger.until(lambda rows: len({r.request_id for r in rows}) >= n, timeout=120,
                     what=f"{n} starts decided")
        ledger.settle(0.5)
        return {row.request_id: row.outcome for row in ledger.records}
    finally:
        ledger.close()


def test_one_worker_hands_a_controls_starts_over_and_its_topic_stays_empty(
        settings: Settings) -> None:
    """Every partition is this worker's and its control topic was empty when it joined:
    a gated start goes from the identity stage to the concurrency stage in-process, and
    the decisions are the control's (the first of a tenant admitted, the second queued)."""
    create_topics(settings)
    topics = Topics(settings)
    producer = Producer(settings.client_config())
    with WorkerThread(load_app("tests.apps.concurrency"), settings) as worker:
        # Until its tasks have joined and it has read the ends of the control's topic,
        # what it sends there goes through the topic.
        deadline = time.monotonic() + 60
        while not worker.caught_up:
            assert time.monotonic() < deadline, "the worker did not catch up in 60 s"
            time.sleep(0.05)
        for tag in ("first", "second"):
            for start in _gated_starts(settings, tag, 40):
                producer.produce(topics.starts, codec.encode(start), start.request_id.encode())
            assert producer.flush(10) == 0
            _decisions(settings, 40 if tag == "first" else 80)
        outcomes = _decisions(settings, 80)
        assert {outcomes[f"first-{t}"] for t in range(40)} == {Outcome.admitted}
        assert {outcomes[f"second-{t}"] for t in range(40)} == {Outcome.queued}
        control = TopicReader(settings, topics.stage("concurrency"), PendingStart)
        try:
            assert control.settle(1.0) == []
        finally:
            control.close()
        assert worker.processed == 80  # the starts; nothing handed in was read


def test_a_control_reads_what_was_in_its_topic_before_it_takes_a_start_handed_over(
        settings: Settings) -> None:
    """Starts already on their way to the concurrency stage through its topic when the
    worker joins (sent by an earlier owner of the identity stage's partitions) are
    decided before the starts the worker sends there itself: each tenant's earlier start
    takes the one slot, the later one queues. Handed over at once, the later one would be
    decided first wherever the worker read sg.starts before the control's topic."""
    settings = dataclasses.replace(settings, partitions=3)
    create_topics(settings)
    topics = Topics(settings)
    tenants = 60
    # What an identity stage sends the concurrency stage for each earlier start: the
    # test driver's identity stage, alone, with the worker's partitions.
    with TestDriver(load_app("tests.apps.concurrency"), settings,
                    stages=("identity",)) as driver:
        for start in _gated_starts(settings, "earlier", tenants):
            driver.pipe(topics.starts, start, start.request_id)
        in_transit = driver.sent(topics.stage("concurrency"))
    assert len(in_transit) == tenants
    producer = Producer(settings.client_config())
    for record in in_transit:
        producer.produce(topics.stage("concurrency"), record.value, record.key,
                         record.partition, headers=record.headers)
    for start in _gated_starts(settings, "later", tenants):
        producer.produce(topics.starts, codec.encode(start), start.request_id.encode())
    assert producer.flush(10) == 0
    with WorkerThread(load_app("tests.apps.concurrency"), settings):
        outcomes = _decisions(settings, 2 * tenants)
    assert [t for t in range(tenants) if outcomes[f"earlier-{t}"] != Outcome.admitted] == []
    assert [t for t in range(tenants) if outcomes[f"later-{t}"] != Outcome.queued] == []
