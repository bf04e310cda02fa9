"""`sluicegate ledger` on the real broker: SQL answers over sg.ledger, incrementally."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from typer.testing import CliRunner

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.ops.cli.root import app as cli
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

MIN = 60_000


def _produce(settings: Settings, records: list[LedgerRecord]) -> None:
    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    for record in records:
        # Keyed by request id, as the workers write it: a request's rows share a partition.
        producer.produce(Topics(settings).ledger, codec.encode(record),
                         record.request_id.encode())
    assert producer.flush(30) == 0


def _ledger(settings: Settings, db: Path, *args: str) -> list[dict[str, Any]]:
    env = {"SLUICEGATE_BOOTSTRAP": settings.bootstrap,
           "SLUICEGATE_NAMESPACE": settings.namespace}
    result = CliRunner().invoke(cli, ["ledger", *args, "--format", "json", "--db", str(db)],
                                env=env)
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def _rec(request_id: str, outcome: Outcome, at_ms: int, **more: Any) -> LedgerRecord:
    return LedgerRecord(request_id=request_id, workflow=more.pop("workflow", "tourNarration"),
                        outcome=outcome, requested_at_ms=at_ms, decided_at_ms=at_ms, **more)


def test_the_three_questions_answer_from_the_topic_and_a_second_query_reads_only_new_rows(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    db = tmp_path / "ledger.duckdb"
    t0 = int(time.time() * 1000) - 60 * MIN
    edits = [_rec(f"edit{i}", Outcome.queued, t0 + i * MIN, key="tour:7", deferral="debounce")
             for i in range(20)]
    edits += [_rec(f"edit{i}", Outcome.collapsed, t0 + (i + 1) * MIN, key="tour:7",
                   execution_id="e1") for i in range(19)]
    edits.append(_rec("edit19", Outcome.admitted, t0 + 35 * MIN, execution_id="e1",
                      folded=19))
    parked = _rec("embed1", Outcome.queued, t0 + 30 * MIN, workflow="embed", key="tenant-a",
                  deferral="concurrency")
    dropped = _rec("hot1", Outcome.dropped, t0 + 40 * MIN, workflow="embed", key="tenant-b",
                   stage="ratelimit", reason="over rateLimit 100 per 1 minute", retry_after_ms=900)
    _produce(settings, [*edits, parked, dropped])

    (lost,) = _ledger(settings, db, "ask", "lost")
    assert (lost["run"], lost["collapsed"], lost["folded"], lost["lost"]) == ("e1", 19, 19, 0)

    waiting = [r for r in _ledger(settings, db, "ask", "stuck") if r["state"] == "waiting"]
    assert [(r["workflow"], r["key"], r["queued"]) for r in waiting] == [("embed", "tenant-a", 1)]
    assert waiting[0]["waiting"].startswith("30m")  # queued half an hour ago

    (why,) = _ledger(settings, db, "ask", "why", "--request-id", "hot1")
    assert (why["outcome"], why["reason"]) == ("dropped", "over rateLimit 100 per 1 minute")

    count = "SELECT count(*) AS n FROM ledger"
    assert _ledger(settings, db, "query", count) == [{"n": 42}]
    _produce(settings, [_rec("embed1", Outcome.admitted, t0 + 59 * MIN, workflow="embed",
                             execution_id="e9")])
    assert _ledger(settings, db, "query", count) == [{"n": 43}]
    assert _ledger(settings, db, "query", count) == [{"n": 43}]
    assert _ledger(settings, db, "query",
                   "SELECT count(*) AS n FROM ledger WHERE request_id = 'embed1'") == [{"n": 2}]
    assert [r["state"] for r in _ledger(settings, db, "ask", "stuck", "--no-refresh")] == [
        "quiet: nothing waiting", "quiet: nothing waiting"]


def test_a_worker_deciding_five_starts_with_two_repeats_answers_admitted_three_existing_two(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    app = load_app("tests.apps.identity")
    with Client(app=app, settings=settings, replies=False) as client:
        for order in ["o1", "o2", "o3", "o1", "o2"]:
            client.submit("sendReceipt", {"orderId": order, "amount": 1})
    reader = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    try:
        with WorkerThread(app, settings):
            reader.until(lambda rows: len(rows) >= 5, what="five decisions")
    finally:
        reader.close()

    rows = _ledger(settings, tmp_path / "ledger.duckdb", "query",
                   "SELECT outcome, count(*) AS n FROM ledger GROUP BY outcome ORDER BY outcome")
    assert rows == [{"outcome": "admitted", "n": 3}, {"outcome": "existing", "n": 2}]
