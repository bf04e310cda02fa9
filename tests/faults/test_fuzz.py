"""Garbage among good starts: every record gets exactly one outcome, and none is skipped.

Records that cannot be starts (random bytes, truncated or foreign Avro, framings this
worker cannot read, empty values, 1 MB of noise), starts that are bad (an undeclared
workflow, a payload that does not validate, one too large to be admitted, an idempotency
key too large to be kept), and valid starts (some with a null or non-UTF-8 Kafka key,
one just under the payload limit) are produced interleaved. Each bad record must end as one
dead letter, with its reason and as much of its bytes as fits, and one `rejected` ledger
row; each valid start as one final decision.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer

from sluicegate.admission.stages.identity import salvage
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Origin, Outcome, StartRequest
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.faults import app
from tests.faults.harness import (
    APP,
    MARKS,
    CountingEngine,
    Outcomes,
    Traffic,
    check_invariants,
    request_id_of,
    scaled,
)
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

ONE_MB = 1_000_000


@dataclass
class Planned:
    what: str
    key: bytes | None
    value: bytes | None
    valid: bool  # a start that must be decided (else: rejected and dead-lettered)
    partition: int = -1
    offset: int = -1


def _start(builder: StartBuilder, workflow: str, payload: dict[str, object]) -> tuple[
        StartRequest, bytes]:
    return builder.build(workflow, payload)


def _valid(builder: StartBuilder, rng: random.Random, i: int) -> tuple[StartRequest, bytes]:
    kind = i % 4
    if kind == 0:
        return _start(builder, "note", {"text": f"n{i}"})
    if kind == 1:
        return _start(builder, "sendReceipt", {"orderId": f"o{rng.randrange(50)}", "amount": i})
    if kind == 2:
        return _start(builder, "gated", {"account": f"a{rng.randrange(5)}", "n": i})
    return _start(builder, "lowStockAlert", {"product": f"p{rng.randrange(40)}"})


def _raw_start(workflow: str, payload: bytes, **extra: object) -> StartRequest:
    return StartRequest(request_id=uuid.uuid4().hex, workflow=workflow, payload=payload,
                        origin=Origin.event, requested_at_ms=0, **extra)  # type: ignore[arg-type]


def plan(settings: Settings, rng: random.Random) -> list[Planned]:
    builder = StartBuilder(app, settings)
    records: list[Planned] = []
    for i in range(scaled(300)):
        start, key = _valid(builder, rng, i)
        records.append(Planned("valid", key, codec.encode(start), True))
    for i in range(scaled(300)):
        what = ["random", "truncated", "wrong schema", "unknown fingerprint",
                "registry framing", "undeclared", "bad payload", "empty"][i % 8]
        # A request id of its own: what can be read of a broken start names its rejection.
        template = codec.encode(_start(builder, "note", {"text": "template"})[0])
        body = template[10:]
        value: bytes | None
        if what == "random":
            value = rng.randbytes(rng.randrange(0, 300))
        elif what == "truncated":
            value = template[:rng.randrange(0, len(template))]
        elif what == "wrong schema":
            value = codec.encode(LedgerRecord(request_id="x", workflow="note",
                                              outcome=Outcome.admitted, requested_at_ms=0,
                                              decided_at_ms=0))
        elif what == "unknown fingerprint":
            value = b"\xc3\x01" + rng.randbytes(8) + body
        elif what == "registry framing":
            value = b"\x00" + (7).to_bytes(4, "big") + body
        elif what == "undeclared":
            value = codec.encode(_raw_start("nosuch", b'{"text":"x"}'))
        elif what == "bad payload":
            value = codec.encode(_raw_start("note", b'{"txt":1}'))
        else:
            value = None
        records.append(Planned(what, uuid.uuid4().hex.encode(), value, False))
    # Valid starts behind odd Kafka keys: the key only places them.
    for what, key in (("null key", None), ("non-UTF-8 key", b"\xff\xfe\x00k")):
        for _ in range(scaled(10)):
            start, _ = _start(builder, "note", {"text": what})
            records.append(Planned(what, key, codec.encode(start), True))
    # A megabyte of noise, within what the broker takes.
    for _ in range(3):
        records.append(Planned("1 MB of noise", b"big", rng.randbytes(ONE_MB), False))
    # A start just under the payload limit is admitted; one over it is refused with the
    # reason, though its request fits on the broker.
    room = settings.max_payload_bytes - len(b'{"text":""}')
    near, _ = _start(builder, "note", {"text": "x" * (room - 100)})
    records.append(Planned("valid, near the payload limit", near.request_id.encode(),
                           codec.encode(near), True))
    over = _raw_start("note", json.dumps({"text": "y" * (room + 10_000)}).encode())
    records.append(Planned("over the payload limit", over.request_id.encode(),
                           codec.encode(over), False))
    # An idempotency key too large to be kept: its start cannot be processed at all.
    huge = _raw_start("sendReceipt", b'{"orderId":"o1","amount":1}',
                      idempotency_id="k" * (ONE_MB + 10_000))
    records.append(Planned("idempotency key of 1 MB", huge.request_id.encode(),
                           codec.encode(huge), False))
    rng.shuffle(records)
    return records


def produce(settings: Settings, records: list[Planned]) -> None:
    producer = Producer(settings.client_config(**{
        "partitioner": "murmur2_random", "message.max.bytes": 1_040_000}))
    topic = Topics(settings).starts

    def placed(item: Planned) -> object:
        def done(err: object, msg: object) -> None:
            assert err is None, f"{item.what}: {err}"
            item.partition, item.offset = msg.partition(), msg.offset()  # type: ignore[attr-defined]
        return done

    for item in records:
        producer.produce(topic, item.value, item.key, on_delivery=placed(item))
        producer.poll(0)
    assert producer.flush(60) == 0


def test_every_fuzzed_record_has_exactly_one_outcome(settings: Settings,
                                                     tmp_path: Path) -> None:
    create_topics(settings)
    records = plan(settings, random.Random(14))
    produce(settings, records)
    starts = Topics(settings).starts
    valid = {request_id_of(r.value): r for r in records if r.valid}
    bad = {(r.partition, r.offset): r for r in records if not r.valid}
    # The request id a rejection is recorded under: its own when it has one, else what can
    # be read of it (docs/decisions/matchable-rejections.md), else where it was read.
    rejected_as = {
        request_id_of(r.value) or salvage(InputRecord(
            starts, r.partition, r.offset, r.key, r.value, 0), settings.partitions).request_id
        or f"{starts}:{r.partition}:{r.offset}": r
        for r in bad.values()}
    assert len(rejected_as) == len(bad), "each bad record is rejected under an id of its own"
    outcomes = Outcomes(settings)
    worker = WorkerProcess(settings, APP, tmp_path / "w").start()
    try:
        with CountingEngine(settings) as engine:
            outcomes.wait_until_decided({*valid, *rejected_as}, timeout_s=240)  # type: ignore[arg-type]
            outcomes.settle()
        assert worker.alive, worker.log_tail()
    finally:
        worker.stop()
        outcomes.close()

    final = outcomes.final()
    for request_id, item in rejected_as.items():
        rows = final[request_id]
        assert [row.outcome for row in rows] == [Outcome.rejected], (item.what, rows)
        assert rows[0].reason, item.what
    letters = Counter((d.source_partition, d.source_offset) for d in
                      outcomes.deadletters.records if d.source_topic == starts)
    assert set(letters) == set(bad), "every bad record, and only those, is dead-lettered"
    assert max(letters.values()) == 1, "no record is dead-lettered twice"
    by_place = {(d.source_partition, d.source_offset): d for d in outcomes.deadletters.records}
    for place, item in bad.items():
        letter = by_place[place]
        assert letter.reason, item.what
        if item.value is not None and len(item.value) >= ONE_MB:
            # Too large to be copied whole beside its reason: cut to fit, and said so.
            assert "cut to its first" in letter.reason, letter.reason
            assert letter.value is not None and item.value.startswith(letter.value)
        else:
            assert letter.value == item.value, item.what
    near = next(r for r in records if r.what == "valid, near the payload limit")
    assert final[request_id_of(near.value)][0].outcome is Outcome.admitted  # type: ignore[index]
    over = next(r for r in records if r.what == "over the payload limit")
    assert "limit of a start's payload" in (final[request_id_of(over.value)][0].reason or "")  # type: ignore[index]
    traffic = Traffic({rid: "" for rid in valid if rid is not None})
    check_invariants(outcomes, traffic, engine)
