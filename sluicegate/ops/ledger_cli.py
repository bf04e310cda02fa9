"""`sluicegate ledger query|ask|questions|refresh`: SQL over the admissions ledger.

Each command first brings the DuckDB copy of `sg.ledger` up to the topic's current end
(unless `--no-refresh`), then answers from it. See docs/ledger-sql.md.
"""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from datetime import date, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sluicegate.config import Settings
from sluicegate.ops.ledger_tail import tail

if TYPE_CHECKING:
    from sluicegate.ops.ledger import LedgerDb, LedgerSqlError, RefreshReport, Result

# sluicegate.ops.ledger (and DuckDB, ~0.1 s to import) is imported by the commands that
# use it, so that every other `sluicegate` command starts as fast as before.

app = typer.Typer(help="SQL over the admissions ledger (DuckDB, refreshed from sg.ledger).",
                  no_args_is_help=True)

Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers.",
                                               envvar="SLUICEGATE_BOOTSTRAP")]
Namespace = Annotated[str | None, typer.Option(help="Topic name prefix (default sg.).",
                                               envvar="SLUICEGATE_NAMESPACE")]
Db = Annotated[Path | None, typer.Option(
    "--db", help="The DuckDB file (default: ledger.<namespace>duckdb next to the state dir).")]
NoRefresh = Annotated[bool, typer.Option(
    "--no-refresh", help="Answer from what the file already has; do not read the topic.")]


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


FormatOpt = Annotated[Format, typer.Option("--format", help="How to print the result.")]


def _settings(bootstrap: str | None, namespace: str | None, *, offline: bool = False,
              reach: bool = False) -> Settings:
    # The top-level CLI's own helper (imported late: cli.py mounts this module). `reach`:
    # the command reads the topic, so no broker is one line within --timeout.
    from sluicegate.ops.cli import _settings as cli_settings

    return cli_settings(bootstrap, namespace, offline=offline, reach=reach)


def _open(settings: Settings, db: Path | None, no_refresh: bool) -> LedgerDb:
    from sluicegate.ops.ledger import LedgerDb, default_db_path

    ledger = LedgerDb(db or default_db_path(settings))
    if not no_refresh:
        try:
            _refresh(ledger, settings)
        except BaseException:
            ledger.close()
            raise
    return ledger


def _refresh(ledger: LedgerDb, settings: Settings) -> RefreshReport:
    from sluicegate.ops.ledger import refresh

    report = refresh(ledger, settings)
    # Said on stderr so that --format json|csv output stays machine-readable.
    if report.trimmed:
        lost = ", ".join(f"[{p}] {n}" for p, n in report.trimmed)
        typer.echo(f"warning: retention deleted records before this file read them: {lost}",
                   err=True)
    if report.undecodable:
        typer.echo(f"warning: {report.undecodable} records were not ledger records, left out",
                   err=True)
    if report.unfinished:
        typer.echo("warning: partitions " + ", ".join(map(str, report.unfinished)) +
                   " are held by an open transaction; their newest rows are not in yet",
                   err=True)
    return report


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")  # payloads are JSON
        except UnicodeDecodeError:
            return value.hex()
    return str(value)


def _duration(value: timedelta) -> str:
    """`1h02m03s`, as `waiting=` reads in `flow`: whole seconds, largest unit first."""
    seconds = int(value.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{sign}{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return _text(value)


def _print(result: Result, fmt: Format, *, blocks: bool = False) -> None:
    """`blocks`: the table form as one block per row, for results too wide for a
    terminal's columns (`ask why`)."""
    if fmt is Format.table and blocks:
        typer.echo(_blocks(result))
        return
    if fmt is Format.json:
        typer.echo(json.dumps([{c: _json_value(v) for c, v in zip(result.columns, row,
                                                                  strict=True)}
                               for row in result.rows], indent=2))
    elif fmt is Format.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([_text(v) for v in row] for row in result.rows)
    else:
        n = len(result.rows)
        table = Table(*result.columns, caption=f"{n} row{'' if n == 1 else 's'}")
        for row in result.rows:
            table.add_row(*(_text(v) for v in row))
        Console().print(table)


BLOCK_WIDTH = 80
_LABEL = 15


def _blocks(result: Result) -> str:
    """One block per row, each at most BLOCK_WIDTH columns: the first three columns on
    its first line, then one line per other column that has a value (long ones wrapped
    under it). An empty key is the workflow's one key, as `flow` and `topology show`
    spell it."""
    from sluicegate.ops.flow import ONE_KEY

    out: list[str] = []
    for row in result.rows:
        values = dict(zip(result.columns, row, strict=True))
        head = "  ".join(_text(v) for v in row[:3])
        out.append(head if len(head) <= BLOCK_WIDTH else head[:BLOCK_WIDTH - 3] + "...")
        for column, value in list(values.items())[3:]:
            text = ONE_KEY if column == "key" and value == "" else _text(value)
            if not text:
                continue
            out.extend(textwrap.wrap(text, BLOCK_WIDTH, initial_indent=f"  {column:<{_LABEL - 2}}",
                                     subsequent_indent=" " * _LABEL, break_long_words=True))
        out.append("")
    n = len(result.rows)
    out.append(f"{n} request{'' if n == 1 else 's'}")
    return "\n".join(out)


def _fail(exc: LedgerSqlError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command("query")
def query(
    sql: Annotated[str, typer.Argument(help="SQL over the table `ledger`.")],
    fmt: FormatOpt = Format.table,
    no_refresh: NoRefresh = False,
    db: Db = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Refresh the ledger copy, run SQL over it (read-only: no statement changes the
    copy), print the result."""
    from sluicegate.ops.ledger import LedgerDb, LedgerSqlError

    try:
        settings = _settings(bootstrap, namespace, reach=not no_refresh)
        with _open(settings, db, no_refresh) as ledger:
            path = ledger.path  # made (and refreshed) by a writing connection, then closed
        with LedgerDb(path or ":memory:", read_only=True) as reader:
            result = reader.query(sql)
    except LedgerSqlError as exc:
        raise _fail(exc) from exc
    _print(result, fmt)


@app.command("ask")
def ask_cmd(
    name: Annotated[str, typer.Argument(help="lost, stuck or why (see `ledger questions`).")],
    request_id: Annotated[str | None, typer.Option(help="why: this request.")] = None,
    key: Annotated[str | None, typer.Option(help="why: the requests decided on this key.")] = None,
    limit: Annotated[int, typer.Option(help="why: at most this many requests.")] = 50,
    fmt: FormatOpt = Format.table,
    no_refresh: NoRefresh = False,
    db: Db = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Answer one of seed 000's three questions about what happened to starts."""
    from sluicegate.ops.ledger import QUESTIONS, LedgerSqlError, ask

    try:
        if name not in QUESTIONS:
            raise LedgerSqlError(f"no question {name!r}; ask one of {', '.join(QUESTIONS)}")
        with _open(_settings(bootstrap, namespace, reach=not no_refresh), db,
                   no_refresh) as ledger:
            result = ask(ledger, name, request_id=request_id, key=key, limit=limit)
    except LedgerSqlError as exc:
        raise _fail(exc) from exc
    _print(result, fmt, blocks=name == "why")


@app.command("questions")
def questions(
    show_sql: Annotated[bool, typer.Option("--sql", help="Print each question's SQL.")] = False,
) -> None:
    """The ready-made questions `ledger ask NAME` answers."""
    from sluicegate.ops.ledger import QUESTIONS

    for q in QUESTIONS.values():
        typer.echo(f"{q.name:6}  {q.asks}")
        if show_sql:
            typer.echo(q.sql.strip() + "\n")


@app.command("refresh")
def refresh_cmd(
    db: Db = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Bring the ledger copy up to the topic's current end, and say how many rows came."""
    from sluicegate.ops.ledger import LedgerDb, LedgerSqlError, default_db_path

    settings = _settings(bootstrap, namespace, reach=True)
    try:
        with LedgerDb(db or default_db_path(settings)) as ledger:
            report = _refresh(ledger, settings)
            (total,) = ledger.query("SELECT count(*) FROM ledger").rows[0]
    except LedgerSqlError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{report.rows} new rows from {report.topic}; {total} in {ledger.path}")


app.command("tail")(tail)  # sluicegate/ops/ledger_tail.py


@app.command("ksql")
def ksql(namespace: Namespace = None) -> None:
    """Print the ksqlDB definitions of the ledger stream and the three questions
    (read docs/ledger-sql.md first: ksqlDB needs sluicegate to run with a schema registry)."""
    text = ksql_definitions(_settings(None, namespace, offline=True).namespace)
    typer.echo(text)


def ksql_definitions(namespace: str) -> str:
    """The shipped ksqlDB file for a namespace: written for `sg.`, whose topic (and its
    subject, `<topic>-value`) are the only names that differ."""
    from importlib.resources import files

    text = files("sluicegate.ops").joinpath("ksql/ledger.sql").read_text(encoding="utf-8")
    return text.replace("sg.ledger", f"{namespace}ledger")
