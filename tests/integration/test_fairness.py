"""A declared fairness key on the real broker: a pool's waiting starts are served
round-robin across tenants (a weighted tenant taking its turns in a row), so a small
tenant's starts do not wait behind a big tenant's backlog, and their queue positions say
so."""

from __future__ import annotations

import json

import pytest

from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.schemas.records import LedgerRecord, Outcome, RunEventKind
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.integration.test_concurrency import APP, StepEngine, produce_in_order

pytestmark = pytest.mark.broker


def test_a_pool_with_a_fairness_key_takes_turns_across_tenants(settings: Settings) -> None:
    app = load_app(APP)
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    engine = StepEngine(settings)
    starts = ([("fairByTenant", {"tenant": "big", "n": i}) for i in range(12)]
              + [("fairByTenant", {"tenant": "small", "n": 100 + i}) for i in range(3)]
              + [("fairByTenant", {"tenant": "gold", "n": 200 + i}) for i in range(4)])
    try:
        with WorkerThread(app, settings):
            ids = produce_in_order(settings, starts)
            running = engine.next_admitted()
            ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows)
                         >= len(starts) - 1, timeout=15, what="every other start queued")
            order = [json.loads(running.payload)["tenant"]]
            for _ in range(len(starts) - 1):
                engine.report(running, RunEventKind.completed)
                running = engine.next_admitted()
                order.append(json.loads(running.payload)["tenant"])
    finally:
        engine.close()
    # big's first start took the slot; then each tenant its turn, gold two in a row.
    assert order[:9] == ["big", "big", "small", "gold", "gold",
                         "big", "small", "gold", "gold"]
    assert order[9:] == ["big", "small"] + ["big"] * 8
    position = {r.request_id: r.position for r in ledger.records if r.outcome is Outcome.queued}
    # Their place among their tenant's starts, not behind big's eleven.
    assert [position[i] for i in ids[12:15]] == [0, 1, 2]
