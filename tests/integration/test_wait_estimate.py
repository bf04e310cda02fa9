"""When will it go, on the real broker (issue 35, point 5): in a steady run through a
concurrency limit, the estimate a queued start is given is within 2x of the wait it then
actually has; for a limit that is the last step of its route, and for one followed by
another limit (a pool), where the estimate is of the wait for the first limit's slot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import App, load_app
from sluicegate.ops.services.ledger import LedgerDb, refresh
from sluicegate.ops.services.waiting import waiting_starts
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.integration.test_concurrency import HoldingEngine

pytestmark = pytest.mark.broker

# tests.apps.concurrency's perTenant: at most 5 in flight per tenant. Each run is held
# about a second, so the line moves at about 5 a second less the broker's round trips.
HOLD_S = (0.8, 1.2)
# Starts arrive faster than that for long enough to form a line and to pace it.
ARRIVAL_S = 0.12
STEADY_S = 15.0


@pytest.mark.parametrize(("module", "workflow", "basis"), [
    ("tests.apps.concurrency", "perTenant", "ahead, "),
    # The pool after it never holds a start: the wait for the first slot is the wait.
    ("tests.apps.estimate", "perTenantPooled", "for a slot of this limit: "),
])
def test_the_estimate_for_a_queued_start_is_within_2x_of_its_real_wait(
        settings: Settings, tmp_path: Path, module: str, workflow: str, basis: str) -> None:
    app: App = load_app(module)
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    with WorkerThread(app, settings), HoldingEngine(settings, hold_s=HOLD_S), \
            Client(app=app, settings=settings, replies=False) as client:
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < STEADY_S:
            client.submit(workflow, {"tenant": "acme", "n": n})
            client.flush()
            n += 1
            time.sleep(ARRIVAL_S)

        with LedgerDb(tmp_path / "ledger.duckdb") as db:
            refresh(db, settings)
            now_ms = int(time.time() * 1000)
            waiting = waiting_starts(db, {}, app=app, workflow=workflow, key="acme",
                                     now_ms=now_ms)
        assert len(waiting) >= 10, f"a line formed: {len(waiting)} waiting"
        last = waiting[-1]
        assert last.estimate_ms is not None, last.why
        assert basis in last.why and "runs a minute over the last" in last.why, last.why

        ledger.until(lambda rows: any(r.request_id == last.request_id
                                      and r.outcome is Outcome.admitted for r in rows),
                     timeout=120, what="the last start in line admitted")
    admitted = next(r for r in ledger.records
                    if r.request_id == last.request_id and r.outcome is Outcome.admitted)
    waited_ms = admitted.decided_at_ms - now_ms
    assert last.estimate_ms / 2 <= waited_ms <= last.estimate_ms * 2, (
        f"estimated {last.estimate_ms} ms ({last.why}), waited {waited_ms} ms")
