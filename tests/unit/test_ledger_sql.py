"""The ledger as a SQL table, without a broker: row mapping, the three questions, and the
offsets that make a refresh incremental."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import duckdb
import pytest
from confluent_kafka import KafkaError, TopicPartition

from sluicegate.config import Settings
from sluicegate.ops.services.ledger import (
    COLUMNS,
    QUESTIONS,
    LedgerDb,
    LedgerSqlError,
    RefreshReport,
    ask,
    fill,
    refresh,
    row_of,
)
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Outcome

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = datetime(2026, 1, 1, 1, 0, 0)  # an hour later, naive UTC as the table keeps it
MIN = 60_000


def rec(request_id: str, outcome: Outcome, at_ms: int, **more: object) -> LedgerRecord:
    fields: dict[str, object] = {"workflow": "tourNarration", "requested_at_ms": at_ms,
                                 "decided_at_ms": at_ms}
    fields.update(more)
    return LedgerRecord(request_id=request_id, outcome=outcome, **fields)  # type: ignore[arg-type]


@pytest.fixture
def db() -> LedgerDb:
    return LedgerDb(":memory:")


def rows_as_dicts(db: LedgerDb, sql: str) -> list[dict[str, object]]:
    result = db.query(sql)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def test_a_file_made_before_the_control_column_gains_it_and_takes_new_rows(
        tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    # The table as 0.1.0 made it: every column but `control`, and one row.
    con = duckdb.connect(str(path))
    con.execute(f"""CREATE TABLE ledger ({", ".join(
        f'"{name}" {kind}' for name, kind in COLUMNS if name != "control")},
        PRIMARY KEY (_partition, _offset))""")
    con.execute("INSERT INTO ledger (request_id, workflow, outcome, requested_at, decided_at,"
                " waited_ms, folded, key, _partition, _offset) VALUES ('r0', 'w', 'admitted',"
                " epoch_ms(0), epoch_ms(0), 0, 0, 'a', 1, 0)")
    con.close()
    with LedgerDb(path) as reopened:
        fill(reopened, [LedgerRecord(request_id="r1", workflow="w", outcome=Outcome.queued,
                                     requested_at_ms=T0, decided_at_ms=T0, key="b",
                                     control="throttle")])
        rows = reopened.query("SELECT request_id, key, control FROM ledger ORDER BY 1").rows
    assert rows == [("r0", "a", None), ("r1", "b", "throttle")]


def test_every_ledger_field_is_a_column_and_instants_are_timestamps(db: LedgerDb) -> None:
    record = LedgerRecord(
        request_id="r1", workflow="w", outcome=Outcome.queued, requested_at_ms=T0,
        decided_at_ms=T0 + 1500, waited_ms=1500, folded=2, key="tour:1", stage="defer",
        reason="why", execution_id="e1", retry_after_ms=30, deferral="debounce",
        due_at_ms=T0 + 15 * MIN, position=3, declaration_version="v1", payload=b'{"a":1}',
        control="debounce")
    assert len(row_of(record, 4, 7)) == len(COLUMNS)
    fill(db, [record])
    (row,) = rows_as_dicts(db, "SELECT * FROM ledger")
    assert row == {
        "request_id": "r1", "workflow": "w", "outcome": "queued",
        "requested_at": datetime(2026, 1, 1), "decided_at": datetime(2026, 1, 1, 0, 0, 1, 500_000),
        "waited_ms": 1500, "folded": 2, "key": "tour:1", "control": "debounce", "stage": "defer",
        "reason": "why",
        "execution_id": "e1", "retry_after_ms": 30, "deferral": "debounce",
        "due_at": datetime(2026, 1, 1, 0, 15), "position": 3, "declaration_version": "v1",
        "payload": b'{"a":1}', "_partition": 0, "_offset": 0,
    }
    assert db.query("SELECT typeof(requested_at), typeof(due_at) FROM ledger").rows == [
        ("TIMESTAMP", "TIMESTAMP")]


def test_optional_fields_are_null(db: LedgerDb) -> None:
    fill(db, [rec("r1", Outcome.admitted, T0)])
    assert db.query("SELECT key, reason, due_at, payload, folded FROM ledger").rows == [
        (None, None, None, None, 0)]


def twenty_edits(lost: int = 0) -> list[LedgerRecord]:
    """Twenty debounced edits of one row: each queued, nineteen collapsed into run e1,
    the last admitted as e1 having folded 19 - `lost`."""
    out = []
    for i in range(20):
        out.append(rec(f"edit{i}", Outcome.queued, T0 + i * MIN, key="tour:7",
                       deferral="debounce", stage="defer"))
    for i in range(19):
        out.append(rec(f"edit{i}", Outcome.collapsed, T0 + (i + 1) * MIN, key="tour:7",
                       execution_id="e1", stage="defer", reason="superseded"))
    out.append(rec("edit19", Outcome.admitted, T0 + 34 * MIN, execution_id="e1",
                   folded=19 - lost))
    return out


def test_twenty_edits_one_run_lost_answers_none_lost(db: LedgerDb) -> None:
    fill(db, twenty_edits())
    result = ask(db, "lost")
    (row,) = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    assert row["workflow"] == "tourNarration"
    assert row["key"] == "tour:7"
    assert row["run"] == "e1"
    assert (row["collapsed"], row["folded"], row["lost"]) == (19, 19, 0)
    assert str(row["verdict"]).startswith("none lost")


def test_a_run_that_folded_fewer_than_collapsed_into_it_shows_the_difference_as_lost(
        db: LedgerDb) -> None:
    fill(db, twenty_edits(lost=2))
    result = ask(db, "lost")
    (row,) = result.rows
    got = dict(zip(result.columns, row, strict=True))
    assert (got["collapsed"], got["folded"], got["lost"]) == (19, 17, 2)


def test_a_burst_not_admitted_yet_is_not_called_lost(db: LedgerDb) -> None:
    fill(db, twenty_edits()[:-1])
    result = ask(db, "lost")
    (row,) = result.rows
    got = dict(zip(result.columns, row, strict=True))
    assert (got["collapsed"], got["folded"], got["lost"]) == (19, None, None)
    assert str(got["verdict"]).startswith("not admitted yet")


def test_a_queued_start_without_a_final_row_is_waiting_and_a_workflow_without_is_quiet(
        db: LedgerDb) -> None:
    fill(db, [
        # Parked by concurrency twenty minutes ago, nothing since: waiting=20m.
        rec("q1", Outcome.queued, T0 + 40 * MIN, workflow="embed", key="tenant-a",
            deferral="concurrency"),
        rec("q2", Outcome.queued, T0 + 50 * MIN, workflow="embed", key="tenant-a",
            deferral="concurrency"),
        # Queued then admitted: not waiting any more.
        rec("q3", Outcome.queued, T0 + 10 * MIN, workflow="embed", key="tenant-b",
            deferral="concurrency"),
        rec("q3", Outcome.admitted, T0 + 11 * MIN, workflow="embed", execution_id="e3"),
        # A workflow whose starts were all admitted: quiet.
        rec("n1", Outcome.admitted, T0 + 5 * MIN, workflow="note", execution_id="e4"),
    ])
    result = ask(db, "stuck", now=NOW)
    got = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    assert [(g["workflow"], g["key"], g["queued"], g["waiting"], g["state"]) for g in got] == [
        ("embed", "tenant-a", 2, timedelta(minutes=20), "waiting"),
        ("note", None, 0, None, "quiet: nothing waiting"),
    ]
    assert got[1]["last_start"] == datetime(2026, 1, 1, 0, 5)


def test_waiting_counts_from_the_first_start_of_a_debounce_burst(db: LedgerDb) -> None:
    # The carrier's queued row carries how long its burst has waited (waited_ms): a burst
    # that never gets a quiet moment shows waiting= climbing, not the latest start's age.
    records = twenty_edits()[:-1]
    records.append(rec("edit19", Outcome.queued, T0 + 19 * MIN, key="tour:7",
                       deferral="debounce", waited_ms=19 * MIN))
    fill(db, records)
    result = ask(db, "stuck", now=NOW)
    (row,) = result.rows
    got = dict(zip(result.columns, row, strict=True))
    assert (got["key"], got["queued"], got["waiting"]) == ("tour:7", 1, timedelta(hours=1))


def test_why_shows_a_dropped_start_with_its_reason(db: LedgerDb) -> None:
    fill(db, [
        rec("d1", Outcome.dropped, T0, key="tenant-a", stage="ratelimit",
            reason="over the rateLimit of 100 per 1 minute for key 'tenant-a'",
            retry_after_ms=12_000),
        rec("a1", Outcome.admitted, T0 - MIN, execution_id="e1"),
    ])
    result = ask(db, "why", request_id="d1")
    (row,) = result.rows
    got = dict(zip(result.columns, row, strict=True))
    assert got["outcome"] == "dropped"
    assert got["reason"] == "over the rateLimit of 100 per 1 minute for key 'tenant-a'"
    assert got["retry_after_ms"] == 12_000


def test_why_by_key_shows_the_latest_row_of_each_request_on_that_key(db: LedgerDb) -> None:
    fill(db, [
        rec("r1", Outcome.queued, T0, key="tour:7", deferral="debounce"),
        rec("r2", Outcome.queued, T0 + MIN, key="tour:7", deferral="debounce"),
        rec("r1", Outcome.collapsed, T0 + MIN, key="tour:7", execution_id="e1",
            reason="superseded by a later start"),
        rec("r3", Outcome.queued, T0 + MIN, key="other", deferral="debounce"),
    ])
    result = ask(db, "why", key="tour:7")
    got = [dict(zip(result.columns, r, strict=True)) for r in result.rows]
    assert sorted((g["request_id"], g["outcome"]) for g in got) == [
        ("r1", "collapsed"), ("r2", "queued")]


def test_why_gives_a_queued_row_without_a_reason_what_holds_it(db: LedgerDb) -> None:
    """A queued row written without a reason (before the stages gave one) still answers
    "why": its deferral, due time and place in line."""
    fill(db, [rec("q1", Outcome.queued, T0, key="", deferral="concurrency", position=2),
              rec("q2", Outcome.queued, T0, key="r", deferral="debounce",
                  due_at_ms=T0 + 15 * MIN)])
    got = {r[0]: r[6] for r in ask(db, "why", key="").rows + ask(db, "why", key="r").rows}
    assert got == {"q1": "held by concurrency; number 3 in line",
                   "q2": "held by debounce until 2026-01-01 00:15:00"}


def test_two_decisions_in_one_millisecond_order_by_offset(db: LedgerDb) -> None:
    fill(db, [rec("r1", Outcome.queued, T0), rec("r1", Outcome.admitted, T0)])
    (row,) = ask(db, "why", request_id="r1").rows
    assert row[2] == "admitted"


def test_why_needs_a_request_or_a_key(db: LedgerDb) -> None:
    with pytest.raises(LedgerSqlError, match="--request-id"):
        ask(db, "why")


def test_every_question_runs_on_an_empty_ledger(db: LedgerDb) -> None:
    for name in QUESTIONS:
        assert ask(db, name, now=NOW, key="k").rows == []


def test_rows_and_offsets_commit_together_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    with LedgerDb(path) as db:
        fill(db, [rec("r1", Outcome.admitted, T0)], topic="sg.ledger", partition=2)
        fill(db, [rec("r2", Outcome.admitted, T0)], topic="sg.ledger", partition=2)
    with LedgerDb(path) as db:
        assert db.offsets("sg.ledger") == {2: 2}
        assert db.query("SELECT request_id, _offset FROM ledger ORDER BY _offset").rows == [
            ("r1", 0), ("r2", 1)]


def test_a_failed_append_leaves_neither_rows_nor_offsets(db: LedgerDb) -> None:
    fill(db, [rec("r1", Outcome.admitted, T0)])
    # Offset 0 of partition 0 again: the primary key refuses it, and nothing is kept.
    bad = [row_of(rec("r2", Outcome.admitted, T0), 0, 1), row_of(rec("r3", Outcome.admitted,
                                                                     T0), 0, 0)]
    with pytest.raises(Exception, match=r"(?i)constraint|duplicate"):
        db.append(bad, {0: 2}, "sg.ledger")
    assert db.offsets("sg.ledger") == {0: 1}
    assert db.query("SELECT count(*) FROM ledger").rows == [(1,)]


def test_sql_errors_explain(db: LedgerDb) -> None:
    with pytest.raises(LedgerSqlError, match="no_such_column"):
        db.query("SELECT no_such_column FROM ledger")


# -- refresh, against a consumer that plays a topic ---------------------------------------


class _Message:
    def __init__(self, partition: int, offset: int, value: bytes | None = None,
                 error: KafkaError | None = None) -> None:
        self._partition, self._offset, self._value, self._error = partition, offset, value, error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return self._error


class PlayedTopic:
    """A topic's partitions as a read_committed consumer sees them: records at their
    offsets, gaps where transaction markers are, and EOF at the high watermark."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.logs: dict[int, dict[int, bytes]] = {p: {} for p in range(partitions)}
        self.high = dict.fromkeys(range(partitions), 0)
        self.low = dict.fromkeys(range(partitions), 0)
        self.consumed = 0

    def produce_transaction(self, partition: int, records: list[LedgerRecord]) -> None:
        for record in records:
            self.logs[partition][self.high[partition]] = codec.encode(record)
            self.high[partition] += 1
        self.high[partition] += 1  # the commit marker takes an offset too

    def consumer(self) -> FakeConsumer:
        return FakeConsumer(self)


class FakeConsumer:
    def __init__(self, played: PlayedTopic) -> None:
        self.played = played
        self.position: dict[int, int] = {}
        self.at_eof: set[int] = set()

    def list_topics(self, topic: str, timeout: float) -> SimpleNamespace:
        meta = SimpleNamespace(partitions=dict.fromkeys(self.played.logs), error=None)
        return SimpleNamespace(topics={self.played.topic: meta})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float,
                              cached: bool) -> tuple[int, int]:
        return self.played.low[tp.partition], self.played.high[tp.partition]

    def assign(self, tps: list[TopicPartition]) -> None:
        self.position = {tp.partition: tp.offset for tp in tps}

    def consume(self, n: int, timeout: float) -> list[_Message]:
        out: list[_Message] = []
        for p, pos in self.position.items():
            log = self.played.logs[p]
            while pos < self.played.high[p] and len(out) < n:
                if pos in log:
                    out.append(_Message(p, pos, log[pos]))
                    self.played.consumed += 1
                pos += 1
            if pos >= self.played.high[p] and p not in self.at_eof:
                out.append(_Message(p, pos, error=KafkaError(KafkaError._PARTITION_EOF)))
                self.at_eof.add(p)
            self.position[p] = pos
        return out

    def close(self) -> None:
        pass


def _refresh(db: LedgerDb, played: PlayedTopic, settings: Settings) -> RefreshReport:
    return refresh(db, settings, consumer=played.consumer())  # type: ignore[arg-type]


def test_two_refreshes_read_each_record_once_and_offsets_survive_reopening(
        tmp_path: Path) -> None:
    settings = Settings(namespace="sg.", state_dir=tmp_path / "state")
    played = PlayedTopic("sg.ledger", 3)
    played.produce_transaction(0, [rec(f"a{i}", Outcome.admitted, T0) for i in range(5)])
    played.produce_transaction(1, [rec(f"b{i}", Outcome.existing, T0) for i in range(3)])
    path = tmp_path / "ledger.duckdb"
    with LedgerDb(path) as db:
        assert _refresh(db, played, settings).rows == 8
        assert _refresh(db, played, settings).rows == 0
    assert played.consumed == 8
    # Offsets are past the markers, so nothing is re-read.
    with LedgerDb(path) as db:
        assert db.offsets("sg.ledger") == {0: 6, 1: 4}
        played.produce_transaction(1, [rec("b3", Outcome.existing, T0)])
        played.produce_transaction(2, [rec("c0", Outcome.admitted, T0)])
        report = _refresh(db, played, settings)
        assert report.rows == 2
        assert played.consumed == 10
        assert db.query("SELECT outcome, count(*) FROM ledger GROUP BY ALL ORDER BY 1").rows == [
            ("admitted", 6), ("existing", 4)]
        assert db.offsets("sg.ledger") == {0: 6, 1: 6, 2: 2}


def test_a_refresh_that_dies_midway_keeps_only_whole_batches(tmp_path: Path) -> None:
    settings = Settings(namespace="sg.", state_dir=tmp_path / "state")
    played = PlayedTopic("sg.ledger", 1)
    played.produce_transaction(0, [rec(f"a{i}", Outcome.admitted, T0) for i in range(10)])
    db = LedgerDb(tmp_path / "ledger.duckdb")
    appended = 0
    real_append = db.append

    def dies_on_the_second_batch(*args: Any) -> None:
        nonlocal appended
        appended += 1
        if appended == 2:
            raise RuntimeError("killed")
        real_append(*args)

    db.append = dies_on_the_second_batch  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError, match="killed"):
        refresh(db, settings, consumer=FakeConsumer(played),  # type: ignore[arg-type]
                batch_rows=4)
    assert db.query("SELECT count(*) FROM ledger").rows == [(4,)]
    assert db.offsets("sg.ledger") == {0: 4}
    db.append = real_append  # type: ignore[method-assign]
    assert refresh(db, settings, consumer=FakeConsumer(played)).rows == 6  # type: ignore[arg-type]
    assert db.query("SELECT count(DISTINCT request_id), count(*) FROM ledger").rows == [(10, 10)]


def test_a_record_retention_deleted_before_it_was_read_is_reported(tmp_path: Path) -> None:
    settings = Settings(namespace="sg.", state_dir=tmp_path / "state")
    played = PlayedTopic("sg.ledger", 1)
    played.produce_transaction(0, [rec(f"a{i}", Outcome.admitted, T0) for i in range(4)])
    with LedgerDb(":memory:") as db:
        assert _refresh(db, played, settings).rows == 4  # up to offset 5, past the marker
        played.produce_transaction(0, [rec(f"b{i}", Outcome.admitted, T0) for i in range(4)])
        played.low[0] = 8  # offsets 5, 6 and 7 are gone before this file read them
        report = _refresh(db, played, settings)
    assert (report.rows, report.trimmed) == (1, [(0, 3)])


def test_a_file_of_another_namespace_is_refused(tmp_path: Path) -> None:
    with LedgerDb(":memory:") as db:
        fill(db, [rec("r1", Outcome.admitted, T0)], topic="other.ledger")
        with pytest.raises(LedgerSqlError, match=r"other\.ledger"):
            refresh(db, Settings(namespace="sg.", state_dir=tmp_path))


def test_the_ksql_definitions_ship_with_the_package_and_name_the_namespace_topic() -> None:
    from typer.testing import CliRunner

    from sluicegate.ops.cli.root import app as cli

    result = CliRunner().invoke(cli, ["ledger", "ksql", "--namespace", "prod."])
    assert result.exit_code == 0, result.output
    assert "KAFKA_TOPIC = 'prod.ledger'" in result.stdout
    for name in ("sg_ledger_lost", "sg_ledger_latest", "sg_ledger_waiting"):
        assert f"CREATE TABLE IF NOT EXISTS {name}" in result.stdout
    # Every LedgerRecord field is a column of the stream.
    for field in LedgerRecord.__dataclass_fields__:
        assert field.lower() in result.stdout.lower()


def test_why_tells_a_start_waiting_for_a_slot_the_latest_override_of_its_limit(
        db: LedgerDb) -> None:
    waits = "concurrency: 4 of 4 slots in use; number 1 in line for the next free one"
    override = ("override of the concurrency limit of tourNarration: 4 -> 2 (declared 4) "
                "by ana: partner 503s")
    fill(db, [
        rec("q1", Outcome.queued, T0, key="", deferral="concurrency", reason=waits),
        rec("override:concurrency:tourNarration:1:tourNarration", Outcome.overridden,
            T0 + MIN, control="override", reason=override),
        rec("d1", Outcome.queued, T0, key="", deferral="debounce", reason="debounced"),
    ])
    (row,) = ask(db, "why", request_id="q1").rows
    assert row[6] == f"{waits}; latest {override} (at 2026-01-01 00:01:00 UTC)"
    (row,) = ask(db, "why", request_id="d1").rows
    assert row[6] == "debounced", "only a start waiting for a slot or a turn"
