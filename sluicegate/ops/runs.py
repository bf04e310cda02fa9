"""One run or request, whole: `sluicegate runs show ID` and `GET /inspect/runs/ID`.

ID is an execution id (or the first characters of one, as the demo and the dashboard
print it), a request id, or an idempotency key. The answer joins two sources:

- the ledger (the incremental DuckDB copy of `sluicegate.ops.ledger`): every row of every
  request that names the run, in the order they were decided: queued, collapsed into the
  run, admitted, existing, cancelled with its reason, and the rows about the run itself
  (`run:<execution id>:...`: a lapsed lease, timeouts.finish, a bulk operation);
- the compacted runs table `sg.runs` (`RunsIndex`): the run's row, and each change of
  its status this reader saw (admitted, running, completed, ...).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from confluent_kafka import Consumer, TopicPartition

from sluicegate.admission.stages.identity import NAME as IDENTITY
from sluicegate.admission.stages.identity import spent_key_row
from sluicegate.config import Settings
from sluicegate.kafkautil import watermarks
from sluicegate.ops.flow import read_to_end
from sluicegate.ops.ledger import LedgerDb
from sluicegate.schemas import codec
from sluicegate.schemas.records import RunRow
from sluicegate.topology.keys import key_text
from sluicegate.topology.topics import Topics

# At most this many status changes are kept per run (a run that heartbeats for a day
# does not grow without bound); the row itself is always the latest.
MAX_CHANGES = 50
# The shortest execution id prefix looked up as a prefix (the demo prints 8 characters).
MIN_PREFIX = 6

app = typer.Typer(help="One run or request: its run row and its whole ledger history.",
                  no_args_is_help=True)


class NotFound(LookupError):
    """Nothing in the ledger or the runs table has this id; the message says what was
    looked for."""


@dataclass(frozen=True, slots=True)
class StatusChange:
    status: str
    at_ms: int
    reason: str | None


@dataclass(slots=True)
class _Tail:
    """One compacted topic, read from its start, then on from where the last read stopped
    to the end each partition had when it began (read_committed)."""

    settings: Settings
    topic: str
    apply: Callable[[bytes | None, bytes | None], None]
    _consumer: Consumer | None = None
    _next: dict[int, int] = field(default_factory=dict)

    def read_on(self, timeout_s: float) -> None:
        if self._consumer is None:
            self._consumer = Consumer(self.settings.client_config(**{
                # assign() only, never a commit: the group id is a formality of the client.
                "group.id": f"{self.settings.namespace}runs-index",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 20,
            }))
            meta = self._consumer.list_topics(self.topic, timeout=timeout_s).topics[self.topic]
            self._next = dict.fromkeys(meta.partitions, 0)
            self._consumer.assign([TopicPartition(self.topic, p, 0) for p in self._next])
        ends = {p: watermarks(self._consumer, TopicPartition(self.topic, p), timeout_s)[1]
                for p in self._next}
        read_to_end(self._consumer, self._next, ends, self.apply, timeout_s)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


@dataclass(slots=True)
class RunsIndex:
    """Every run's latest row of the compacted `sg.runs`, ended runs too, and the changes
    of status seen since this reader began (a compacted topic keeps the latest row per
    run; the changes it still holds are read too); and every idempotency key spent, with
    the run it names, from the identity stage's changelog (compacted too): a key names its
    run from its first start on, not only once a repeat answered `existing`. `refresh`
    reads both on from where the last one stopped."""

    settings: Settings
    rows: dict[str, RunRow] = field(default_factory=dict)
    changes: dict[str, list[StatusChange]] = field(default_factory=dict)
    # idempotency key -> workflow -> the execution id it names
    keys: dict[str, dict[str, str]] = field(default_factory=dict)
    _tails: list[_Tail] = field(default_factory=list)

    def refresh(self, timeout_s: float = 10.0) -> None:
        if not self._tails:
            topics = Topics(self.settings)
            self._tails = [_Tail(self.settings, topics.runs, self._apply),
                           _Tail(self.settings, topics.changelog(IDENTITY), self._apply_key)]
        for tail in self._tails:
            tail.read_on(timeout_s)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:  # a tombstone: the run's row is gone, its history with it
            if key is not None:
                self.rows.pop(key.decode(errors="replace"), None)
                self.changes.pop(key.decode(errors="replace"), None)
            return
        try:
            row = codec.decode(RunRow, value)
        except codec.DecodeError:
            return  # not a run row; the runs stage never writes one
        self.rows[row.execution_id] = row
        seen = self.changes.setdefault(row.execution_id, [])
        if not seen or seen[-1].status != row.status.value:
            seen.append(StatusChange(row.status.value, row.updated_at_ms, row.last_reason))
            del seen[:-MAX_CHANGES]

    def _apply_key(self, key: bytes | None, value: bytes | None) -> None:
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
        for tail in self._tails:
            tail.close()
        self._tails = []


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


def _iso(value: Any) -> str | None:
    """A ledger instant (naive UTC) or epoch ms, as ISO 8601 UTC with milliseconds."""
    if value is None:
        return None
    if isinstance(value, int):
        value = datetime.fromtimestamp(value / 1000, UTC)
    elif isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return str(value.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


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
        "status": row.status.value, "admitted_at": _iso(row.admitted_at_ms),
        "updated_at": _iso(row.updated_at_ms), "ended_at": _iso(row.ended_at_ms),
        "last_reason": row.last_reason, "retries_spent": row.retries_spent,
        "run_id": row.run_id, "declaration_version": row.declaration_version,
        "slots": [{"stage": s.stage, "key": key_text(s.key)} for s in row.slots],
        **payload_json(row.payload),
        "changes": [{"status": c.status, "at": _iso(c.at_ms), "reason": c.reason}
                    for c in changes],
    }


def lookup(db: LedgerDb, runs: RunsIndex, ident: str) -> dict[str, Any]:
    """Everything known about `ident`: `matched` says what it was taken as, `runs` the
    run rows, `ledger` the history (oldest first). Raises NotFound when nothing has it."""
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
        "decided_at": _iso(r["decided_at"]), "request_id": r["request_id"],
        "workflow": r["workflow"], "outcome": r["outcome"], "key": r["key"],
        "control": r["control"], "deferral": r["deferral"], "due_at": _iso(r["due_at"]),
        "position": r["position"], "execution_id": r["execution_id"], "reason": r["reason"],
        "waited_ms": r["waited_ms"], "folded": r["folded"],
        "retry_after_ms": r["retry_after_ms"], "stage": r["stage"],
    } for r in rows]
    found = [run_json(runs.rows[eid], runs.changes.get(eid, [])) for eid in ids
             if eid in runs.rows]
    return {"id": ident, "matched": matched, "execution_ids": ids, "runs": found,
            "ledger": history}


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
    return "\n".join(lines)


@app.command("show")
def show(
    ident: Annotated[str, typer.Argument(
        metavar="ID", help="An execution id (or its first 6+ characters), a request id, or "
                           "an idempotency key.")],
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    db: Annotated[str | None, typer.Option(
        "--db", help="The ledger DuckDB file (default: the one `sluicegate ledger` uses).")]
        = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="Kafka bootstrap servers.", envvar="SLUICEGATE_BOOTSTRAP")] = None,
    namespace: Annotated[str | None, typer.Option(
        help="Topic name prefix (default sg.).", envvar="SLUICEGATE_NAMESPACE")] = None,
) -> None:
    """A run or request: its run row and its whole ledger history."""
    from sluicegate.ops.cli import _settings
    from sluicegate.ops.ledger import default_db_path, refresh

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format is text or json")
    # No broker, a ledger file in use: one line from the CLI's error handling.
    settings = _settings(bootstrap, namespace, reach=True)
    runs = RunsIndex(settings)
    try:
        with LedgerDb(db or default_db_path(settings)) as ledger:
            refresh(ledger, settings)
            runs.refresh()
            doc = lookup(ledger, runs, ident)
    except NotFound as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        runs.close()
    typer.echo(json.dumps(doc, indent=2) if fmt == "json" else text(doc))
