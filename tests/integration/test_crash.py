"""kill -9 at random moments: every request still gets exactly one decision, and nothing
is admitted twice (SPEC.md: exactly-once processing)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerProcess

pytestmark = pytest.mark.broker

STARTS = 50_000
# Of every five starts: three new orders, one repeat of an earlier order, one passthrough.
UNIQUE_ORDERS = STARTS * 3 // 5


def _produce(settings: Settings) -> None:
    app = load_app("tests.apps.identity")
    rng = random.Random(11)
    with Client(app=app, settings=settings, replies=False) as client:
        for i in range(STARTS):
            if i % 5 == 4:
                client.submit("note", {"text": f"n{i}"})
            elif i % 5 == 3:
                # A repeat of an order already produced (i - 3 is always a fresh order).
                earlier = rng.randrange(i // 5 + 1) * 5
                client.submit("sendReceipt", {"orderId": f"o{earlier}", "amount": -1})
            else:
                client.submit("sendReceipt", {"orderId": f"o{i}", "amount": i})


def _check(ledger: list[LedgerRecord], admitted: list[AdmittedStart]) -> None:
    per_request = Counter(row.request_id for row in ledger)
    assert len(per_request) == STARTS, "every request has a decision"
    assert max(per_request.values()) == 1, "no request has two decisions"
    executions = Counter(a.execution_id for a in admitted)
    assert max(executions.values()) == 1, "no execution admitted twice"
    admitted_keys = Counter(row.key for row in ledger
                            if row.outcome is Outcome.admitted and row.workflow == "sendReceipt")
    assert max(admitted_keys.values()) == 1, "no idempotency key admitted twice"
    assert len(admitted) == sum(1 for row in ledger if row.outcome is Outcome.admitted)
    assert len(admitted_keys) == UNIQUE_ORDERS
    spent = {row.key: row.execution_id for row in ledger if row.outcome is Outcome.admitted}
    for row in ledger:
        if row.outcome is Outcome.existing:
            assert row.execution_id == spent[row.key]


def _kill_loop(workers: list[WorkerProcess], ledger: TopicReader, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    done = 0
    while done < kills:
        # Let the work move on by a random amount, then kill one worker mid-flight.
        target = len(ledger.records) + rng.randint(500, 4000)
        ledger.until(lambda rows, t=target: len(rows) >= t or len(rows) >= STARTS * 0.95,
                     timeout=120, what="progress before a kill")
        if len(ledger.records) >= STARTS * 0.95:
            break
        victim = rng.choice(workers)
        victim.kill()
        done += 1
        victim.start()
    assert done >= kills, f"only {done} kills happened before the work ran out"


@pytest.mark.parametrize("workers", [1, 2])
def test_kill_minus_nine_loses_and_duplicates_nothing(settings: Settings, tmp_path: Path,
                                                      workers: int) -> None:
    settings = settings.with_(commit_interval_ms=50, commit_max_records=500)
    create_topics(settings)
    topics = Topics(settings)
    _produce(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    procs = [WorkerProcess(settings, "tests.apps.identity", tmp_path / f"w{i}").start()
             for i in range(workers)]
    try:
        _kill_loop(procs, ledger, kills=5, seed=workers)
        ledger.until(lambda rows: len({r.request_id for r in rows}) >= STARTS, timeout=240,
                     what="a decision for every request")
        ledger.settle(2.0)
        admitted.until(lambda rows: len(rows) >= sum(
            1 for r in ledger.records if r.outcome is Outcome.admitted), timeout=60,
            what="every admitted start")
        admitted.settle(1.0)
    finally:
        for p in procs:
            if p.alive:
                p.stop()
    _check(ledger.records, admitted.records)


def test_sigterm_commits_what_is_done_and_exits_cleanly(settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    app = load_app("tests.apps.identity")
    with Client(app=app, settings=settings, replies=False) as client:
        for i in range(2000):
            client.submit("note", {"text": f"n{i}"})
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    worker = WorkerProcess(settings, "tests.apps.identity", tmp_path / "w").start()
    ledger.until(lambda rows: len(rows) >= 2000, timeout=120, what="2,000 decisions")
    assert worker.stop(timeout=30) == 0, worker.log_tail()
    assert len(ledger.settle(1.0)) == 2000
