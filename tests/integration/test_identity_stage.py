"""The identity stage and the passthrough on the real broker, exactly once."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Origin,
    Outcome,
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


@pytest.fixture
def app():  # type: ignore[no-untyped-def]
    return load_app("tests.apps.identity")


def test_ten_thousand_starts_with_two_thousand_repeats_admit_eight_thousand(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)
    topics = Topics(settings)
    with Client(app=app, settings=settings, replies=False) as client:
        for i in range(8000):
            client.submit("sendReceipt", {"orderId": f"o{i}", "amount": i})
        for i in range(2000):
            client.submit("sendReceipt", {"orderId": f"o{i * 4}", "amount": -1})
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings):
        ledger.until(lambda rows: len(rows) >= 10_000, timeout=120, what="10,000 decisions")
        admitted.until(lambda rows: len(rows) >= 8000, timeout=60, what="8,000 admitted")
        ledger.settle()
        admitted.settle()

    outcomes = Counter(row.outcome for row in ledger.records)
    assert outcomes == {Outcome.admitted: 8000, Outcome.existing: 2000}
    assert len({row.request_id for row in ledger.records}) == 10_000
    first_run = {row.key: row.execution_id for row in ledger.records
                 if row.outcome is Outcome.admitted}
    for row in ledger.records:
        if row.outcome is Outcome.existing:
            assert row.execution_id == first_run[row.key]
    assert len(admitted.records) == 8000
    assert len({a.execution_id for a in admitted.records}) == 8000
    assert {json.loads(a.payload)["orderId"] for a in admitted.records} == {
        f"o{i}" for i in range(8000)}


def _start(workflow: str, payload: bytes) -> StartRequest:
    return StartRequest(request_id=uuid.uuid4().hex, workflow=workflow, payload=payload,
                        origin=Origin.event, requested_at_ms=int(time.time() * 1000))


def test_bad_records_go_to_the_dead_letter_with_a_reason_and_the_partition_keeps_going(
        settings: Settings, app) -> None:  # type: ignore[no-untyped-def]
    create_topics(settings)
    topics = Topics(settings)
    bad = [
        (None, "empty record"),
        (b"\x00garbage\xff", "not a start request"),
        (codec.encode(LedgerRecord(request_id="x", workflow="note", outcome=Outcome.admitted,
                                   requested_at_ms=1, decided_at_ms=1)), "not a start request"),
        (codec.encode(_start("noSuchWorkflow", b"{}")), "unknown workflow 'noSuchWorkflow'"),
        (codec.encode(_start("note", b"{not json")), "payload does not validate"),
        (codec.encode(_start("note", b'{"txt": "typo"}')), "text: Field required"),
    ]
    good = _start("note", b'{"text": "after the bad ones"}')
    producer = Producer(settings.client_config())
    for value, _ in bad:
        producer.produce(topics.starts, value, b"k", partition=0)
    producer.produce(topics.starts, codec.encode(good), b"k", partition=0)
    assert producer.flush(10) == 0

    letters = TopicReader(settings, topics.deadletter, DeadLetter)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings):
        letters.until(lambda rows: len(rows) >= len(bad), what="dead letters")
        ledger.until(lambda rows: len(rows) >= len(bad) + 1, what="ledger rows")
        letters.settle()

    assert len(letters.records) == len(bad)
    for letter, (value, reason) in zip(
            sorted(letters.records, key=lambda r: r.source_offset), bad, strict=True):
        assert reason in letter.reason
        assert letter.value == value
        assert letter.source_topic == topics.starts
    outcomes = Counter(row.outcome for row in ledger.records)
    assert outcomes == {Outcome.rejected: len(bad), Outcome.admitted: 1}
    admitted_row = next(r for r in ledger.records if r.outcome is Outcome.admitted)
    assert admitted_row.request_id == good.request_id
