"""One run or request, whole: `sluicegate runs show ID` and `GET /inspect/runs/ID`.

ID is an execution id (or the first characters of one, as the demo and the dashboard
print it), a request id, or an idempotency key. The answer joins two sources:

- the ledger (the incremental DuckDB copy of `sluicegate.ops.services.ledger`): every row
  of every request that names the run, in the order they were decided: queued, collapsed
  into the run, admitted, existing, cancelled with its reason, and the rows about the run
  itself (`run:<execution id>:...`: a lapsed lease, timeouts.finish, a bulk operation);
- the compacted runs table `sg.runs` (`RunsTable`, which the flow view, bulk operations
  and the name checks read too): the run's row, and each change of its status this
  reader saw (admitted, running, completed, ...); and the identity changelog
  (`RunsIndex`), for the run an idempotency key names.

A request still waiting has the why-waiting sentence of `sluicegate.ops.services.waiting`
beside its history: the time it goes, or, behind a concurrency limit, an estimate of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluicegate.admission.stages.identity import NAME as IDENTITY
from sluicegate.admission.stages.identity import spent_key_row
from sluicegate.config import Settings
from sluicegate.ops.services.formatting import iso
from sluicegate.ops.services.readers import TableReader
from sluicegate.schemas import codec
from sluicegate.schemas.records import ENDED, ControlRow, RunRow
from sluicegate.topology.keys import key_text
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.ops.services.ledger import LedgerDb

# The ledger (and DuckDB, ~0.1 s to import) is imported where a lookup needs it: the runs
# table alone (bulk operations, names) loads none of it.

# At most this many status changes are kept per run (a run that heartbeats for a day
# does not grow without bound); the row itself is always the latest.
MAX_CHANGES = 50
# The shortest execution id prefix looked up as a prefix (the demo prints 8 characters).
MIN_PREFIX = 6


class NotFound(LookupError):
    """Nothing in the ledger or the runs table has this id; the message says what was
    looked for."""


@dataclass(frozen=True, slots=True)
class StatusChange:
    status: str
    at_ms: int
    reason: str | None


class RunsTable:
    """The compacted `sg.runs`, read to its end and on: every run's latest row (`rows`,
    ended runs too), the live ones among them (`live`), and the changes of status seen
    since this reader began (a compacted topic keeps the latest row per run; the changes
    it still holds are read too). `refresh` reads on from where the last one stopped to
    the end each partition had when it began, and returns the partitions that did not get
    there in time (held by a transaction still open)."""

    def __init__(self, settings: Settings) -> None:
        self.rows: dict[str, RunRow] = {}
        self.live: dict[str, RunRow] = {}
        self.changes: dict[str, list[StatusChange]] = {}
        self._reader = TableReader(settings, Topics(settings).runs,
                                   f"{settings.namespace}runs-reader", self.apply)

    def refresh(self, timeout_s: float = 10.0) -> list[int]:
        return self._reader.read_on(timeout_s)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the topic."""
        if value is None:  # a tombstone: the run's row is gone, its history with it
            if key is not None:
                execution_id = key.decode(errors="replace")
                self.rows.pop(execution_id, None)
                self.live.pop(execution_id, None)
                self.changes.pop(execution_id, None)
            return
        try:
            row = codec.decode(RunRow, value)
        except codec.DecodeError:
            return  # not a run row; the runs stage never writes one
        self.rows[row.execution_id] = row
        if row.status in ENDED:
            self.live.pop(row.execution_id, None)
        else:
            self.live[row.execution_id] = row
        seen = self.changes.setdefault(row.execution_id, [])
        if not seen or seen[-1].status != row.status.value:
            seen.append(StatusChange(row.status.value, row.updated_at_ms, row.last_reason))
            del seen[:-MAX_CHANGES]

    def close(self) -> None:
        self._reader.close()


class RunsIndex:
    """What a lookup needs beside the ledger: the runs table (`runs`: the caller's when
    given, whose to close, else one of its own), and every idempotency key spent, with the
    run it names, from the identity stage's changelog (compacted too): a key names its run
    from its first start on, not only once a repeat answered `existing`. `refresh` reads
    both on from where the last one stopped."""

    def __init__(self, settings: Settings, runs: RunsTable | None = None) -> None:
        self.runs = runs if runs is not None else RunsTable(settings)
        self._own_runs = runs is None
        # idempotency key -> workflow -> the execution id it names
        self.keys: dict[str, dict[str, str]] = {}
        self._keys = TableReader(settings, Topics(settings).changelog(IDENTITY),
                                 f"{settings.namespace}runs-index", self.apply_key)

    @property
    def rows(self) -> dict[str, RunRow]:
        return self.runs.rows

    @property
    def changes(self) -> dict[str, list[StatusChange]]:
        return self.runs.changes

    def refresh(self, timeout_s: float = 10.0) -> None:
        self.runs.refresh(timeout_s)
        self._keys.read_on(timeout_s)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the runs table."""
        self.runs.apply(key, value)

    def apply_key(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the identity stage's changelog."""
        spent = None if key is None else spent_key_row(key, value)
        if spent is None:
            return
        workflow, text, execution_id = spent
        if execution_id is not None:
            self.keys.setdefault(text, {})[workflow] = execution_id
        elif text in self.keys:  # the key's ttl ran out: it names nothing any more
            self.keys[text].pop(workflow, None)
            if not self.keys[text]:
                del self.keys[text]

    def close(self) -> None:
        if self._own_runs:
            self.runs.close()
        self._keys.close()


# The ledger rows of a lookup. `ids`: the execution ids the id names (itself, the run a
# request was admitted, collapsed or answered `existing` as, the run of an idempotency
# key); `requests`: every request that names one of them, or the id itself.
LOOKUP_SQL = """
WITH ids AS (
    SELECT DISTINCT execution_id FROM ledger
    WHERE execution_id IS NOT NULL
      AND (execution_id = $id OR request_id = $id
           OR (key = $id AND control = 'idempotency')
           OR list_contains($keyed, execution_id)
           OR (length($id) >= $min_prefix AND starts_with(execution_id, $id)))
), requests AS (
    SELECT DISTINCT request_id FROM ledger
    WHERE request_id = $id OR (key = $id AND control = 'idempotency')
       OR execution_id IN (SELECT execution_id FROM ids)
)
SELECT request_id, workflow, outcome, decided_at, requested_at, waited_ms, folded, key,
       control, stage, reason, execution_id, retry_after_ms, deferral, due_at, position
FROM ledger
WHERE request_id IN (SELECT request_id FROM requests)
   OR execution_id IN (SELECT execution_id FROM ids)
ORDER BY decided_at, _partition, _offset
"""


def payload_text(payload: bytes | None) -> str | None:
    """The payload as its JSON text, or what it is when it is not JSON (a sealed copy)."""
    if payload is None:
        return None
    try:
        return json.dumps(json.loads(payload))
    except (UnicodeDecodeError, ValueError):
        return f"({len(payload)} bytes, not JSON: sealed, or another encoding)"


def payload_json(payload: bytes) -> dict[str, Any]:
    """A run's payload for a JSON document: `payload` the JSON value itself (an object, not
    its text), and `payload_note` saying what it is when it is not JSON (a sealed copy),
    with `payload` then null."""
    try:
        return {"payload": json.loads(payload), "payload_note": None}
    except (UnicodeDecodeError, ValueError):
        return {"payload": None, "payload_note": payload_text(payload)}


def run_json(row: RunRow, changes: list[StatusChange]) -> dict[str, Any]:
    return {
        "execution_id": row.execution_id, "workflow": row.workflow,
        "status": row.status.value, "admitted_at": iso(row.admitted_at_ms),
        "updated_at": iso(row.updated_at_ms), "ended_at": iso(row.ended_at_ms),
        "last_reason": row.last_reason, "retries_spent": row.retries_spent,
        "run_id": row.run_id, "declaration_version": row.declaration_version,
        "slots": [{"stage": s.stage, "key": key_text(s.key)} for s in row.slots],
        **payload_json(row.payload),
        "changes": [{"status": c.status, "at": iso(c.at_ms), "reason": c.reason}
                    for c in changes],
    }


def lookup(db: LedgerDb, runs: RunsIndex, ident: str,
           control_rows: dict[str, ControlRow] | None = None,
           now_ms: int | None = None) -> dict[str, Any]:
    """Everything known about `ident`: `matched` says what it was taken as, `runs` the
    run rows, `ledger` the history (oldest first), `waiting` why each of its requests
    still queued waits (a pause's from `control_rows`; "today" is `now_ms`'s, default the
    clock's). Raises NotFound when nothing has it."""
    ident = ident.strip()
    keyed = sorted(set(runs.keys.get(ident, {}).values()))
    result = db.query(LOOKUP_SQL, {"id": ident, "min_prefix": MIN_PREFIX, "keyed": keyed})
    rows = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    ids = sorted({str(r["execution_id"]) for r in rows if r["execution_id"]})
    own = [eid for eid in runs.rows if eid == ident
           or (len(ident) >= MIN_PREFIX and eid.startswith(ident))]
    if not rows and not own and not keyed:
        raise NotFound(f"no run or request has the id {ident!r} (looked for an execution "
                       "id or its first characters, a request id and an idempotency key)")
    if any(r["request_id"] == ident for r in rows):
        matched = "request id"
    elif ident in ids or ident in runs.rows:
        matched = "execution id"
    elif keyed or any(r["key"] == ident and r["control"] == "idempotency" for r in rows):
        matched = "idempotency key"
    else:
        matched = "execution id prefix"
    ids = sorted({*ids, *own, *keyed})
    if matched == "execution id prefix" and len(ids) > 1:
        raise NotFound(f"{ident!r} begins {len(ids)} execution ids ({', '.join(ids[:5])}"
                       f"{', ...' if len(ids) > 5 else ''}): give more of it")
    history = [{
        "decided_at": iso(r["decided_at"]), "request_id": r["request_id"],
        "workflow": r["workflow"], "outcome": r["outcome"], "key": r["key"],
        "control": r["control"], "deferral": r["deferral"], "due_at": iso(r["due_at"]),
        "position": r["position"], "execution_id": r["execution_id"], "reason": r["reason"],
        "waited_ms": r["waited_ms"], "folded": r["folded"],
        "retry_after_ms": r["retry_after_ms"], "stage": r["stage"],
    } for r in rows]
    found = [run_json(runs.rows[eid], runs.changes.get(eid, [])) for eid in ids
             if eid in runs.rows]
    return {"id": ident, "matched": matched, "execution_ids": ids, "runs": found,
            "ledger": history,
            "waiting": _waiting(db, history, control_rows or {}, now_ms)}


def _waiting(db: LedgerDb, history: list[dict[str, Any]],
             control_rows: dict[str, ControlRow], now_ms: int | None) -> list[dict[str, Any]]:
    """The why-waiting entry of each request whose latest row is `queued`."""
    from sluicegate.ops.services.waiting import waiting_starts

    latest = {row["request_id"]: row for row in history}
    out = []
    for request_id, row in latest.items():
        if row["outcome"] != "queued":
            continue
        for found in waiting_starts(db, control_rows, workflow=row["workflow"],
                                    key=row["key"], now_ms=now_ms, request_id=request_id):
            out.append({"request_id": request_id, "why": found.why,
                        "due_at": iso(found.due_at_ms), "estimate_ms": found.estimate_ms})
    return out


def text(doc: dict[str, Any]) -> str:
    """`runs show` in text: the run rows, then the history, one line each."""
    lines = [f"{doc['id']}: matched as {doc['matched']}"]
    for run in doc["runs"]:
        ended = f"  ended {run['ended_at']}" if run["ended_at"] else ""
        lines.append(f"run {run['execution_id']}  {run['workflow']}  {run['status']}"
                     f"  admitted {run['admitted_at']}{ended}")
        if run["last_reason"]:
            lines.append(f"  reason: {run['last_reason']}")
        for slot in run["slots"]:
            lines.append(f"  slot: {slot['stage']} key={slot['key']!r}")
        for change in run["changes"]:
            why = f"  ({change['reason']})" if change["reason"] else ""
            lines.append(f"  {change['at']}  {change['status']}{why}")
    missing = [eid for eid in doc["execution_ids"]
               if eid not in {r["execution_id"] for r in doc["runs"]}]
    for eid in missing:
        lines.append(f"run {eid}  (no row in the runs table)")
    lines.append("ledger:")
    for row in doc["ledger"]:
        parts = [row["decided_at"], f"{row['outcome']:<9}", row["workflow"],
                 f"request={row['request_id']}"]
        if row["key"] is not None:
            parts.append(f"key={row['key']!r}")
        if row["deferral"]:
            parts.append(f"deferral={row['deferral']}")
        if row["due_at"]:
            parts.append(f"due={row['due_at']}")
        if row["position"] is not None:
            parts.append(f"position={row['position']}")
        if row["execution_id"]:
            parts.append(f"-> run {row['execution_id']}")
        line = "  " + " ".join(parts)
        lines.append(line + (f"\n      {row['reason']}" if row["reason"] else ""))
    if not doc["ledger"]:
        lines.append("  (no ledger rows)")
    for waiting in doc.get("waiting", []):
        lines.append(f"waiting: request={waiting['request_id']}: {waiting['why']}")
    return "\n".join(lines)


def show(settings: Settings, ident: str, db: Path | None = None,
         control_rows: dict[str, ControlRow] | None = None) -> dict[str, Any]:
    """`lookup` on the ledger copy at `db` (the default one when None), refreshed first,
    and the runs table read to its end, a pause told by `control_rows` (the control
    topic's rows). Raises NotFound when nothing has `ident`."""
    from sluicegate.ops.services.ledger import open_copy

    runs = RunsIndex(settings)
    try:
        ledger, _ = open_copy(settings, db)
        with ledger:
            runs.refresh()
            return lookup(ledger, runs, ident, control_rows)
    finally:
        runs.close()
