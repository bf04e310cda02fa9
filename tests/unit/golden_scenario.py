"""The scenario the golden examples of docs/wire-format.md come from (issue 36, point 4).

A worker's stages, run by the test driver over three partitions (so that every hop between
stages is a record on a topic, as between two workers), are given the inputs a producer,
an engine and an operator write: starts as the SDK builds them, engine reports, a bulk
cancel, a cancelOn event, garbage on `sg.starts`. One record of each type is picked from
what the stages write. tests/unit/test_wire_golden.py runs it again and compares each
record with its golden example, so a change of what a worker writes (a `command_id`'s
form, a key's) fails there until the golden file is written again, on purpose:

    python -m tests.unit.golden_scenario --write
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    CancelOn,
    Concurrency,
    Debounce,
    FailureReport,
    RateLimit,
    Workflow,
)
from sluicegate.schemas import codec
from sluicegate.schemas.codec import NAMED_TYPES, RECORD_TYPES, parse_writer_schema
from sluicegate.schemas.records import (
    AdmittedStart,
    CancelSweep,
    CommandKind,
    DeadLetter,
    EngineCommand,
    FailureReportRecord,
    IdentityAlias,
    KeyLimit,
    LedgerRecord,
    Outcome,
    PendingStart,
    Release,
    Reply,
    RunEvent,
    RunEventKind,
    RunOperation,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.testing import TestDriver, Written

GOLDEN = Path(__file__).resolve().parents[2] / "docs" / "wire-format" / "golden.json"
START_MS = 1_764_849_600_000  # 2025-12-04T12:00:00Z
REQUEST = "5b1e7c2a-0d4f-4e8b-9a61-2f3c4d5e6f70"
OPERATION = "6f2d8a1c4b3e4f5a9b8c7d6e5f4a3b2c"


class Tour(BaseModel):
    rowId: str
    tenantId: str
    editedAt: int


class Stock(BaseModel):
    productId: str


class Offboarded(BaseModel):
    tenantId: str


APP = App([
    Workflow(name="tourNarration", payload=Tour,
             idempotency="'tour:' + rowId + ':' + editedAt",
             debounce=Debounce(key="'tour:' + rowId", period="15 minutes"),
             concurrency=Concurrency(limit=5, key="tenantId"),
             cancel_on=[CancelOn(event="tenant.offboarded", schema=Offboarded,
                                 match="event.tenantId == payload.tenantId")],
             on_failure="narrationFailed"),
    Workflow(name="narrationFailed", payload=FailureReport),
    Workflow(name="lowStockAlert", payload=Stock,
             rate_limit=RateLimit(limit=1, period="30s", key="productId")),
    Workflow(name="generateReport", payload=Stock),
])


# The run holds one slot: its row's `keys` is then a map of one entry, whose bytes are the
# same in every library (Avro leaves the order of a map's entries to the writer).


def _first(written: list[Written], cls: type[Any],
           where: Callable[[Any], bool] = lambda _: True) -> Any:
    for w in written:
        if w.value is None or w.value[2:10] != RECORD_TYPES[cls].fingerprint:
            continue
        record = codec.decode(cls, w.value)
        if where(record):
            return record
    raise LookupError(f"the scenario wrote no {cls.__name__} of the kind picked")


def records() -> dict[str, Any]:
    """One record of each type, by full name, as the worker's stages write it (inputs as
    their writers build them)."""
    with TestDriver(APP, Settings(partitions=3), start_ms=START_MS) as driver:
        topics = driver.topics
        # Two edits of one row: debounced into one run, the first one collapsed.
        driver.start("tourNarration", {"rowId": "row-42", "tenantId": "tenant-7",
                                       "editedAt": 2}, request_id="8c0d2e4f-6a7b-4c9d-8e1f-"
                                                                  "0a1b2c3d4e5f")
        driver.advance(1_000)
        driver.start("tourNarration", {"rowId": "row-42", "tenantId": "tenant-7",
                                       "editedAt": 3}, request_id=REQUEST, reply_partition=2)
        driver.advance(15 * 60_000)
        # A second alert within the rateLimit's window is dropped.
        driver.start("lowStockAlert", {"productId": "p2"}, request_id="alert-1")
        driver.start("lowStockAlert", {"productId": "p2"}, request_id="alert-2")
        driver.pipe(topics.starts, b"hello, world", b"req-77")
        driver.pause("generateReport", "upstream API incident")
        driver.limit("tourNarration", concurrency=2, reason="narration service returns 503s",
                     by="oncall@example.com")
        (run,) = [a for a in driver.admitted if a.workflow == "tourNarration"]
        driver.advance(250)
        driver.report(run.execution_id, RunEventKind.started, run_id="run-17")
        driver.advance(3_000)
        driver.pipe(topics.stage("runs"), RunOperation(
            operation=OPERATION, execution_id=run.execution_id, workflow=run.workflow,
            verb="cancel", issued_at_ms=driver.now_ms, reason="tenant offboarded (ticket "
            "OPS-1203) \u2014 stra\u00dfe"), run.execution_id)
        driver.advance(2_000)
        driver.report(run.execution_id, RunEventKind.failed, run_id="run-17",
                      retries_spent=3, error_tag="TimeoutError",
                      error_message="narration service: no answer in 30 s")
        driver.event("tenant.offboarded", {"tenantId": "tenant-7"})
        driver.commit()
        written = driver.sent()
    failure = _first(written, StartRequest, lambda s: s.workflow == "narrationFailed")
    report = json.loads(failure.payload)
    admitted = _first(written, AdmittedStart)
    picked = [
        _first(written, StartRequest, lambda s: s.request_id == REQUEST),
        admitted,
        _first(written, RunEvent, lambda e: e.kind is RunEventKind.failed),
        _first(written, RunOperation),
        _first(written, EngineCommand, lambda c: c.kind is CommandKind.cancel),
        _first(written, Reply, lambda r: r.outcome is Outcome.queued),
        _first(written, LedgerRecord, lambda r: r.outcome is Outcome.dropped),
        _first(written, RunRow, lambda r: r.status is RunStatus.failed),
        driver.control.rows["generateReport"],
        # A tenant's limit as `sluicegate limits set` writes it.
        KeyLimit(limit=20, at_ms=START_MS, reason="enterprise tier", by="billing-sync"),
        driver.control.overrides["concurrency:tourNarration"],
        _first(written, DeadLetter),
        FailureReportRecord(**{**report, "payload": json.dumps(
            report["payload"], separators=(",", ":")).encode()}),
        _first(written, PendingStart),
        _first(written, Release),
        _first(written, IdentityAlias),
        _first(written, CancelSweep),
        admitted.slots[0],
    ]
    return {RECORD_TYPES[type(r)].full_name: r for r in picked}


def avro_json(record: Any, full_name: str) -> Any:
    """A record in Avro's JSON encoding (unions as {"string": ...})."""
    rs = RECORD_TYPES[NAMED_TYPES[full_name]]
    out = io.StringIO()
    fastavro.json_writer(out, parse_writer_schema(rs.schema), [rs.to_avro(record)])
    return json.loads(out.getvalue())


def write() -> None:
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    live = records()
    for example in golden["records"]:
        record = live[example["type"]]
        example["value"] = avro_json(record, example["type"])
        frame = codec.encode(record)
        example["fingerprint"] = frame[2:10].hex()
        example["frame"] = frame.hex()
    GOLDEN.write_text(json.dumps(golden, indent=2, ensure_ascii=False) + "\n",
                      encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.unit.golden_scenario --write")
    write()
