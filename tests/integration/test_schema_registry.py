"""Schema Registry framing against a real registry (the local Apicurio) and a real broker,
checked with confluent-kafka's own AvroSerializer / AvroDeserializer: the wire contract
ksqlDB's VALUE_FORMAT='AVRO', Kafka Connect's AvroConverter and every Confluent client use."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from typer.testing import CliRunner

from sluicegate.client import Client
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.ops.cli.root import app as cli
from sluicegate.ops.localkafka.processes import free_ports
from sluicegate.ops.localkafka.registry import ensure_registry, stop_registry
from sluicegate.schemas.codec import RECORD_TYPES, Codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Origin,
    Outcome,
    RunRow,
    RunStatus,
    Slot,
    StartRequest,
)
from sluicegate.schemas.registry import RegistryFraming
from sluicegate.topology.admin import create_topics
from sluicegate.topology.framing import configure_codec, topic_subjects
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerProcess

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _ms(value: Any) -> Any:
    """The deserializer reads timestamp-millis fields as datetimes; the records keep ms."""
    if isinstance(value, datetime):
        return (value - EPOCH) // (datetime.resolution * 1000)
    if isinstance(value, list):
        return [_ms(v) for v in value]
    if isinstance(value, dict):
        return {k: _ms(v) for k, v in value.items()}
    return value


def _client(url: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url})


def _context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_every_public_record_reads_with_confluents_avro_deserializer(
        schema_registry_url: str) -> None:
    topics = Topics(Settings(namespace=f"r{uuid.uuid4().hex[:8]}."))
    framing = RegistryFraming(_client(schema_registry_url), source=schema_registry_url)
    framing.register_subjects(topic_subjects(topics))
    ours = Codec(framing)
    records: list[tuple[str, Any]] = [
        (topics.ledger, LedgerRecord(
            request_id="r1", workflow="tourNarration", outcome=Outcome.queued,
            requested_at_ms=T0, decided_at_ms=T0 + 5, waited_ms=5, folded=0, key="tour:7",
            stage="debounce", reason="waiting for a quiet period", execution_id="e1",
            retry_after_ms=None, deferral="debounce", due_at_ms=T0 + 900_000, position=3,
            declaration_version="v1", payload=b'{"rowId":"7"}')),
        (topics.starts, StartRequest(
            request_id="r2", workflow="w", payload=b"{}", origin=Origin.direct,
            requested_at_ms=T0, idempotency_id="i1", at_ms=T0 + 1, reply_partition=2,
            wait=True)),
        (topics.admitted, AdmittedStart(
            execution_id="e2", workflow="w", payload=b"{}", declaration_version="v1",
            origin=Origin.event, kind=AdmittedKind.start,
            slots=[Slot("concurrency", "tenant-a")], request_ids=["r2", "r3"],
            requested_at_ms=T0, admitted_at_ms=T0 + 2)),
        (topics.runs, RunRow(
            execution_id="e2", workflow="w", status=RunStatus.running, payload=b"{}",
            declaration_version="v1", admitted_at_ms=T0, updated_at_ms=T0 + 3,
            slots=[Slot("singleton", "k")], keys={"singleton": "k"}, run_id="run-9")),
    ]
    confluent = AvroDeserializer(_client(schema_registry_url))
    for topic, record in records:
        frame = ours.encode(record)
        assert frame[:1] == b"\x00"
        read = confluent(frame, _context(topic))
        assert _ms(read) == dataclasses.asdict(record), type(record).__name__

    # ksqlDB infers a stream's columns from the topic's subject: it holds LedgerRecord,
    # under the id the frames carry.
    latest = _client(schema_registry_url).get_latest_version(f"{topics.ledger}-value")
    assert json.loads(latest.schema.schema_str) == RECORD_TYPES[LedgerRecord].schema
    ledger_frame = ours.encode(records[0][1])
    assert int.from_bytes(ledger_frame[1:5], "big") == latest.schema_id


def test_a_start_another_producer_wrote_with_an_older_schema_is_fetched_and_read(
        schema_registry_url: str) -> None:
    topic = f"r{uuid.uuid4().hex[:8]}.starts"
    current = RECORD_TYPES[StartRequest].schema
    older = {**current, "fields": [f for f in current["fields"] if f["name"] != "wait"]}
    serializer = AvroSerializer(_client(schema_registry_url), json.dumps(older))
    frame = serializer({"request_id": "r1", "workflow": "w", "payload": b"{}",
                        "origin": "event", "requested_at_ms": T0, "idempotency_id": None,
                        "at_ms": None, "reply_partition": None}, _context(topic))
    assert frame is not None
    ours = Codec(RegistryFraming(_client(schema_registry_url), source=schema_registry_url))
    assert frame[:5] != ours.encode(StartRequest("x", "w", b"{}", Origin.event, 0))[:5]
    assert ours.decode(StartRequest, frame) == StartRequest(
        request_id="r1", workflow="w", payload=b"{}", origin=Origin.event,
        requested_at_ms=T0, wait=False)


@pytest.mark.broker
def test_a_worker_with_the_registry_writes_a_ledger_confluents_deserializer_reads(
        settings: Settings, schema_registry_url: str, tmp_path: Path,
        restore_codec: None) -> None:
    framed = settings.with_(schema_registry_url=schema_registry_url)
    create_topics(framed)  # also registers the schemas and this namespace's subjects
    topics = Topics(framed)

    # A start from before the deployment had a registry: single-object framing, keyed as
    # the SDK keys it (so the repeat below lands behind it on the same partition).
    app = load_app("tests.apps.identity")
    before, key = StartBuilder(app, framed).build("sendReceipt", {"orderId": "o1", "amount": 1})
    producer = Producer(framed.client_config(partitioner="murmur2_random"))
    producer.produce(topics.starts, Codec().encode(before), key)
    assert producer.flush(30) == 0
    # Then two through the SDK, framed for the registry like everything this process writes.
    with Client(app=app, settings=framed, replies=False) as client:
        repeat = client.submit("sendReceipt", {"orderId": "o1", "amount": 1})
        other = client.submit("sendReceipt", {"orderId": "o2", "amount": 2})

    worker = WorkerProcess(settings, "tests.apps.identity", tmp_path / "w",
                           SLUICEGATE_SCHEMA_REGISTRY_URL=schema_registry_url).start()
    try:
        rows = _read_ledger(framed, topics.ledger, schema_registry_url, count=3)
    finally:
        assert worker.stop() == 0, worker.log_tail()

    frames = {row["request_id"]: row for row in rows}
    assert set(frames) == {before.request_id, repeat.request_id, other.request_id}
    first, again, second = (frames[h.request_id] for h in (before, repeat, other))
    assert (first["outcome"], again["outcome"], second["outcome"]) == (
        "admitted", "existing", "admitted")
    assert again["execution_id"] == first["execution_id"] != second["execution_id"]
    assert all(row["workflow"] == "sendReceipt" for row in rows)
    assert all(isinstance(row["decided_at_ms"], datetime) for row in rows)  # TIMESTAMP in ksql
    subject = _client(schema_registry_url).get_latest_version(f"{topics.ledger}-value")
    assert {row["_schema_id"] for row in rows} == {subject.schema_id}

    # The CLI frames as the workers do: its ledger copy reads the same records.
    result = CliRunner().invoke(cli, [
        "ledger", "query", "SELECT outcome, count(*) AS n FROM ledger GROUP BY outcome"
        " ORDER BY outcome", "--format", "json", "--db", str(tmp_path / "ledger.duckdb")],
        env={"SLUICEGATE_BOOTSTRAP": framed.bootstrap,
             "SLUICEGATE_NAMESPACE": framed.namespace,
             "SLUICEGATE_SCHEMA_REGISTRY_URL": schema_registry_url})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"outcome": "admitted", "n": 2},
                                         {"outcome": "existing", "n": 1}]
    assert configure_codec(framed).framing.__class__ is RegistryFraming


def _read_ledger(settings: Settings, topic: str, url: str, count: int,
                 timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Every ledger value read with confluent-kafka's AvroDeserializer, keyed checks done:
    a record's key is its request id, as the stream's `request_id STRING KEY` says."""
    deserializer = AvroDeserializer(_client(url))
    consumer = Consumer(settings.client_config(**{
        "group.id": f"registry-test-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
    }))
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(rows) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {count} ledger"
                                     f" records; have {len(rows)}: {rows}")
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is not None:
                    continue
                value = msg.value()
                assert value[:1] == b"\x00", f"not Schema Registry framing: {value[:10]!r}"
                row = deserializer(value, _context(topic))
                assert msg.key() == row["request_id"].encode()
                rows.append({**row, "_schema_id": int.from_bytes(value[1:5], "big")})
    finally:
        consumer.close()
    return rows


@pytest.mark.broker
def test_a_worker_whose_registry_stops_answering_waits_rather_than_dead_letter_a_start(
        settings: Settings, tmp_path: Path, restore_codec: None) -> None:
    # A registry of this test's own, so that stopping it leaves the session's alone.
    (port,) = free_ports(1)
    registry = ensure_registry(port=port, data_dir=tmp_path / "registry")
    framed = settings.with_(schema_registry_url=registry.url)
    topics = Topics(framed)
    worker = WorkerProcess(settings, "tests.apps.identity", tmp_path / "w",
                           SLUICEGATE_SCHEMA_REGISTRY_URL=registry.url)
    ledger: TopicReader[LedgerRecord] | None = None
    try:
        create_topics(framed)
        worker.start()
        ledger = TopicReader(framed, topics.ledger, LedgerRecord)
        with Client(app=load_app("tests.apps.identity"), settings=framed, replies=False) as c:
            c.submit("sendReceipt", {"orderId": "o1", "amount": 1})
        ledger.until(lambda rows: len(rows) == 1, what="the worker deciding a first start")
        # Another producer's start, framed with a schema id this worker has not seen.
        current = RECORD_TYPES[StartRequest].schema
        older = {**current, "fields": [f for f in current["fields"] if f["name"] != "wait"]}
        frame = AvroSerializer(_client(registry.url), json.dumps(older))(
            {"request_id": "r-older", "workflow": "sendReceipt",
             "payload": b'{"orderId":"o2","amount":2}', "origin": "event",
             "requested_at_ms": T0, "idempotency_id": None, "at_ms": None,
             "reply_partition": None}, _context(topics.starts))
    finally:
        stop_registry(port, tmp_path / "registry")
    producer = Producer(framed.client_config(partitioner="murmur2_random"))
    producer.produce(topics.starts, frame, b"r-older")
    assert producer.flush(30) == 0

    # The registry's outage is the registry's, not the record's: the worker says so, keeps
    # retrying the cycle, and neither decides nor dead-letters the start meanwhile.
    deadline = time.monotonic() + 90
    while "RegistryError: no schema registry answers at" not in worker.log_tail(200):
        assert worker.alive, worker.log_tail()
        assert time.monotonic() < deadline, f"no word of the registry:\n{worker.log_tail()}"
        time.sleep(0.2)
    assert ledger is not None
    assert len(ledger.settle(3.0)) == 1  # no decision on r-older...
    dead = TopicReader(framed, topics.deadletter, DeadLetter)
    try:
        assert dead.settle(1.0) == []  # ...and not dead-lettered: it waits for the registry
    finally:
        dead.close()
        ledger.close()
    assert worker.alive, worker.log_tail()
    said = worker.log_tail(400).count("no schema registry answers")
    assert said <= 2, f"the outage said {said} times:\n{worker.log_tail()}"
    assert worker.stop(timeout=15) == 0, worker.log_tail()
