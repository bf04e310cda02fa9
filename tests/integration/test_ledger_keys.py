"""The ledger's `key` and `control` on the real broker: every row shows the key as the user
declared it (the key expression's value) and the control it belongs to
(docs/decisions/ledger-keys.md)."""

from __future__ import annotations

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.ledger_keys import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker


def test_rows_of_concurrency_limits_show_the_declared_key_and_which_limit_it_is(
        settings: Settings) -> None:
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    clock = ManualClock()
    with Client(app=app, settings=settings) as client, WorkerThread(app, settings, clock):
        first = client.start("twoLimits", {"tenant": "A", "region": "eu"}, wait_decision=True)
        # Tenant B is free, region eu is not: it waits for the second limit.
        by_region = client.start("twoLimits", {"tenant": "B", "region": "eu"},
                                 wait_decision=True)
        # Tenant A is busy: it waits for the first limit.
        by_tenant = client.start("twoLimits", {"tenant": "A", "region": "us"},
                                 wait_decision=True)
        silent = client.start("leasedByTenant", {"tenant": "t"}, wait_decision=True)
        assert [h.status for h in (first, by_region, by_tenant, silent)] == [
            "admitted", "queued", "queued", "admitted"]
        clock.advance(60_001)  # the silent run's lease runs out
        ledger.until(lambda rows: any(r.outcome is Outcome.lease_expired for r in rows),
                     what="the lease_expired row")

    def shown(request_id: str, outcome: Outcome) -> tuple[str | None, str | None]:
        (row,) = [r for r in ledger.records
                  if r.request_id == request_id and r.outcome is outcome]
        return row.key, row.control

    assert shown(first.request_id, Outcome.admitted) == ("eu", "concurrency[1]")
    assert shown(by_region.request_id, Outcome.queued) == ("eu", "concurrency[1]")
    assert shown(by_tenant.request_id, Outcome.queued) == ("A", "concurrency[0]")
    assert shown(silent.request_id, Outcome.admitted) == ("t", "concurrency")
    (lapsed,) = [r for r in ledger.records if r.outcome is Outcome.lease_expired]
    assert (lapsed.execution_id, lapsed.key, lapsed.control) == (
        silent.execution_id, "t", "concurrency")
