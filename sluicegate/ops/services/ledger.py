"""The admissions ledger as a SQL table: `sg.ledger` materialised into a DuckDB file.

Every decision sluicegate makes is one `LedgerRecord` on `sg.ledger` (seed 000, "Seeing
what happened"). This module copies those records, incrementally, into the table `ledger`
of an embedded DuckDB database and answers SQL over it, including the three ready-made
questions (`QUESTIONS`): did a collapse lose starts, is a key stuck or quiet, why did a
request not start.

Incremental and exactly once: the next offset of every partition is kept in the same
DuckDB file (table `_offsets`) and written in the same DuckDB transaction as the rows it
covers, so a refresh that dies half way leaves neither rows nor offsets behind, and the
next one reads only what is new. See docs/ledger-sql.md and
docs/decisions/ledger-sql-engine.md.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.config import Settings
from sluicegate.kafkautil import watermarks
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord
from sluicegate.topology.topics import Topics

log = logging.getLogger(__name__)

# The table's columns in order: (name, DuckDB type). Instants become TIMESTAMP (UTC,
# naive) so SQL can subtract and compare them; `*_ms` durations stay BIGINT. `_partition`
# and `_offset` say where a row came from, and order the rows of one request (they share
# a partition: the ledger is keyed by request id).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("request_id", "VARCHAR NOT NULL"),
    ("workflow", "VARCHAR NOT NULL"),
    ("outcome", "VARCHAR NOT NULL"),
    ("requested_at", "TIMESTAMP NOT NULL"),
    ("decided_at", "TIMESTAMP NOT NULL"),
    ("waited_ms", "BIGINT NOT NULL"),
    ("folded", "BIGINT NOT NULL"),
    ("key", "VARCHAR"),
    ("control", "VARCHAR"),
    ("stage", "VARCHAR"),
    ("reason", "VARCHAR"),
    ("execution_id", "VARCHAR"),
    ("retry_after_ms", "BIGINT"),
    ("deferral", "VARCHAR"),
    ("due_at", "TIMESTAMP"),
    ("position", "BIGINT"),
    ("declaration_version", "VARCHAR"),
    ("payload", "BLOB"),
    ("_partition", "INTEGER NOT NULL"),
    ("_offset", "BIGINT NOT NULL"),
)
_TIMESTAMPS = frozenset({"requested_at", "decided_at", "due_at"})

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS ledger (
    {", ".join(f'"{name}" {kind}' for name, kind in COLUMNS)},
    PRIMARY KEY (_partition, _offset)
);
CREATE TABLE IF NOT EXISTS _offsets (
    topic VARCHAR NOT NULL,
    "partition" INTEGER NOT NULL,
    next_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, "partition")
);
"""

# Rows go in column-wise, one list parameter per column, unnested side by side: DuckDB's
# executemany costs milliseconds per row, this tens of microseconds.
# By name: a file made before a column was added has it last (`_ADDED`).
_NAMES = ", ".join(f'"{name}"' for name, _ in COLUMNS)
_INSERT = f"INSERT INTO ledger ({_NAMES}) SELECT " + ", ".join(
    (f"epoch_ms(unnest(${i + 1}::BIGINT[]))" if name in _TIMESTAMPS
     else f"unnest(${i + 1}::{kind.removesuffix(' NOT NULL')}[])")
    for i, (name, kind) in enumerate(COLUMNS)
)
# Columns added since the first release, for files made before: (name, DuckDB type).
_ADDED: tuple[tuple[str, str], ...] = (("control", "VARCHAR"),)

_SAVE_OFFSET = """
INSERT INTO _offsets VALUES ($1, $2, $3)
ON CONFLICT (topic, "partition") DO UPDATE SET next_offset = excluded.next_offset
"""

Row = tuple[Any, ...]

# DuckDB's refusal of a write on a read-only connection names the statement's type.
_WRITE_REFUSED = re.compile(r'Cannot execute statement of type "(\w+)"')


class LedgerSqlError(RuntimeError):
    """The ledger database cannot be used as asked; the message says what to do."""


def row_of(record: LedgerRecord, partition: int, offset: int) -> Row:
    """One `ledger` table row, in `COLUMNS` order; instants stay ms until the insert."""
    return (
        record.request_id, record.workflow, record.outcome.value, record.requested_at_ms,
        record.decided_at_ms, record.waited_ms, record.folded, record.key, record.control,
        record.stage,
        record.reason, record.execution_id, record.retry_after_ms, record.deferral,
        record.due_at_ms, record.position, record.declaration_version, record.payload,
        partition, offset,
    )


def default_db_path(settings: Settings) -> Path:
    """Next to the state dir, one file per namespace: two namespaces never share rows."""
    return settings.state_dir.parent / f"ledger.{settings.namespace}duckdb"


@dataclass(frozen=True, slots=True)
class Result:
    columns: list[str]
    rows: list[Row]


class LedgerDb:
    """One DuckDB file holding the `ledger` table and the offsets it was read up to.

    `read_only`: a connection no statement can write through, for SQL an operator types
    (`ledger query`): DuckDB refuses every write to the file, and file access (COPY TO,
    ATTACH) is off and stays off, so the table and its offsets stay what `refresh`
    made them (docs/decisions/read-only-ledger-sql.md). The file must exist."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path) if str(path) != ":memory:" else None
        self.read_only = read_only
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if read_only:
                self.con = duckdb.connect(str(path), read_only=True,
                                          config={"enable_external_access": False})
                self.con.execute("SET lock_configuration = true")
                return
            self.con = duckdb.connect(str(path))
        except duckdb.IOException as exc:
            # DuckDB lets one process write a file at a time.
            raise LedgerSqlError(
                f"cannot open the ledger database {path}: {exc}. Another `sluicegate ledger`"
                " may be using it; wait for it, or pass --db with another file") from exc
        self.con.execute(_SCHEMA)
        for name, kind in _ADDED:
            self.con.execute(f'ALTER TABLE ledger ADD COLUMN IF NOT EXISTS "{name}" {kind}')

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> LedgerDb:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def offsets(self, topic: str) -> dict[int, int]:
        """The next offset to read, per partition of `topic`."""
        got = self.con.execute(
            'SELECT "partition", next_offset FROM _offsets WHERE topic = $1', [topic]).fetchall()
        return {int(p): int(o) for p, o in got}

    def topics(self) -> list[str]:
        return [t for (t,) in self.con.execute("SELECT DISTINCT topic FROM _offsets").fetchall()]

    def append(self, rows: list[Row], offsets: Mapping[int, int], topic: str) -> None:
        """Rows and the offsets they bring the partitions to, in one transaction: both are
        there afterwards, or neither is."""
        self.con.begin()
        try:
            if rows:
                self.con.execute(_INSERT, [list(column) for column in zip(*rows, strict=True)])
            for partition, next_offset in offsets.items():
                self.con.execute(_SAVE_OFFSET, [topic, partition, next_offset])
            self.con.commit()
        except BaseException:
            self.con.rollback()
            raise

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        try:
            cursor = self.con.execute(sql, dict(params) if params else None)
        except duckdb.Error as exc:
            refused = _WRITE_REFUSED.search(str(exc))
            if self.read_only and refused is not None:
                raise LedgerSqlError(
                    f"the ledger is read-only here: a {refused.group(1)} statement cannot "
                    "change it (`ledger ask` and `flow` answer from it)") from exc
            if self.read_only and isinstance(exc, duckdb.PermissionException):
                raise LedgerSqlError("the ledger's SQL cannot read or write files "
                                     f"({exc}); use --format csv|json to export") from exc
            raise LedgerSqlError(f"{type(exc).__name__}: {exc}") from exc
        columns = [d[0] for d in cursor.description] if cursor.description else []
        return Result(columns, cursor.fetchall() if columns else [])


# -- refreshing from the topic ------------------------------------------------------------


@dataclass(slots=True)
class RefreshReport:
    topic: str
    rows: int = 0
    undecodable: int = 0
    # Partitions whose stored offset had fallen behind retention: (partition, skipped).
    trimmed: list[tuple[int, int]] = field(default_factory=list)
    # Partitions that did not reach the end they had at the start (an open transaction).
    unfinished: list[int] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """What a reader of the copy should know it misses, one line each."""
        said = []
        if self.trimmed:
            lost = ", ".join(f"[{p}] {n}" for p, n in self.trimmed)
            said.append(f"retention deleted records before this file read them: {lost}")
        if self.undecodable:
            said.append(f"{self.undecodable} records were not ledger records, left out")
        if self.unfinished:
            said.append("partitions " + ", ".join(map(str, self.unfinished)) +
                        " are held by an open transaction; their newest rows are not in yet")
        return said


def ledger_consumer(settings: Settings) -> Consumer:
    """The consumer a refresh reads with: assigned partitions, read_committed."""
    return Consumer(settings.client_config(**{
        # assign() only and never a commit: the group id is a formality of the client.
        "group.id": f"{settings.namespace}ledger-sql",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
    }))


def refresh(db: LedgerDb, settings: Settings, *, consumer: Consumer | None = None,
            batch_rows: int = 20_000, timeout_s: float = 60.0) -> RefreshReport:
    """Append every ledger record after the stored offsets, up to the end each partition
    had when the refresh began, then stop.

    read_committed: aborted records are never counted. A transaction still open at the
    end holds a partition short of its end; after `timeout_s` the refresh keeps what it
    has and names that partition in `unfinished` (the next refresh goes on from there).
    A `consumer` given is the caller's to close; otherwise one is made and closed here.
    """
    topic = Topics(settings).ledger
    others = [t for t in db.topics() if t != topic]
    if others:
        raise LedgerSqlError(
            f"{db.path} holds the ledger of {', '.join(others)}, not {topic}: pass --db "
            "with a file of this namespace's own")
    report = RefreshReport(topic)
    reader = consumer if consumer is not None else ledger_consumer(settings)
    try:
        targets = _plan(reader, db, topic, report)
        if targets:
            _copy(reader, db, topic, targets, report, batch_rows, timeout_s)
    finally:
        if consumer is None:
            reader.close()
    return report


def open_copy(settings: Settings, db: Path | None = None, *, fresh: bool = True
              ) -> tuple[LedgerDb, RefreshReport]:
    """The ledger copy at `db` (default: `default_db_path`), brought up to the topic's
    current end when `fresh`, and what that refresh did (nothing, when not `fresh`); the
    caller closes the copy."""
    ledger = LedgerDb(db or default_db_path(settings))
    try:
        return ledger, (refresh(ledger, settings) if fresh
                        else RefreshReport(Topics(settings).ledger))
    except BaseException:
        ledger.close()
        raise


@dataclass(slots=True)
class _Target:
    next_offset: int
    end: int  # the high watermark at the start of the refresh


def _plan(consumer: Consumer, db: LedgerDb, topic: str,
          report: RefreshReport) -> dict[int, _Target]:
    """Where each partition starts and ends; assigns the ones with something to read."""
    meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        raise LedgerSqlError(
            f"topic {topic} is not there ({meta.error if meta else 'unknown topic'}): "
            "check --bootstrap and --namespace, or run `sluicegate topics create`")
    stored = db.offsets(topic)
    targets: dict[int, _Target] = {}
    for partition in sorted(meta.partitions):
        low, high = watermarks(consumer, TopicPartition(topic, partition))
        start = stored.get(partition, low)
        if start > high:
            raise LedgerSqlError(
                f"{db.path} has read {topic}[{partition}] up to offset {start}, but the "
                f"partition ends at {high}: the topic was recreated. Delete the file (or "
                "pass --db with a new one) to read it afresh")
        if start < low:
            # Retention deleted records this file never read: say so, do not pretend.
            report.trimmed.append((partition, low - start))
            start = low
        if start < high:
            targets[partition] = _Target(start, high)
    consumer.assign([TopicPartition(topic, p, t.next_offset) for p, t in targets.items()])
    return targets


def _copy(consumer: Consumer, db: LedgerDb, topic: str, targets: dict[int, _Target],
          report: RefreshReport, batch_rows: int, timeout_s: float) -> None:
    """Consume until every partition reaches its end, committing every `batch_rows`."""
    rows: list[Row] = []
    moved: dict[int, int] = {}  # partition -> next offset, not yet committed
    open_parts = {p for p, t in targets.items() if t.next_offset < t.end}
    deadline = time.monotonic() + timeout_s

    def flush() -> None:
        db.append(rows, moved, topic)
        report.rows += len(rows)
        rows.clear()
        moved.clear()

    while open_parts and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, timeout=0.5):
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None:
                continue  # a client-level event, not a partition's
            target = targets[partition]
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise LedgerSqlError(f"reading {topic}[{partition}]: {error}")
                # EOF's offset is past any transaction marker, which no message reports.
                target.next_offset = max(target.next_offset, offset)
            else:
                try:
                    rows.append(row_of(codec.decode(LedgerRecord, msg.value()),
                                       partition, offset))
                except codec.DecodeError as exc:
                    report.undecodable += 1
                    log.warning("%s[%d]@%d is not a ledger record, left out: %s",
                                topic, partition, offset, exc)
                target.next_offset = offset + 1
            moved[partition] = target.next_offset
            if target.next_offset >= target.end:
                open_parts.discard(partition)
            if len(rows) >= batch_rows:
                flush()
    flush()
    report.unfinished = sorted(open_parts)


# -- the three questions ------------------------------------------------------------------

# The latest row of every request: its current state. Rows of one request share a
# partition, so the offset breaks a tie between two decisions in the same millisecond.
LATEST = """
latest AS (
    SELECT * FROM ledger
    QUALIFY row_number() OVER (
        PARTITION BY request_id ORDER BY decided_at DESC, _offset DESC) = 1
)"""

LOST_SQL = """
-- Twenty edits, one run: did I lose nineteen? Per run that absorbed collapsed starts:
-- how many starts collapsed into it, and how many the admitted run says it folded.
WITH collapsed AS (
    SELECT workflow, execution_id, any_value(key) AS key,
           count(DISTINCT request_id) AS collapsed, max(decided_at) AS last_collapsed_at
    FROM ledger WHERE outcome = 'collapsed' AND execution_id IS NOT NULL
    GROUP BY workflow, execution_id
), admitted AS (
    SELECT workflow, execution_id, max(folded) AS folded, min(decided_at) AS admitted_at
    FROM ledger WHERE outcome = 'admitted' AND execution_id IS NOT NULL
    GROUP BY workflow, execution_id
)
SELECT coalesce(c.workflow, a.workflow) AS workflow, c.key,
       coalesce(c.execution_id, a.execution_id) AS run,
       coalesce(c.collapsed, 0) AS collapsed, a.folded, a.admitted_at,
       CASE WHEN a.execution_id IS NULL THEN NULL
            ELSE greatest(coalesce(c.collapsed, 0) - a.folded, 0) END AS lost,
       CASE WHEN a.execution_id IS NULL THEN 'not admitted yet'
            WHEN coalesce(c.collapsed, 0) = a.folded THEN 'none lost'
            WHEN coalesce(c.collapsed, 0) > a.folded THEN 'some lost'
            -- More folded than collapsed rows: the rows are gone, not the starts.
            ELSE 'collapsed rows gone (retention?)'
       END AS verdict
FROM collapsed c
FULL OUTER JOIN admitted a ON c.execution_id = a.execution_id AND c.workflow = a.workflow
WHERE coalesce(c.collapsed, 0) > 0 OR a.folded > 0
ORDER BY workflow, coalesce(a.admitted_at, c.last_collapsed_at) DESC, run
"""

STUCK_SQL = f"""
-- Nothing has run for an hour: stuck, or quiet? Per workflow and key: the starts still
-- waiting for a final outcome and `waiting`, the age of the oldest; a workflow with
-- nothing waiting shows as quiet, with its last start.
WITH {LATEST},
waiting AS (
    -- A queued row's decided_at - waited_ms is when its group began waiting: for a
    -- debounce, the first start of the burst, which the latest start's row carries.
    SELECT workflow, key, count(*) AS queued,
           min(least(requested_at, decided_at - to_milliseconds(waited_ms))) AS oldest
    FROM latest WHERE outcome = 'queued'
    GROUP BY workflow, key
), workflows AS (
    -- `run:` rows are about runs (lease expiry), not starts.
    SELECT workflow, max(requested_at) AS last_start
    FROM ledger WHERE NOT starts_with(request_id, 'run:')
    GROUP BY workflow
)
SELECT w.workflow, q.key, coalesce(q.queued, 0) AS queued,
       $now::TIMESTAMP - q.oldest AS waiting, w.last_start,
       CASE WHEN q.workflow IS NULL THEN 'quiet: nothing waiting' ELSE 'waiting' END AS state
FROM workflows w LEFT JOIN waiting q USING (workflow)
ORDER BY waiting DESC NULLS LAST, w.workflow, q.key
"""

WHY_SQL = f"""
-- Why did my run not start? The latest decision on a request, or on every request that
-- was decided on a key (newest first). A queued row without a reason of its own (written
-- before the stage gave one) says what holds it from its deferral, due time and position.
-- A start waiting for a concurrency slot or a throttle turn is also told the latest
-- override of its workflow's limits (an operator's `workflows limit`), set or cleared.
WITH {LATEST}
SELECT request_id, workflow, outcome, key, control, stage,
       coalesce(reason, CASE WHEN outcome = 'queued' THEN
           'held by ' || coalesce(deferral, 'a control')
           || coalesce(' until ' || strftime(due_at, '%Y-%m-%d %H:%M:%S'), '')
           || coalesce('; number ' || (position + 1) || ' in line', '') END)
       || CASE WHEN outcome = 'queued' AND deferral IN ('concurrency', 'throttle') THEN coalesce(
           (SELECT '; latest ' || o.reason || ' (at '
                   || strftime(o.decided_at, '%Y-%m-%d %H:%M:%S') || ' UTC)'
            FROM ledger o WHERE o.workflow = latest.workflow AND o.control = 'override'
            ORDER BY o.decided_at DESC, o._offset DESC LIMIT 1), '') ELSE '' END
       AS reason,
       deferral, due_at, position, retry_after_ms, execution_id, requested_at, decided_at,
       waited_ms
FROM latest
WHERE request_id = $request_id
   OR request_id IN (SELECT request_id FROM ledger WHERE key = $key)
ORDER BY decided_at DESC, request_id
LIMIT $limit
"""


@dataclass(frozen=True, slots=True)
class Question:
    name: str
    asks: str
    sql: str
    # Named parameters the SQL takes, with their defaults.
    params: tuple[str, ...] = ()


QUESTIONS: dict[str, Question] = {q.name: q for q in (
    Question("lost", "Twenty edits, one run: did I lose nineteen?", LOST_SQL),
    Question("stuck", "Nothing has run for an hour: stuck, or quiet?", STUCK_SQL, ("now",)),
    Question("why", "Why did my run not start? (--request-id R or --key K)", WHY_SQL,
             ("request_id", "key", "limit")),
)}


def utc_now() -> datetime:
    """Now as the table's instants are: naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def ask(db: LedgerDb, name: str, *, now: datetime | None = None, request_id: str | None = None,
        key: str | None = None, limit: int = 50) -> Result:
    question = QUESTIONS.get(name)
    if question is None:
        raise LedgerSqlError(f"no question {name!r}; the questions are {', '.join(QUESTIONS)}")
    given: dict[str, Any] = {"now": now or utc_now(), "request_id": request_id, "key": key,
                             "limit": limit}
    if name == "why" and request_id is None and key is None:
        raise LedgerSqlError("`why` needs --request-id R or --key K")
    return db.query(question.sql, {p: given[p] for p in question.params})


def fill(db: LedgerDb, records: Iterable[LedgerRecord], topic: str = "sg.ledger",
         partition: int = 0) -> None:
    """Append `records` as if read from `partition` after what is there (tests, demos)."""
    start = db.offsets(topic).get(partition, 0)
    rows = [row_of(r, partition, start + i) for i, r in enumerate(records)]
    db.append(rows, {partition: start + len(rows)}, topic)


def ksql_definitions(namespace: str) -> str:
    """The shipped ksqlDB file for a namespace: written for `sg.`, whose topic (and its
    subject, `<topic>-value`) are the only names that differ."""
    from importlib.resources import files

    text = files("sluicegate.ops").joinpath("ksql/ledger.sql").read_text(encoding="utf-8")
    return text.replace("sg.ledger", f"{namespace}ledger")
