"""encrypt_payloads on the real broker: no payload byte in clear in any topic or store file,
and a key rotation keeps what the old key sealed readable."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from sluicegate.client import Client, Delivery, Engine
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import MARKER, Payloads
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
from tests.apps.sealed import KEY_A, KEY_B, app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

SECRET = "zq-secret-diagnosis-7731"
MINUTE = 60_000


def _raw_topic_bytes(settings: Settings) -> dict[str, list[bytes]]:
    """Every key and value of every topic of the namespace, aborted transactions included."""
    consumer = Consumer(settings.client_config(**{
        "group.id": f"scan-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "isolation.level": "read_uncommitted", "enable.partition.eof": True,
    }))
    try:
        listed = consumer.list_topics(timeout=10).topics
        out: dict[str, list[bytes]] = {t: [] for t in listed if t.startswith(settings.namespace)}
        parts = [TopicPartition(t, p, OFFSET_BEGINNING)
                 for t in out for p in listed[t].partitions]
        consumer.assign(parts)
        pending = {(tp.topic, tp.partition) for tp in parts}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard((msg.topic(), msg.partition()))
                    continue
                out[str(msg.topic())] += [msg.key() or b"", msg.value() or b""]
        assert not pending, f"partitions not read to their end: {sorted(pending)}"
        return out
    finally:
        consumer.close()


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and needle in path.read_bytes()]


def _produce_raw(settings: Settings, start: StartRequest) -> None:
    producer = Producer(settings.client_config())
    producer.produce(Topics(settings).starts, codec.encode(start), start.request_id.encode())
    producer.flush(10)


def _request(workflow: str, payload: bytes) -> StartRequest:
    return StartRequest(request_id=uuid.uuid4().hex, workflow=workflow, payload=payload,
                        origin=Origin.event, requested_at_ms=int(time.time() * 1000))


def _admitted_deliveries(engine: Engine, count: int, timeout: float = 30) -> list[Delivery]:
    """The next `count` runs the engine is given. Delivery to an engine is at least once
    (a start is given again after a rebalance of the engine's group until it is reported
    started), so a run seen again is not counted again."""
    got: dict[str, Delivery] = {}
    deadline = time.monotonic() + timeout
    while len(got) < count:
        assert time.monotonic() < deadline, f"the engine got {len(got)} of {count} starts"
        delivery = engine.poll(0.2)
        if delivery is not None and delivery.admitted is not None:
            got.setdefault(delivery.admitted.execution_id, delivery)
    return list(got.values())


def test_no_plaintext_payload_byte_appears_in_any_topic_or_store_file(
        settings: Settings) -> None:
    settings = settings.with_(encryption_keys=KEY_A)
    sealed_app = app.with_settings(settings)
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    dead = TopicReader(settings, topics.deadletter, DeadLetter)
    foreign = "zq-foreign-plaintext-4410"
    with WorkerThread(sealed_app, settings, clock=clock), \
            Client(app=sealed_app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        # Debounce, then one concurrency slot per clinic: p1 runs, p2 waits, p3 expires.
        for patient in ("p1", "p2", "p3"):
            client.submit("triage", {"patientId": patient, "clinic": "c1", "note": SECRET})
        # A delayed start stays parked in identity's store for the whole test.
        client.submit("triage", {"patientId": "p9", "clinic": "c9", "note": SECRET},
                      at=clock.now_ms() + 24 * 60 * MINUTE)
        # A batch of three (`if` read on each item) and an item that runs alone.
        for _ in range(3):
            client.submit("visits", {"clinic": "c1", "note": SECRET, "routine": True})
        client.submit("visits", {"clinic": "c1", "note": SECRET, "routine": False})
        client.flush()
        # Before time moves: the four patients parked, and the four visits decided (the
        # batch runs at its third item; a visit that reached its batch only after the
        # clock had passed its arrival's deadline would run on its own).
        ledger.until(lambda rows: sum(r.workflow == "triage" and r.outcome is Outcome.queued
                                      for r in rows) >= 4
                     and sum(r.workflow == "visits" and r.outcome is not Outcome.queued
                             for r in rows) >= 4,
                     timeout=30, what="the patients parked and the visits decided")
        clock.advance(MINUTE + 1000)
        runs = _admitted_deliveries(engine, 3)  # p1, the batch, the lone visit
        by_workflow = {d.admitted.workflow: d for d in runs if d.admitted is not None}
        assert len({d.payload()["items"][0]["note"] for d in runs
                    if d.admitted and d.admitted.workflow == "visits"}) == 1
        assert "triage" in by_workflow, [(d.admitted.workflow, d.admitted.execution_id,
                                          d.admitted.request_ids) for d in runs if d.admitted]
        first = by_workflow["triage"]
        assert first.payload() == {"patientId": first.payload()["patientId"], "clinic": "c1",
                                   "note": SECRET}
        assert first.admitted is not None
        engine.started(first)
        # p1 fails with retries spent: its onFailure handler gets the report, sealed.
        engine.failed(first.admitted.execution_id, "triage", retries_spent=3,
                      error_tag="Boom", error_message="no")
        engine.flush()
        # Its slot frees: the next patient runs too.
        (handler,) = [d for d in _admitted_deliveries(engine, 2)
                      if d.admitted is not None and d.admitted.workflow == "triageFailed"]
        assert handler.payload()["payload"]["note"] == SECRET
        # The third patient, still waiting for the slot, expires (timeouts.start).
        clock.advance(10 * MINUTE)
        ledger.until(lambda rows: any(r.outcome is Outcome.expired for r in rows),
                     timeout=30, what="the third patient expired")
        admitted.until(lambda rows: sum(a.workflow == "triageFailed" for a in rows) >= 2,
                       timeout=30, what="the expiry's failure handler")
        # A start that does not validate is rejected; its dead letter is sealed too.
        bad = Payloads.of(settings).seal(sealed_app["triage"], {"note": SECRET})
        _produce_raw(settings, _request("triage", bad))
        # A producer that does not seal: sluicegate seals every copy it keeps.
        plain = _request("triage", codec.dump_payload(
            {"patientId": "p7", "clinic": "c7", "note": foreign}))
        _produce_raw(settings, plain)
        dead.until(lambda rows: len(rows) >= 1, timeout=30, what="the dead letter")
        ledger.until(lambda rows: any(r.request_id == plain.request_id for r in rows),
                     timeout=30, what="the foreign start queued")
        clock.advance(MINUTE + 1000)
        admitted.until(lambda rows: any(a.workflow == "triage" and
                                        Payloads.of(settings).open(a.payload)["note"] == foreign
                                        for a in rows), timeout=30, what="the foreign start")
        ledger.settle(0.5)

    outcomes = [r.outcome for r in ledger.records]
    assert outcomes.count(Outcome.rejected) == 1
    assert all(a.payload.startswith(MARKER + b"a:") for a in admitted.records)
    scanned = _raw_topic_bytes(settings)
    expected = {topics.starts, topics.admitted, topics.ledger, topics.runs, topics.replies,
                topics.deadletter, topics.stage("defer"), topics.stage("concurrency"),
                topics.changelog("concurrency")}
    assert expected <= set(scanned)
    holding = sorted(t for t, chunks in scanned.items()
                     if any(SECRET.encode() in c for c in chunks))
    assert holding == []
    # The unsealed producer's own record is the only clear copy (and shows the scan reads).
    assert sorted(t for t, chunks in scanned.items()
                  if any(foreign.encode() in c for c in chunks)) == [topics.starts]
    assert _files_holding(settings.state_dir, SECRET.encode()) == []
    assert _files_holding(settings.state_dir, foreign.encode()) == []


def test_after_rotating_to_b_then_a_what_key_a_sealed_is_still_read(
        settings: Settings) -> None:
    with_a = settings.with_(encryption_keys=KEY_A)
    # A fresh state dir: the rotated worker restores the stores from their changelogs,
    # which hold what key A sealed.
    with_ba = settings.with_(encryption_keys=f"{KEY_B},{KEY_A}",
                             state_dir=settings.state_dir.with_name("rotated"))
    create_topics(with_a)
    topics = Topics(with_a)
    clock = ManualClock()
    ledger = TopicReader(with_a, topics.ledger, LedgerRecord)
    app_a, app_ba = app.with_settings(with_a), app.with_settings(with_ba)
    with WorkerThread(app_a, with_a, clock=clock), \
            Client(app=app_a, settings=with_a, replies=False) as client:
        # Parked in the debounce store and stage topic under key A.
        client.submit("triage", {"patientId": "old", "clinic": "c1", "note": SECRET})
        client.flush()
        ledger.until(lambda rows: len(rows) >= 1, timeout=30, what="the start queued")
    with Client(app=app_a, settings=with_a, replies=False) as client:
        # Sealed under A while no worker runs: read by the rotated worker.
        client.submit("triage", {"patientId": "late", "clinic": "c2", "note": SECRET})
    with WorkerThread(app_ba, with_ba, clock=clock), \
            Client(app=app_ba, settings=with_ba, replies=False) as client, \
            Engine(group=f"{with_ba.namespace}engine", settings=with_ba) as engine:
        client.submit("triage", {"patientId": "new", "clinic": "c3", "note": SECRET})
        client.flush()
        ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= 3,
                     timeout=30, what="every start queued")
        clock.advance(MINUTE + 1000)
        runs = _admitted_deliveries(engine, 3)

    kept = {d.payload()["patientId"]: d.admitted.payload for d in runs if d.admitted}
    assert {d.payload()["note"] for d in runs} == {SECRET}
    assert kept["old"].startswith(MARKER + b"a:")
    assert kept["late"].startswith(MARKER + b"a:")
    assert kept["new"].startswith(MARKER + b"b:")
