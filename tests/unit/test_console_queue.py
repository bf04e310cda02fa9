"""The console's overview of a queue over the last hour (`GET /inspect/overview`'s
`queue_per_minute`), from ledger rows in memory."""

from __future__ import annotations

import time

from sluicegate.ops.services.flow import compute
from sluicegate.ops.services.ledger import LedgerDb, fill
from sluicegate.ops.services.overview import overview
from sluicegate.schemas.records import Outcome
from tests.unit.test_console import queued, rec


def test_the_overview_shows_each_minute_s_queue_depth_and_oldest_wait_over_the_hour() -> None:
    now = int(time.time() * 1000)
    m = now - now % 60_000  # the minute under way
    db = LedgerDb(":memory:")
    fill(db, [
        # Waits from 10 minutes ago to 5 minutes ago.
        queued("q1", m - 10 * 60_000, "perTenant", "concurrency", "acme"),
        rec("q1", Outcome.admitted, m - 5 * 60_000, execution_id="e1"),
        # Queued 3 minutes ago, its debounce group waiting since a minute before; still waits.
        queued("q2", m - 3 * 60_000, "perTenant", "debounce", "acme", waited_ms=60_000),
        # Admitted at once: never in the queue.
        rec("a1", Outcome.admitted, m - 8 * 60_000, execution_id="e2"),
        # Ended before the hour: not shown.
        queued("old", m - 3 * 3600_000, "perTenant", "concurrency", "acme"),
        rec("old", Outcome.expired, m - 2 * 3600_000),
    ])
    view = compute({}, {}, {}, now, declared=["perTenant", "stock"])
    doc = overview(db, view, frozenset({"perTenant", "stock"}))

    per_tenant, stock = doc["workflows"]
    # Each minute is seen at its end: the minute q1 was queued in, up to its last whole one.
    points = {p["minute_ms"]: (p["queued"], p["oldest_wait_ms"])
              for p in per_tenant["queue_per_minute"]}
    for i, minute in enumerate(range(m - 11 * 60_000, m - 6 * 60_000, 60_000)):
        assert points[minute] == (1, i * 60_000), i
    assert m - 6 * 60_000 not in points and m - 5 * 60_000 not in points
    assert points[m - 2 * 60_000] == (1, 3 * 60_000)  # seen at m - 1 min: since m - 4 min
    assert all(minute >= doc["since_ms"] for minute in points)
    assert stock["queue_per_minute"] == []
