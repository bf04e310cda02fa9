"""`sluicegate inspect serve`: the inspect server (`sluicegate.ops.inspect`) on a port."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from sluicegate.ops.cli import options
from sluicegate.ops.cli.options import Bootstrap, Namespace

# The server (Starlette, uvicorn, DuckDB, prometheus_client) is imported when it starts, so
# that every other `sluicegate` command starts as fast as before.

app = typer.Typer(help="The operator's console over HTTP, its JSON, and Prometheus metrics.",
                  no_args_is_help=True)


@app.command("serve")
def serve(
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8787,
    host: Annotated[str, typer.Option(
        help="The address to listen on (0.0.0.0: every interface; then anyone who can "
             "reach it can read it, and change it with the token).")] = "127.0.0.1",
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="Another name this server is reached by (its Host header); "
                               "repeatable.")] = None,
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Module with the declarations: list every declared workflow, check "
                      "names against them, show limits.")] = None,
    db: Annotated[Path | None, typer.Option(
        "--db", help="Keep the ledger copy in this DuckDB file (default: in memory).")] = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Serve the console, its JSON and /metrics until Ctrl-C. Changes (pause, bulk) need
    the token: SLUICEGATE_INSPECT_TOKEN, else one made now and printed once."""
    from sluicegate.ops.inspect import (
        FLOW_PATH,
        LOOPBACK_NAMES,
        TOKEN_ENV,
        ModuleBulkOps,
        open_server,
    )

    settings = options.settings(bootstrap, namespace)
    declared_app = None
    if app_spec is not None:
        from sluicegate.declare import load_app

        declared_app = load_app(app_spec, settings)
    token = os.environ.get(TOKEN_ENV) or None
    server = open_server(settings, db=db or ":memory:", app=declared_app,
                         bulk=ModuleBulkOps(settings), host=host, port=port, token=token,
                         allowed_hosts=tuple(allowed_host or ()), app_spec=app_spec)
    typer.echo(f"serving {server.url}/ (flow: {server.url}{FLOW_PATH}, metrics: "
               f"{server.url}/metrics)")
    if host not in LOOPBACK_NAMES:
        typer.echo(f"listening on {host}, not only on this machine: whoever reaches it can "
                   "read the console, and change things with the token", err=True)
    if token is None:
        typer.echo(f"token: {server.token}  (a change sends it as `Authorization: Bearer "
                   f"<token>`; the console's page has it already; {TOKEN_ENV} chooses it)")
    else:
        typer.echo(f"token: the one {TOKEN_ENV} gives")
    server.serve_forever()
