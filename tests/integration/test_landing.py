"""Starts land where they are decided, on the broker: the SDK keys a gated start by its
concurrency key, so identity, the gate and the run's row are one task; starts keyed the
old way (by request id) are still decided once with the limit holding
(docs/decisions/starts-land-where-decided.md)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client
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
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import (
    TopicReader,
    WorkerProcess,
    WorkerThread,
    partition_owners,
    shared_by_two,
)

pytestmark = pytest.mark.broker

APP = "tests.apps.concurrency"
WORKFLOW = "soloJob"  # one in flight per tenant


def _old_way(settings: Settings, tenants: range, tag: str) -> list[str]:
    """Two starts per tenant produced keyed by their request ids, as before; their ids."""
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    ids = []
    for t in tenants:
        for i in range(2):
            start = StartRequest(request_id=f"{tag}-{t}-{i}", workflow=WORKFLOW,
                                 payload=codec.dump_payload({"tenant": f"old{t}", "n": i}),
                                 origin=Origin.event, requested_at_ms=int(time.time() * 1000))
            producer.produce(Topics(settings).starts, codec.encode(start),
                             start.request_id.encode())
            ids.append(start.request_id)
    assert producer.flush(10) == 0
    return ids


def _ledger(settings: Settings, request_ids: set[str]) -> list[LedgerRecord]:
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    try:
        ledger.until(lambda rows: request_ids <= {r.request_id for r in rows}, timeout=120,
                     what=f"{len(request_ids)} starts decided")
        return [r for r in ledger.settle(1.0) if r.request_id in request_ids]
    finally:
        ledger.close()


def _assert_once_each_tenant_one_slot(rows: list[LedgerRecord], request_ids: set[str],
                                      tenant_of: dict[str, str]) -> None:
    """Every start decided once (one row each: admitted or queued), and per tenant one
    admitted and one queued: the limit of one holds."""
    assert Counter(r.request_id for r in rows) == dict.fromkeys(request_ids, 1)
    by_tenant: dict[str, list[Outcome]] = {}
    for row in rows:
        by_tenant.setdefault(tenant_of[row.request_id], []).append(row.outcome)
    assert {t: sorted(o.value for o in outcomes) for t, outcomes in by_tenant.items()} == {
        t: ["admitted", "queued"] for t in set(tenant_of.values())}


def _admitted(settings: Settings, n: int) -> list[AdmittedStart]:
    reader = TopicReader(settings, Topics(settings).admitted, AdmittedStart)
    try:
        reader.until(lambda rows: len(rows) >= n, timeout=120, what=f"{n} admitted")
        return reader.settle(1.0)
    finally:
        reader.close()


def test_sdk_starts_cross_no_topic_and_old_keyed_starts_are_still_decided_once(
        settings: Settings) -> None:
    """Four partitions, one worker that has caught up: the SDK's starts are decided where
    they land (each run's execution id on its concurrency key's partition, nothing
    written to the gate's topic), and starts keyed by request id alongside them are
    decided once each with the limit holding."""
    settings = dataclasses.replace(settings, partitions=4)
    create_topics(settings)
    topics = Topics(settings)
    app = load_app(APP)
    with WorkerThread(app, settings) as worker, \
            Client(app=app, settings=settings, replies=False) as client:
        deadline = time.monotonic() + 60
        while not worker.caught_up:
            assert time.monotonic() < deadline, "the worker did not catch up in 60 s"
            time.sleep(0.05)
        tenant_of: dict[str, str] = {}
        firsts = set()
        for t in range(30):
            for i in range(2):
                handle = client.submit(WORKFLOW, {"tenant": f"t{t}", "n": i})
                tenant_of[handle.request_id] = f"t{t}"
                if i == 0:
                    firsts.add(handle.request_id)
        client.flush()
        old = _old_way(settings, range(30), "old")
        tenant_of.update({rid: rid.rsplit("-", 1)[0] for rid in old})
        rows = _ledger(settings, set(tenant_of))
        control = TopicReader(settings, topics.stage("concurrency"), PendingStart)
        try:
            assert control.settle(1.0) == []
        finally:
            control.close()
        admitted = _admitted(settings, 60)

    _assert_once_each_tenant_one_slot(rows, set(tenant_of), tenant_of)
    sdk = [run for run in admitted if run.request_ids[0] not in old]
    assert len(sdk) == 30
    for run in sdk:
        (slot,) = run.slots
        assert partition_for(run.execution_id.encode(), 4) == partition_for(
            slot.key.encode(), 4)
    # The SDK's two starts of a tenant share a partition, so its first is the one admitted.
    assert {run.request_ids[0] for run in sdk} == firsts


def test_two_workers_admit_sdk_starts_with_their_runs_on_the_admitting_partition(
        settings: Settings, tmp_path: Path) -> None:
    """Two worker processes share four partitions: an SDK start's run is placed on its
    concurrency key's partition, so no admission crosses to the other worker (nothing is
    written to the runs stage's topic), and starts keyed by request id are admitted
    once each with the limit holding."""
    settings = dataclasses.replace(settings, partitions=4)
    create_topics(settings)
    topics = Topics(settings)
    app = load_app(APP)
    workers = [WorkerProcess(settings, APP, tmp_path / f"w{i}").start() for i in range(2)]
    try:
        owners = shared_by_two(settings)
        with Client(app=app, settings=settings, replies=False) as client:
            tenant_of: dict[str, str] = {}
            for t in range(40):
                handle = client.submit(WORKFLOW, {"tenant": f"t{t}-{uuid.uuid4().hex[:4]}",
                                                  "n": 0})
                tenant_of[handle.request_id] = f"t{t}"
        sdk_rows = _ledger(settings, set(tenant_of))
        old = _old_way(settings, range(20), "old")
        old_rows = _ledger(settings, set(old))
        admitted = _admitted(settings, 60)
        handed = TopicReader(settings, topics.stage("runs"), AdmittedStart)
        try:
            crossed = {run.request_ids[0] for run in handed.settle(2.0)}
        finally:
            handed.close()
        assert owners == partition_owners(settings), "the group rebalanced during the test"
    finally:
        for worker in workers:
            assert worker.stop() == 0, worker.log_tail()

    assert Counter(r.request_id for r in sdk_rows) == dict.fromkeys(tenant_of, 1)
    assert {r.outcome for r in sdk_rows} == {Outcome.admitted}
    assert crossed.isdisjoint(tenant_of), "an SDK start's admission crossed to another worker"
    for run in admitted:
        if run.request_ids[0] in tenant_of:
            (slot,) = run.slots
            assert partition_for(run.execution_id.encode(), 4) == partition_for(
                slot.key.encode(), 4)
    _assert_once_each_tenant_one_slot(old_rows, set(old),
                                      {rid: rid.rsplit("-", 1)[0] for rid in old})
