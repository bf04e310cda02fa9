"""`sluicegate ledger query|ask|questions|refresh|tail|ksql`: SQL over the admissions ledger
(`sluicegate.ops.services.ledger`), and its decisions as they are written.

Each SQL command first brings the DuckDB copy of `sg.ledger` up to the topic's current end
(unless `--no-refresh`), then answers from it. See docs/ledger-sql.md.
"""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sluicegate.config import Settings
from sluicegate.ops.cli import options
from sluicegate.ops.cli.options import Bootstrap, Namespace

if TYPE_CHECKING:
    from sluicegate.ops.services.ledger import LedgerDb, LedgerSqlError, RefreshReport, Result

# sluicegate.ops.services.ledger (and DuckDB, ~0.1 s to import) is imported by the commands
# that use it, so that every other `sluicegate` command starts as fast as before.

app = typer.Typer(help="SQL over the admissions ledger (DuckDB, refreshed from sg.ledger).",
                  no_args_is_help=True)

Db = Annotated[Path | None, typer.Option(
    "--db", help="The DuckDB file (default: ledger.<namespace>duckdb next to the state dir).")]
NoRefresh = Annotated[bool, typer.Option(
    "--no-refresh", help="Answer from what the file already has; do not read the topic.")]


class Format(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


FormatOpt = Annotated[Format, typer.Option("--format", help="How to print the result.")]


def _open(settings: Settings, db: Path | None, no_refresh: bool
          ) -> tuple[LedgerDb, RefreshReport]:
    """The ledger copy, refreshed unless `no_refresh`, and the refresh's report; what the
    refresh missed is said on stderr, so that --format json|csv output stays
    machine-readable."""
    from sluicegate.ops.services.ledger import open_copy

    ledger, report = open_copy(settings, db, fresh=not no_refresh)
    for warning in report.warnings():
        typer.echo(f"warning: {warning}", err=True)
    return ledger, report


def _print(result: Result, fmt: Format, *, blocks: bool = False) -> None:
    """`blocks`: the table form as one block per row, for results too wide for a
    terminal's columns (`ask why`)."""
    from sluicegate.ops.services import formatting

    if fmt is Format.table and blocks:
        typer.echo(formatting.blocks(result.columns, result.rows))
        return
    if fmt is Format.json:
        typer.echo(json.dumps([{c: formatting.json_value(v)
                                for c, v in zip(result.columns, row, strict=True)}
                               for row in result.rows], indent=2))
    elif fmt is Format.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows([formatting.cell_text(v) for v in row] for row in result.rows)
    else:
        from rich.console import Console
        from rich.table import Table

        n = len(result.rows)
        table = Table(*result.columns, caption=f"{n} row{'' if n == 1 else 's'}")
        for row in result.rows:
            table.add_row(*(formatting.cell_text(v) for v in row))
        Console().print(table)


def _fail(exc: LedgerSqlError) -> typer.Exit:
    return options.fail(str(exc))


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
    from sluicegate.ops.services.ledger import LedgerDb, LedgerSqlError

    try:
        settings = options.settings(bootstrap, namespace, reach=not no_refresh)
        ledger, _ = _open(settings, db, no_refresh)
        with ledger:
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
    from sluicegate.ops.services.ledger import QUESTIONS, LedgerSqlError, ask

    try:
        if name not in QUESTIONS:
            raise LedgerSqlError(f"no question {name!r}; ask one of {', '.join(QUESTIONS)}")
        ledger, _ = _open(options.settings(bootstrap, namespace, reach=not no_refresh), db,
                          no_refresh)
        with ledger:
            result = ask(ledger, name, request_id=request_id, key=key, limit=limit)
    except LedgerSqlError as exc:
        raise _fail(exc) from exc
    _print(result, fmt, blocks=name == "why")


@app.command("questions")
def questions(
    show_sql: Annotated[bool, typer.Option("--sql", help="Print each question's SQL.")] = False,
) -> None:
    """The ready-made questions `ledger ask NAME` answers."""
    from sluicegate.ops.services.ledger import QUESTIONS

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
    from sluicegate.ops.services.ledger import LedgerSqlError

    settings = options.settings(bootstrap, namespace, reach=True)
    try:
        ledger, report = _open(settings, db, no_refresh=False)
        with ledger:
            (total,) = ledger.query("SELECT count(*) FROM ledger").rows[0]
    except LedgerSqlError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{report.rows} new rows from {report.topic}; {total} in {ledger.path}")


@app.command("tail")
def tail(
    workflow: Annotated[str | None, typer.Option(help="Only this workflow's decisions.")] = None,
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Module with the declarations; --workflow must be declared there "
                      "(without it, one the cluster has seen).")] = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Print each decision as it is written to the ledger, until Ctrl-C."""
    from sluicegate.ops.cli.output import follow

    # No broker, an unknown workflow: one line from the CLI's error handling.
    settings = options.settings(bootstrap, namespace, reach=True)
    if workflow is not None:
        from sluicegate.declare import load_app
        from sluicegate.ops.services.names import check_known

        check_known(settings, workflow, load_app(app_spec, settings) if app_spec else None,
                    app_spec)
    follow(settings, workflow)


@app.command("ksql")
def ksql(namespace: Namespace = None) -> None:
    """Print the ksqlDB definitions of the ledger stream and the three questions
    (read docs/ledger-sql.md first: ksqlDB needs sluicegate to run with a schema registry)."""
    from sluicegate.ops.services.ledger import ksql_definitions

    typer.echo(ksql_definitions(options.settings(None, namespace, offline=True).namespace))
