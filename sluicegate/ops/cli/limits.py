"""`sluicegate limits set|unset|list`: thin over `sluicegate.ops.services.limits`, which
says what each does."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from sluicegate.config import Settings
from sluicegate.ops.cli import options
from sluicegate.ops.cli.options import Bootstrap, Namespace

if TYPE_CHECKING:
    from sluicegate.declare import App

app = typer.Typer(help="Per-key limits (tenant tiers): the limits table a limit declared "
                       "with per_key reads.", no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="The per_key name the limits declare.")]
Key = Annotated[str, typer.Argument(help="The key's value (a tenant, an account).")]
AppSpec = Annotated[str | None, typer.Option(
    "--app", help="Module with the declarations: NAME must be a per_key declared there.")]


def _settings(bootstrap: str | None, namespace: str | None) -> Settings:
    return options.settings(bootstrap, namespace, reach=True)


def _declared(app_spec: str | None, settings: Settings) -> App | None:
    if app_spec is None:
        return None
    from sluicegate.declare import load_app

    return load_app(app_spec, settings)


def _refused(exc: ValueError) -> typer.Exit:
    # As every other refused command says it (exit code 2, one line).
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


@app.command("set")
def set_(
    name: Name,
    key: Key,
    limit: Annotated[int, typer.Argument(help="Its limit, in the declared limit's unit.")],
    reason: Annotated[str | None, typer.Option(help="Why (recorded on the row).")] = None,
    by: Annotated[str | None, typer.Option(help="Who (default: the login name).")] = None,
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """KEY of the limits declared with per_key NAME gets LIMIT.

    Fleet-wide within a second or two: the starts a raised limit lets go are admitted at
    once; a lowered one cancels nothing."""
    from sluicegate.ops.services import limits

    settings = _settings(bootstrap, namespace)
    try:
        limits.set_limit(settings, name, key, limit, reason=reason, by=by,
                         app=_declared(app_spec, settings), app_spec=app_spec)
    except ValueError as exc:
        raise _refused(exc) from None
    typer.echo(f"set {name}:{key} to {limit}" + (f": {reason}" if reason else ""))


@app.command("unset")
def unset(
    name: Name,
    key: Key,
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """KEY back to the declared limit (the row is deleted)."""
    from sluicegate.ops.services import limits

    settings = _settings(bootstrap, namespace)
    try:
        gone = limits.unset_limit(settings, name, key, app=_declared(app_spec, settings),
                                  app_spec=app_spec)
    except ValueError as exc:
        raise _refused(exc) from None
    if gone is None:
        typer.echo(f"{name}:{key} has no row: it has the declared limit already")
    else:
        typer.echo(f"unset {name}:{key} (was {gone.limit}): back to the declared limit")


@app.command("list")
def list_(
    name: Annotated[str | None, typer.Argument(help="Only the rows of this name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Every row of the limits table: name, key, limit, since when, by whom, why."""
    from sluicegate.ops.services import limits
    from sluicegate.ops.services.formatting import iso

    rows = limits.limit_rows(_settings(bootstrap, namespace), name)
    for row in rows:
        if as_json:
            typer.echo(json.dumps({"name": row.name, "key": row.key, "limit": row.limit,
                                   "at_ms": row.at_ms, "by": row.by, "reason": row.reason}))
            continue
        said = f" by {row.by}" if row.by else ""
        why = f": {row.reason}" if row.reason else ""
        typer.echo(f"{row.name}:{row.key}  {row.limit}  since {iso(row.at_ms)}"
                   f"{said}{why}")
    if not rows and not as_json:
        typer.echo("no rows: every key has its declared limit")
