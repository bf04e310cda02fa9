"""`sluicegate runs show ID`: a run or request, whole (`sluicegate.ops.services.runs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from sluicegate.ops.cli import options
from sluicegate.ops.cli.options import Bootstrap, Namespace

app = typer.Typer(help="One run or request: its run row and its whole ledger history.",
                  no_args_is_help=True)


@app.command("show")
def show(
    ident: Annotated[str, typer.Argument(
        metavar="ID", help="An execution id (or its first 6+ characters), a request id, or "
                           "an idempotency key.")],
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    db: Annotated[str | None, typer.Option(
        "--db", help="The ledger DuckDB file (default: the one `sluicegate ledger` uses).")]
        = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """A run or request: its run row and its whole ledger history."""
    from sluicegate.ops.services import runs
    from sluicegate.ops.services.control import control_rows

    if fmt not in ("text", "json"):
        raise typer.BadParameter("--format is text or json")
    # No broker, a ledger file in use: one line from the CLI's error handling.
    settings = options.settings(bootstrap, namespace, reach=True)
    try:
        doc = runs.show(settings, ident, Path(db) if db else None, control_rows(settings))
    except runs.NotFound as exc:
        raise options.fail(str(exc), 1) from None
    typer.echo(json.dumps(doc, indent=2) if fmt == "json" else runs.text(doc))
