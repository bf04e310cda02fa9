"""`sluicegate workflows pause|unpause|forget|limit|flow|cancel-many|replay-many`: thin
over `sluicegate.ops.services.control`, `.overrides`, `.flow` and `.bulk`, which say what
each does."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sluicegate.config import Settings
from sluicegate.ops.cli import options
from sluicegate.ops.cli.options import Bootstrap, Namespace
from sluicegate.schemas.records import RunStatus

if TYPE_CHECKING:
    from sluicegate.declare import App
    from sluicegate.ops.services import bulk

app = typer.Typer(help="Operate on workflows: pause and unpause their starts, see their flow.",
                  no_args_is_help=True)

AppSpec = Annotated[str | None, typer.Option(
    "--app", help="Module with the declarations: the workflow must be declared there "
                  "(without it: one the cluster has seen).")]
By = Annotated[str | None, typer.Option(help="Who is doing this (default: the login name).")]


def _settings(bootstrap: str | None, namespace: str | None) -> Settings:
    # Every command here talks to Kafka: no broker is one line within --timeout.
    return options.settings(bootstrap, namespace, reach=True)


def _declared(app_spec: str | None, settings: Settings) -> App | None:
    if app_spec is None:
        return None
    from sluicegate.declare import load_app

    return load_app(app_spec, settings)


@app.command("pause")
def pause(
    name: Annotated[str, typer.Argument(help="The workflow to pause.")],
    reason: Annotated[str, typer.Option(help="Why (recorded on the pause row).")],
    by: By = None,
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Pause NAME fleet-wide: its starts collect (none is discarded) until unpause."""
    from sluicegate.ops.services import control

    settings = _settings(bootstrap, namespace)
    control.pause(settings, name, reason, by, app=_declared(app_spec, settings),
                  app_spec=app_spec)
    typer.echo(f"paused {name}: {reason}")


@app.command("unpause")
def unpause(
    name: Annotated[str, typer.Argument(help="The workflow to unpause.")],
    reason: Annotated[str | None, typer.Option(help="Why (recorded on the row).")] = None,
    by: By = None,
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Unpause NAME: the starts that collected are admitted in priority order.

    With --app not declaring NAME, a workflow removed while paused: its pause row is
    deleted (what it collected failed when the workers restored without it)."""
    from sluicegate.ops.services import control

    settings = _settings(bootstrap, namespace)
    done = control.unpause(settings, name, reason, by, app=_declared(app_spec, settings),
                           app_spec=app_spec)
    if done is control.Unpaused.deleted:
        typer.echo(f"unpaused {name} and deleted its pause row: {app_spec} does not declare "
                   f"it, so the starts it collected fail (workflow removed from the "
                   f"declarations) on workers running those declarations")
    elif done is control.Unpaused.not_paused:
        # Nothing collected, nothing to drain: say so (no row was written).
        typer.echo(f"{name} is not paused: nothing to unpause")
    else:
        typer.echo(f"unpaused {name}; its collected starts drain in priority order")


@app.command("forget")
def forget(
    name: Annotated[str, typer.Argument(help="The workflow whose control row goes.")],
    app_spec: Annotated[str, typer.Option(
        "--app", help="Module with the declarations (required): NAME must not be declared "
                      "there.")],
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Delete the control (pause) row of a workflow the declarations do not have: a
    misspelled pause, or a workflow removed since (docs/decisions/forget-control-rows.md)."""
    from sluicegate.declare import load_app
    from sluicegate.ops.services import control

    settings = _settings(bootstrap, namespace)
    try:
        row = control.forget(settings, name, app=load_app(app_spec, settings),
                             app_spec=app_spec)
    except control.StillDeclared as exc:
        raise options.fail(str(exc)) from None
    state = "paused" if row.paused else "not paused"
    typer.echo(f"forgot {name}: its control row ({state}) is deleted")


@app.command("limit")
def limit(
    name: Annotated[str | None, typer.Argument(
        help="The workflow whose limit changes (or --pool).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        min=1, help="The concurrency limit in force from now on.")] = None,
    rate_limit: Annotated[str | None, typer.Option(
        "--rate-limit", help="The rateLimit in force from now on: LIMIT/PERIOD (10/1m).")]
        = None,
    throttle: Annotated[str | None, typer.Option(
        help="The throttle in force from now on: LIMIT/PERIOD (60/1m).")] = None,
    clear: Annotated[bool, typer.Option(
        "--clear", help="Remove the override: the declared limit applies again.")] = False,
    control: Annotated[str, typer.Option(
        help="Which limit --clear clears: concurrency, throttle or rate-limit.")]
        = "concurrency",
    pool: Annotated[str | None, typer.Option(
        help="A concurrency (or, with --throttle, throttle) pool: the override applies to "
             "every member.")] = None,
    nth: Annotated[int, typer.Option(
        min=1, help="Which of the workflow's concurrency limits (1 or 2), or with "
                    "--throttle which of its throttles (1 for its first).")] = 1,
    reason: Annotated[str, typer.Option(help="Why (on the row and the ledger).")] = "",
    by: By = None,
    app_spec: Annotated[str, typer.Option(
        "--app", help="Module with the declarations (required: the declared limit is the "
                      "default an override replaces).")] = "",
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Override a concurrency limit, a throttle or a rateLimit fleet-wide, without a
    deploy: starts
    admitted from now on are judged by it. Raising admits waiting starts at once;
    lowering cancels no run, the key drains down to it. --clear returns to the
    declaration. Every change is a ledger row (docs/decisions/limit-overrides.md)."""
    from sluicegate.declare import load_app
    from sluicegate.ops.services import overrides

    given = sum(x is not None for x in (concurrency, rate_limit, throttle)) + clear
    if given != 1:
        raise options.fail("give one of --concurrency N, --throttle LIMIT/PERIOD, "
                           "--rate-limit LIMIT/PERIOD, --clear")
    controls = {"concurrency": "concurrency", "throttle": "throttle",
                "rate-limit": "rateLimit"}
    if control not in controls:
        raise options.fail(f"--control must be concurrency, throttle or rate-limit, not "
                           f"{control!r}")
    if not reason:
        raise options.fail("--reason is required: it is recorded on the row and the ledger")
    if not app_spec:
        raise options.fail("--app is required: the declared limit is the default an "
                           "override replaces")
    try:
        rate = None if rate_limit is None else overrides.parse_rate(rate_limit)
        pace = None if throttle is None else overrides.parse_rate(throttle)
    except overrides.OverrideError as exc:
        raise options.fail(str(exc)) from None
    settings = _settings(bootstrap, namespace)
    try:
        change = overrides.change_limit(
            settings, load_app(app_spec, settings), name, concurrency=concurrency,
            rate_limit=rate, throttle=pace, control=controls[control],
            pool=pool, nth=nth, reason=reason, by=by)
    except overrides.OverrideError as exc:
        raise options.fail(str(exc)) from None
    typer.echo(change.text())


@app.command("flow")
def flow(
    workflow: Annotated[str | None, typer.Option(help="Only this workflow.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Module with the declarations: list every declared workflow, also "
                      "those with nothing to show.")] = None,
    db: Annotated[Path | None, typer.Option(
        "--db", help="The ledger's DuckDB file (default: the one `sluicegate ledger` "
                     "uses).")] = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Per workflow and key: queued, waiting=, collapsed, dropped, expired, in flight,
    paused (the same JSON as GET /inspect/workflows/flow-control)."""
    from sluicegate.ops.services.flow import read_flow
    from sluicegate.ops.services.ledger import LedgerSqlError
    from sluicegate.ops.services.names import check_workflow, where_known

    if fmt not in ("text", "json"):
        typer.echo(f"--format must be text or json, not {fmt!r}", err=True)
        raise typer.Exit(2)
    settings = _settings(bootstrap, namespace)
    declared = _declared(app_spec, settings)
    try:
        view = read_flow(settings, db, declared)
    except LedgerSqlError as exc:
        raise options.fail(str(exc)) from exc
    if workflow is not None:
        known = (sorted(declared.workflows) if declared is not None
                 else [w.workflow for w in view.workflows])
        check_workflow(workflow, known, where=where_known(app_spec))
        view = view.only(workflow)
    typer.echo(json.dumps(view.to_json(), indent=2) if fmt == "json" else view.text())


# -- bulk cancel and replay (sluicegate/ops/services/bulk.py) ---------------------------

Limit = Annotated[int, typer.Option(
    "--limit", min=1, help="At most this many runs (required: the blast radius; no 'all').")]
Commit = Annotated[bool, typer.Option(
    "--commit", help="Act. Without it this is a dry run that changes nothing.")]
BulkFormat = Annotated[str, typer.Option("--format", help="text or json.")]


def _report(result: bulk.BulkResult, fmt: str) -> None:
    if fmt == "json":
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    head = "done" if result.committed else "dry run (pass --commit to act)"
    typer.echo(f"{result.verb}: {head}: {len(result.succeeded)} "
               f"{'succeeded' if result.committed else 'eligible'}, {len(result.failed)} "
               f"failed, {result.ineligible} skipped"
               + (f"; truncated: {result.eligible} were eligible, --limit {result.limit}"
                  if result.truncated else ""))
    for label, runs in (("ok", result.succeeded), ("FAILED", result.failed),
                        ("skipped", result.skipped)):
        for run in runs:
            typer.echo(f"  {label:8} {run.execution_id} {run.workflow} [{run.status}] "
                       f"{run.detail or ''}")


def _with_progress(fmt: str, act: Callable[[bulk.Progress | None], bulk.BulkResult]
                   ) -> bulk.BulkResult:
    """A progress bar on stderr while a long apply sends its records."""
    from rich.progress import Progress

    if fmt == "json":
        return act(None)
    with Progress(transient=True) as bar:
        task = bar.add_task("sending", total=None)
        return act(lambda done, total: bar.update(task, completed=done, total=total))


@app.command("cancel-many")
def cancel_many(
    workflow: Annotated[str, typer.Option("--workflow", help="The workflow whose runs stop.")],
    reason: Annotated[str, typer.Option(
        "--reason", help="Why (required: recorded on every cancelled run).")],
    limit: Limit,
    commit: Commit = False,
    fmt: BulkFormat = "text",
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Cancel live runs (admitted, running, suspended) of a workflow, at most --limit."""
    if not reason.strip():
        typer.echo("--reason must say why: it is recorded on every cancelled run", err=True)
        raise typer.Exit(2)
    from sluicegate.ops.services import bulk
    from sluicegate.ops.services.names import check_known

    settings = _settings(bootstrap, namespace)
    check_known(settings, workflow, _declared(app_spec, settings), app_spec)
    if commit:
        result = _with_progress(fmt, lambda progress: bulk.apply_cancel(
            settings, workflow, reason, limit, progress=progress))
    else:
        result = bulk.preview_cancel(settings, workflow, limit)
    _report(result, fmt)
    if result.failed:
        raise typer.Exit(1)


@app.command("replay-many")
def replay_many(
    status: Annotated[RunStatus, typer.Option("--status", help="Which runs to replay.")],
    mode: Annotated[str, typer.Option(
        "--mode", help="redrive (failed runs resume from the failed step) or retry (failed "
                       "and cancelled runs start afresh); no default.")],
    limit: Limit,
    workflow: Annotated[str | None, typer.Option("--workflow", help="Only this one.")] = None,
    reason: Annotated[str | None, typer.Option(
        "--reason", help="Why (recorded on each replayed run's ledger row).")] = None,
    commit: Commit = False,
    fmt: BulkFormat = "text",
    app_spec: AppSpec = None,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
) -> None:
    """Redrive or retry runs of a status, at most --limit."""
    if mode not in ("redrive", "retry"):
        typer.echo("--mode must be redrive or retry", err=True)
        raise typer.Exit(2)
    from sluicegate.ops.services import bulk
    from sluicegate.ops.services.names import check_known

    chosen: bulk.Mode = "redrive" if mode == "redrive" else "retry"
    settings = _settings(bootstrap, namespace)
    if workflow is not None:
        check_known(settings, workflow, _declared(app_spec, settings), app_spec)
    if commit:
        result = _with_progress(fmt, lambda progress: bulk.apply_replay(
            settings, status, chosen, limit, workflow=workflow, reason=reason,
            progress=progress))
    else:
        result = bulk.preview_replay(settings, status, chosen, limit, workflow=workflow)
    _report(result, fmt)
    if result.failed:
        raise typer.Exit(1)
