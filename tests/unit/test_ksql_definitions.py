"""The shipped ksqlDB definitions (sluicegate/ops/ksql/ledger.sql) against the wire contract:
ksqlDB cannot run here, so every name and type the SQL relies on is checked against
io.sluicegate.LedgerRecord.avsc and the project's topic, and every identifier a statement or
a query uses against the columns of what it reads from."""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.testing import CliRunner

from sluicegate.config import Settings
from sluicegate.ops.cli.root import app as cli
from sluicegate.ops.services.ledger import ksql_definitions
from sluicegate.schemas.codec import RECORD_TYPES
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.topics import Topics

LEDGER = RECORD_TYPES[LedgerRecord].schema

# The ksqlDB type each Avro type (or logical type) reads as with VALUE_FORMAT 'AVRO'.
KSQL_TYPE_OF = {
    "string": "STRING", "enum": "STRING", "long": "BIGINT", "timestamp-millis": "TIMESTAMP",
    "bytes": "BYTES", "boolean": "BOOLEAN", "double": "DOUBLE",
}


def avro_kind(avro_type: Any) -> tuple[str, bool]:
    """("long" / "timestamp-millis" / "enum" / ..., whether it is optional)."""
    optional = False
    if isinstance(avro_type, list):
        (avro_type,) = [t for t in avro_type if t != "null"]
        optional = True
    if isinstance(avro_type, dict):
        return avro_type.get("logicalType", avro_type["type"]), optional
    return avro_type, optional


def code_of(text: str) -> str:
    """What ksqlDB would run or be asked: statements, and the queries under `--   `;
    prose comments and string literals out (a literal is checked on its own)."""
    lines = []
    for line in text.splitlines():
        code, sep, comment = line.partition("--")
        lines.append(comment if sep and comment.startswith("   ") else code)
    return "\n".join(lines)


def statements(text: str) -> list[str]:
    return [s.strip() for s in code_of(text).split(";") if s.strip()]


def split_top(text: str) -> list[str]:
    """`text` split at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return [*parts, current.strip()]


def identifiers(sql: str) -> set[str]:
    """Column and object names: lower case by the file's convention (keywords and functions
    are upper case), or back-quoted."""
    sql = re.sub(r"'[^']*'", "''", sql)
    quoted = {q.lower() for q in re.findall(r"`(\w+)`", sql)}
    sql = re.sub(r"`\w+`", "", sql)
    return quoted | set(re.findall(r"\b[a-z_][a-z0-9_]*\b", sql))


STREAM = re.compile(r"CREATE STREAM IF NOT EXISTS (\w+) \((.*?)\)\s*WITH \((.*?)\)\s*$", re.S)
TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+) AS\s+(SELECT .*)$", re.S)
SELECT = re.compile(r"SELECT (.*?)\s+FROM (\w+)(.*)$", re.S)


class Definitions:
    def __init__(self, text: str) -> None:
        self.columns: dict[str, dict[str, str]] = {}  # object -> column -> type (or "")
        self.stream_with: dict[str, str] = {}
        self.key_column = ""
        self.selects: list[str] = []
        for statement in statements(text):
            if statement.startswith("SET "):
                continue
            if (m := STREAM.match(statement)) is not None:
                self._stream(m.group(1), m.group(2), m.group(3))
            elif (m := TABLE.match(statement)) is not None:
                self.selects.append(m.group(2))
                self.columns[m.group(1)] = {out: "" for out in self.outputs(m.group(2))}
            elif statement.startswith("SELECT "):
                self.selects.append(statement)
            else:
                raise AssertionError(f"a statement the test does not know: {statement[:60]}")

    def _stream(self, name: str, columns: str, with_: str) -> None:
        cols: dict[str, str] = {}
        for column in split_top(columns):
            col, kind, *key = column.replace("`", "").split()
            cols[col.lower()] = kind
            if key == ["KEY"]:
                self.key_column = col.lower()
        self.columns[name] = cols
        for prop in split_top(with_):
            prop_name, _, value = prop.partition("=")
            self.stream_with[prop_name.strip()] = value.strip().strip("'")

    @staticmethod
    def outputs(select: str) -> list[str]:
        m = SELECT.match(select)
        assert m is not None, select
        names = []
        for item in split_top(m.group(1)):
            alias = re.search(r"\bAS\s+(\w+)$", item, re.S)
            names.append(alias.group(1) if alias else item.replace("`", "").lower())
        return names


DEFS = Definitions(ksql_definitions("sg."))


def test_the_stream_reads_the_projects_ledger_topic_in_its_formats() -> None:
    assert next(iter(DEFS.columns)) == "sg_ledger"
    assert DEFS.stream_with == {
        "KAFKA_TOPIC": Topics(Settings(namespace="sg.")).ledger,
        "KEY_FORMAT": "KAFKA",  # the key is plain UTF-8 (docs/wire-format.md)
        "VALUE_FORMAT": "AVRO",  # 00 + schema id + body: Schema Registry framing
        "TIMESTAMP": "decided_at_ms",
    }
    assert DEFS.columns["sg_ledger"]["decided_at_ms"] == "TIMESTAMP"


def test_the_key_column_is_the_request_id_the_ledger_is_keyed_by() -> None:
    assert DEFS.key_column == "request_id"
    assert DEFS.columns["sg_ledger"]["request_id"] == "STRING"
    assert {"name": "request_id", "type": "string"} in LEDGER["fields"]


def test_every_value_column_is_a_ledger_field_of_a_type_ksql_reads_it_as() -> None:
    fields = {f["name"]: f["type"] for f in LEDGER["fields"]}
    value_columns = {c: t for c, t in DEFS.columns["sg_ledger"].items() if c != DEFS.key_column}
    for column, ksql_type in value_columns.items():
        assert column in fields, f"column {column} is not a field of {LEDGER['name']}"
        kind, _ = avro_kind(fields[column])
        assert KSQL_TYPE_OF[kind] == ksql_type, f"{column}: Avro {kind} reads as " \
            f"{KSQL_TYPE_OF[kind]}, declared {ksql_type}"
    # ...and every field is a column (the value's request_id is the key): a field added to
    # the schema shows up here until the stream declares it.
    assert set(fields) == {*value_columns, DEFS.key_column}


def test_every_name_a_statement_or_query_uses_is_a_column_of_what_it_reads() -> None:
    assert len(DEFS.selects) >= 10  # the five tables and the questions' queries
    for select in DEFS.selects:
        m = SELECT.match(select)
        assert m is not None
        source = m.group(2)
        assert source in DEFS.columns, f"reads {source}, defined nowhere"
        aliases = set(re.findall(r"\bAS\s+(\w+)", select))
        unknown = identifiers(select) - set(DEFS.columns[source]) - aliases - {source}
        assert not unknown, f"{sorted(unknown)} are not columns of {source}: {select[:80]}"


def test_every_outcome_the_sql_compares_with_is_one_sluicegate_writes() -> None:
    compared = re.findall(r"outcome = '(\w+)'", code_of(ksql_definitions("sg.")))
    assert {"collapsed", "admitted", "queued"} <= set(compared)
    assert set(compared) <= {o.value for o in Outcome}


@pytest.mark.parametrize("question", ["collapsed", "waiting_ms", "reason"])
def test_each_of_the_three_questions_has_its_query(question: str) -> None:
    assert any(question in select for select in DEFS.selects)


def test_the_cli_prints_the_definitions_for_the_namespace() -> None:
    result = CliRunner().invoke(cli, ["ledger", "ksql", "--namespace", "acme."])
    assert result.exit_code == 0, result.output
    assert Definitions(result.stdout).stream_with["KAFKA_TOPIC"] == "acme.ledger"
    assert "sg.ledger" not in result.stdout
    assert "acme.ledger-value" in result.stdout  # the subject the stream's schema is in
