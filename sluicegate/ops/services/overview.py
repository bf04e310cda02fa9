"""The console's documents over the ledger copy: the overview of every workflow and the
newest decisions (`GET /inspect/overview`, `GET /inspect/decisions`; docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, timedelta
from typing import Any

from sluicegate.ops.services.flow import FlowView, WorkflowFlow, override_json
from sluicegate.ops.services.formatting import iso
from sluicegate.ops.services.ledger import LedgerDb, utc_now

OUTCOMES = ("admitted", "existing", "collapsed", "dropped", "rejected", "expired", "failed",
            "cancelled")

# The requests with each counted outcome; failed and cancelled also count rows about runs
# (`run:<execution id>:...`: timeouts.finish, a bulk cancel).
_COUNTED = f"""
  outcome IN ({", ".join(f"'{o}'" for o in OUTCOMES)})
  AND (outcome IN ('failed', 'cancelled') OR NOT starts_with(request_id, 'run:'))
"""

OVERVIEW_SQL = f"""
SELECT workflow, outcome, count(DISTINCT request_id) AS n
FROM ledger WHERE {_COUNTED}
GROUP BY ALL ORDER BY ALL
"""

SERIES_SQL = f"""
SELECT workflow, epoch_ms(date_trunc('minute', decided_at)) AS minute, outcome,
       count(DISTINCT request_id) AS n
FROM ledger WHERE decided_at >= $since AND {_COUNTED}
GROUP BY ALL ORDER BY ALL
"""

# Per workflow and minute of the last hour: the starts waiting at the minute's end (or now,
# for the minute under way), and how long the oldest of them had waited then (from when its
# group began waiting, as the flow view's `waiting=`). A start waits from its first queued
# row to its first row of any other outcome.
QUEUE_SERIES_SQL = """
WITH spans AS (
    SELECT workflow, request_id,
           min(decided_at) FILTER (WHERE outcome = 'queued') AS queued_at,
           min(least(requested_at, decided_at - to_milliseconds(waited_ms)))
               FILTER (WHERE outcome = 'queued') AS waiting_since,
           min(decided_at) FILTER (WHERE outcome <> 'queued') AS ended_at
    FROM ledger
    WHERE NOT starts_with(request_id, 'run:')
    GROUP BY ALL
    HAVING queued_at IS NOT NULL AND (ended_at IS NULL OR ended_at >= $since)
), instants AS (
    SELECT minute, least(minute + INTERVAL 1 MINUTE, $now) AS at
    FROM (SELECT unnest(generate_series($since, $now, INTERVAL 1 MINUTE)) AS minute)
)
SELECT s.workflow, epoch_ms(i.minute) AS minute, count(*) AS queued,
       max(epoch_ms(i.at) - epoch_ms(s.waiting_since)) AS oldest_ms
FROM spans s JOIN instants i
  ON s.queued_at <= i.at AND (s.ended_at IS NULL OR s.ended_at > i.at)
GROUP BY ALL ORDER BY ALL
"""

DECISIONS_SQL = """
SELECT decided_at, workflow, outcome, key, execution_id, reason, request_id, deferral
FROM ledger
WHERE $workflow IS NULL OR workflow = $workflow
ORDER BY decided_at DESC, _partition DESC, _offset DESC
LIMIT $limit
"""


def _fullest(flow: WorkflowFlow | None) -> dict[str, Any] | None:
    """The key with the most runs in flight against a keyed limit, if any (`declared`:
    the declared limit, when the key's own comes from the limits table)."""
    keyed = [k for k in (flow.keys if flow is not None else ()) if k.limit is not None]
    if not keyed:
        return None
    key = max(keyed, key=lambda k: (k.in_flight / (k.limit or 1), k.in_flight))
    fullest = {"key": key.key, "in_flight": key.in_flight, "limit": key.limit}
    if key.limit_row is not None:
        fullest["declared"] = key.declared
    return fullest


def overview(db: LedgerDb, view: FlowView, declared: Collection[str] = ()) -> dict[str, Any]:
    """Per workflow: decisions by outcome, per minute over the last hour, queued and in
    flight beside the limit(s), the queue's depth and oldest wait per minute over the last
    hour, and the pause; per pool, its members' runs in flight beside its limit.
    `declared`: the declared workflows, each listed (and marked)."""
    totals: dict[str, dict[str, int]] = {}
    for wf, outcome, n in db.query(OVERVIEW_SQL).rows:
        totals.setdefault(str(wf), {})[str(outcome)] = int(n)
    since = utc_now().replace(second=0, microsecond=0) - timedelta(minutes=59)
    series: dict[str, dict[int, dict[str, int]]] = {}
    for wf, minute, outcome, n in db.query(SERIES_SQL, {"since": since}).rows:
        series.setdefault(str(wf), {}).setdefault(int(minute), {})[str(outcome)] = int(n)
    now = utc_now()
    queue: dict[str, list[dict[str, int]]] = {}
    for wf, minute, n, oldest_ms in db.query(QUEUE_SERIES_SQL,
                                             {"since": since, "now": now}).rows:
        queue.setdefault(str(wf), []).append({"minute_ms": int(minute), "queued": int(n),
                                              "oldest_wait_ms": max(0, int(oldest_ms))})
    flows = {w.workflow: w for w in view.workflows}
    names = sorted(set(flows) | set(totals) | set(declared))
    out = []
    for name in names:
        flow = flows.get(name)
        total = flow.total() if flow is not None else None
        pause = flow.pause if flow is not None else None
        out.append({
            "workflow": name,
            "declared": name in declared if declared else None,
            "counts": {o: totals.get(name, {}).get(o, 0) for o in OUTCOMES},
            "queued": total.queued if total else 0,
            "waiting": total.waiting if total else None,
            "in_flight": total.in_flight if total else 0,
            # An unkeyed limit's (the whole workflow's), and the fullest key of a keyed one.
            "limit": total.limit if total else None,
            "fullest_key": _fullest(flow),
            # The operator's override of the workflow's own limit, while one is in force.
            "override": override_json(flow.override if flow is not None else None),
            # A workflow with two limits: its own ones in force, each with its override.
            "limits": flow.to_json()["limits"] if flow is not None else [],
            "paused": bool(flow and flow.paused),
            "pause": None if pause is None else {
                "paused": pause.paused, "at_ms": pause.at_ms, "reason": pause.reason,
                "by": pause.by},
            "per_minute": [{"minute_ms": m, **c} for m, c in sorted(
                series.get(name, {}).items())],
            "queue_per_minute": queue.get(name, []),
        })
    return {"now_ms": view.now_ms,
            "since_ms": int(since.replace(tzinfo=UTC).timestamp() * 1000),
            "workflows": out, "pools": [p.to_json() for p in view.pools],
            "limits_topic": view.limits_topic}


def decisions(db: LedgerDb, workflow: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest ledger rows (of `workflow`), newest first: the console's live tail."""
    rows = db.query(DECISIONS_SQL, {"workflow": workflow, "limit": limit})
    return [{"decided_at": iso(decided), "workflow": wf, "outcome": outcome, "key": key,
             "execution_id": execution_id, "reason": reason, "request_id": request_id,
             "deferral": deferral}
            for decided, wf, outcome, key, execution_id, reason, request_id, deferral
            in rows.rows]
