"""Rolling upgrades across a schema change, on the real broker (docs/decisions/
schema-evolution.md): a worker of the next release reads what this one parked, and this
one dead-letters what the next release wrote instead of stopping on it.

The next release is this package copied, with one optional field added to PendingStart
and StartRequest (`evolved_package`), run as `sluicegate worker` from the copy: the
upgraded worker is a real other version of the code, and nothing in sluicegate exists
only for this test. Time is a file clock both workers read.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import uuid
from collections import Counter
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Producer
from fastavro.schema import to_parsing_canonical_form

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.engine.clock import CLOCK_FILE_ENV, FileClock
from sluicegate.schemas import codec
from sluicegate.schemas.codec import (
    RECORD_TYPES,
    SINGLE_OBJECT_MARKER,
    parse_writer_schema,
    schema_fingerprint,
)
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    Record,
    StartRequest,
)
from sluicegate.testing import TestDriver
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import ROOT, TopicReader, WorkerProcess

pytestmark = pytest.mark.broker

APP = "tests.apps.evolution"
MINUTE = 60_000
EVOLVED = (PendingStart, StartRequest)
# What the next release adds: an optional field with a default, as Avro's rules ask.
ADDED = {"name": "note", "type": ["null", "string"], "default": None,
         "doc": "Added by the next release."}


def added_field(schema: dict[str, Any]) -> dict[str, Any]:
    """The next release's schema (an .avsc or an inlined writer schema)."""
    return {**schema, "fields": [*schema["fields"], ADDED]}


def evolved_fingerprint(cls: type) -> bytes:
    return schema_fingerprint(to_parsing_canonical_form(added_field(RECORD_TYPES[cls].schema)))


def newer_frame(record: Record, note: str) -> bytes:
    """`record` as the next release writes it, with its added field set."""
    rs = RECORD_TYPES[type(record)]
    body = BytesIO()
    fastavro.schemaless_writer(body, parse_writer_schema(added_field(rs.schema)),
                               {**rs.to_avro(record), "note": note})
    return SINGLE_OBJECT_MARKER + evolved_fingerprint(type(record)) + body.getvalue()


def evolved_package(dest: Path) -> Path:
    """A copy of this package as its next release: each EVOLVED type's .avsc and class have
    the added field. Its history keeps this release's schemas."""
    package = dest / "sluicegate"
    shutil.copytree(ROOT / "sluicegate", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # The next release ships this one's schemas in its history (they need not be in a
    # released folder yet: this checkout may have changed one since the last release).
    this = package / "schemas" / "avro" / "history" / "this"
    this.mkdir()
    for avsc in (package / "schemas" / "avro").glob("*.avsc"):
        shutil.copy(avsc, this / avsc.name)
    records = package / "schemas" / "records.py"
    source = records.read_text()
    for cls in EVOLVED:
        avsc = package / "schemas" / "avro" / f"{RECORD_TYPES[cls].full_name}.avsc"
        avsc.write_text(json.dumps(added_field(json.loads(avsc.read_text())), indent=2))
        # The class's last field is followed by the next record's decorator.
        start = source.index(f"\nclass {cls.__name__}:\n")
        end = source.index("\n\n\n@record\n", start)
        source = source[:end] + "\n    note: str | None = None" + source[end:]
    records.write_text(source)
    return dest


def next_release_env(copy: Path) -> dict[str, str]:
    """Environment that runs `python -m sluicegate` from the copy in `copy`: PYTHONSAFEPATH
    keeps the working directory (this checkout) off the front of sys.path."""
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": f"{copy}:{ROOT}"}


def _produce(settings: Settings, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Values in this order on the partition of their key (the key of the first)."""
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    partition = partition_for(records[0][0], settings.partitions)
    for key, value in records:
        producer.produce(topic, value, key, partition)
    assert producer.flush(30) == 0


def _decided(rows: list[LedgerRecord], request_id: str) -> list[Outcome]:
    return [r.outcome for r in rows if r.request_id == request_id]


def _complete_runs(engine: Engine, admitted: TopicReader[AdmittedStart], want: int,
                   timeout: float = 90.0) -> None:
    """Be the engine: start and complete every run admitted, until `want` have been."""
    deadline = time.monotonic() + timeout
    while len(admitted.records) < want:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {len(admitted.records)} of {want} runs admitted")
        delivery = engine.poll(0.1)
        if delivery is not None and delivery.admitted is not None:
            engine.started(delivery)
            engine.completed(delivery.admitted.execution_id, delivery.admitted.workflow)
            engine.flush()
        admitted.poll(0.05)


def test_the_next_release_restores_and_admits_every_start_this_one_parked(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock_file = tmp_path / "clock"
    t0 = time.time_ns() // 1_000_000
    FileClock.write(clock_file, t0)
    clock = {CLOCK_FILE_ENV: str(clock_file)}
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    queue_rows = TopicReader(settings, topics.changelog("concurrency"), bytes)

    previous = WorkerProcess(settings, APP, tmp_path / "previous", **clock).start()
    with Client(app=APP, settings=settings, replies=False) as client:
        edits = {}
        for row in ("r1", "r2", "r3"):
            for edited_at in (1, 2):  # each waited for, so the second is the latest
                handle = client.submit("edit", {"rowId": row, "editedAt": edited_at})
                client.flush()
                ledger.until(lambda rows, r=handle.request_id: bool(_decided(rows, r)),
                             what=f"edit {row}/{edited_at} queued")
                edits[handle.request_id] = row
        parked = [client.submit("job", {"tenant": "t1", "n": n}).request_id for n in range(4)]
    ledger.until(lambda rows: all(_decided(rows, r) for r in parked), what="the jobs decided")
    assert Counter(_decided(ledger.records, r)[0] for r in parked) == {
        Outcome.admitted: 1, Outcome.queued: 3}
    # Per row, the latest edit waits; the earlier one collapsed into it.
    assert sorted(_decided(ledger.records, r) for r in edits) == (
        [[Outcome.queued]] * 3 + [[Outcome.queued, Outcome.collapsed]] * 3)
    assert previous.stop() == 0, previous.log_tail()

    # The next release, on a state dir of its own: it restores the stores from their
    # changelogs, rows this release wrote.
    next_release = evolved_package(tmp_path / "next")
    upgraded = WorkerProcess(settings, APP, tmp_path / "upgraded",
                             **clock, **next_release_env(next_release)).start()
    try:
        FileClock.write(clock_file, t0 + 6 * MINUTE)  # the debounce period is 5 minutes
        with Engine(settings=settings, group=f"engine-{uuid.uuid4().hex[:6]}") as engine:
            _complete_runs(engine, admitted, want=3 + 4)
            # A start after the upgrade is written with the next release's schema.
            with Client(app=APP, settings=settings, replies=False) as client:
                after = client.submit("job", {"tenant": "t1", "n": 4}).request_id
            _complete_runs(engine, admitted, want=3 + 4 + 1)
        ledger.until(lambda rows: all(Outcome.admitted in _decided(rows, r)
                                      for r in [*parked, after]), what="the jobs admitted")
        assert upgraded.alive, upgraded.log_tail()
    finally:
        upgraded.stop()

    runs = admitted.settle(1.0)
    by_row = {json.loads(a.payload)["rowId"]: a for a in runs if a.workflow == "edit"}
    assert sorted(by_row) == ["r1", "r2", "r3"]
    for row, run in by_row.items():
        assert json.loads(run.payload)["editedAt"] == 2  # the latest edit's payload
        assert sorted(run.request_ids) == sorted(r for r, of in edits.items() if of == row)
    assert sorted(json.loads(a.payload)["n"] for a in runs if a.workflow == "job") == [
        0, 1, 2, 3, 4]
    assert TopicReader(settings, topics.deadletter, DeadLetter).settle(0.5) == []
    # The three starts this release parked are the queue rows it logged, in its schema,
    # which the next release restored and admitted. (Within one worker a start reaches
    # the concurrency stage handed over, not through its topic:
    # docs/decisions/in-process-handover.md; a newer release's record on a stage's topic
    # is the next test's.)
    headers = Counter(frame[2:10] for frame in queue_rows.settle(0.5) if frame)
    assert headers[codec.fingerprint(PendingStart)] == 3


def test_this_release_dead_letters_what_the_next_one_wrote_and_decides_what_follows(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock_file = tmp_path / "clock"
    t0 = time.time_ns() // 1_000_000
    FileClock.write(clock_file, t0)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    letters = TopicReader(settings, topics.deadletter, DeadLetter)
    worker = WorkerProcess(settings, APP, tmp_path / "w", **{CLOCK_FILE_ENV: str(clock_file)})
    worker.start()
    try:
        with Client(app=APP, settings=settings, replies=False) as client:
            first = client.submit("edit", {"rowId": "r9", "editedAt": 1}).request_id
            ledger.until(lambda rows: bool(_decided(rows, first)), what="the first edit")
            # What an identity stage sends on to debounce for such a start (the test
            # driver's, alone): its key and shape are what a worker of the next release
            # would send there too.
            with TestDriver(load_app(APP), settings, stages=("identity",)) as driver:
                driver.start("edit", {"rowId": "r9", "editedAt": 1})
                (sent,) = driver.sent(topics.stage("defer"))
            assert sent.key is not None and sent.value is not None
            newer_pending = newer_frame(dataclasses.replace(
                codec.decode(PendingStart, sent.value), request_id="from-next",
                request_ids=["from-next"]), "next")
            _produce(settings, topics.stage("defer"), [(sent.key, newer_pending)])
            behind_pending = client.submit("edit", {"rowId": "r9", "editedAt": 2}).request_id

        # On the starts topic: a newer producer's start, then a valid one on its partition.
        def start(request_id: str) -> StartRequest:
            return StartRequest(request_id=request_id, workflow="edit", origin=Origin.event,
                                payload=b'{"rowId":"r8","editedAt":1}', requested_at_ms=t0)

        _produce(settings, topics.starts, [(b"r8", newer_frame(start("newer"), "next")),
                                           (b"r8", codec.encode(start("behind-newer")))])

        ledger.until(lambda rows: all(_decided(rows, r) == [Outcome.queued]
                                      for r in (behind_pending, "behind-newer")),
                     what="the starts behind the newer records queued")
        assert _decided(ledger.records, first) == [Outcome.queued, Outcome.collapsed]
        letters.until(lambda rows: len(rows) >= 2, what="two dead letters")
        FileClock.write(clock_file, t0 + 6 * MINUTE)
        admitted.until(lambda runs: len(runs) >= 2, what="the debounced runs")
        assert worker.alive, worker.log_tail()
    finally:
        worker.stop()

    newer = "written by a newer version (or an unknown writer): expected {}, unknown schema" \
            " fingerprint {}"
    by_topic = {letter.source_topic: letter for letter in letters.settle(0.5)}
    assert sorted(by_topic) == sorted([topics.starts, topics.stage("defer")])
    assert by_topic[topics.stage("defer")].value == newer_pending
    assert newer.format("io.sluicegate.PendingStart or io.sluicegate.CancelSweep",
                        evolved_fingerprint(PendingStart).hex()) in by_topic[
        topics.stage("defer")].reason
    assert newer.format("io.sluicegate.StartRequest", evolved_fingerprint(StartRequest).hex(
    )) in by_topic[topics.starts].reason
    rejected = [r for r in ledger.records if r.outcome is Outcome.rejected]
    assert len(rejected) == 2
    assert all("written by a newer version" in (r.reason or "") for r in rejected)
    runs = {json.loads(a.payload)["rowId"]: a for a in admitted.settle(0.5)}
    assert runs["r9"].request_ids == [first, behind_pending]
    assert runs["r8"].request_ids == ["behind-newer"]
