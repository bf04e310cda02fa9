"""`sluicegate workflows pause|unpause NAME`: the fleet-wide pause row (SPEC.md section 4).

A pause is one row of the compacted `sg.control` topic keyed `pause:<workflow>`; every
worker polls that table each loop, so it applies everywhere within about a second. While
paused, starts collect in the pause stage (never discarded); unpause drains them in
priority order. Unpause writes a row saying `paused=false` rather than a tombstone: the
workers drain on seeing the change, and the row keeps who lifted the pause and when. The
one exception is a workflow the declarations no longer have: its row is deleted (the
workers failed what it had collected when they restored without it); `forget` deletes
such a row whether or not it pauses. Every workflow named here is checked first
(`sluicegate.ops.names`): declared in `--app`, or without it, seen by the cluster.
"""

from __future__ import annotations

import getpass
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from confluent_kafka import KafkaError, Producer

from sluicegate.admission.control import ControlTable, pause_key
from sluicegate.config import Settings
from sluicegate.ops import bulk
from sluicegate.ops.names import check_workflow, known_workflows, where_known
from sluicegate.schemas import codec
from sluicegate.schemas.records import ControlRow, RunStatus
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.declare import App

app = typer.Typer(help="Operate on workflows: pause and unpause their starts, see their flow.",
                  no_args_is_help=True)

Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers.",
                                               envvar="SLUICEGATE_BOOTSTRAP")]
Namespace = Annotated[str | None, typer.Option(help="Topic name prefix (default sg.).",
                                               envvar="SLUICEGATE_NAMESPACE")]
AppSpec = Annotated[str | None, typer.Option(
    "--app", help="Module with the declarations: the workflow must be declared there "
                  "(without it: one the cluster has seen).")]
By = Annotated[str | None, typer.Option(help="Who is doing this (default: the login name).")]


def _settings(bootstrap: str | None, namespace: str | None) -> Settings:
    # The top-level CLI's own helper (imported late: cli.py mounts this module). Every
    # command here talks to Kafka: no broker is one line within --timeout.
    from sluicegate.ops.cli import _settings as cli_settings

    return cli_settings(bootstrap, namespace, reach=True)


def _declared(app_spec: str | None, settings: Settings) -> App | None:
    if app_spec is None:
        return None
    from sluicegate.declare import load_app

    return load_app(app_spec, settings)


def _check_known(name: str, app_spec: str | None, settings: Settings) -> None:
    """NAME is a workflow of `app_spec`, or (without one) one the cluster has seen; else
    UnknownName with a did-you-mean (one line, exit code 2)."""
    check_workflow(name, known_workflows(settings, _declared(app_spec, settings)),
                   where=where_known(app_spec))


def _pause_row(settings: Settings, name: str) -> ControlRow | None:
    """NAME's current row on the control table, if it has one."""
    return _control_rows(settings).get(name)


def _control_rows(settings: Settings) -> dict[str, ControlRow]:
    table = ControlTable(settings)
    try:
        table.catch_up(timeout_s=10.0)
        return table.rows
    finally:
        table.close()


def write_control(settings: Settings, row: ControlRow, timeout_s: float = 30.0, *,
                  delete: bool = False) -> None:
    """Put one row on the control table (or, with `delete`, a tombstone for its workflow)
    and wait until the broker has it."""
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    producer.produce(Topics(settings).control, None if delete else codec.encode(row),
                     pause_key(row.workflow), on_delivery=delivered)
    if producer.flush(timeout_s) or errors:
        raise RuntimeError(f"could not write the control row for {row.workflow}: "
                           f"{errors or 'not delivered within ' + str(timeout_s) + 's'}")


def _who(by: str | None) -> str:
    if by:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


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
    settings = _settings(bootstrap, namespace)
    _check_known(name, app_spec, settings)
    write_control(settings, ControlRow(workflow=name, paused=True,
                                       at_ms=int(time.time() * 1000), reason=reason,
                                       by=_who(by)))
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
    settings = _settings(bootstrap, namespace)
    row = ControlRow(workflow=name, paused=False, at_ms=int(time.time() * 1000),
                     reason=reason, by=_who(by))
    declared = _declared(app_spec, settings)
    if declared is not None and declared.get(name) is None:
        _unpause_removed(settings, row, app_spec or "", set(declared.workflows))
        return
    _check_known(name, app_spec, settings)
    current = _pause_row(settings, name)
    if current is None or not current.paused:
        # Nothing collected, nothing to drain: say so, and write no row.
        typer.echo(f"{name} is not paused: nothing to unpause")
        return
    write_control(settings, row)
    typer.echo(f"unpaused {name}; its collected starts drain in priority order")


def _unpause_removed(settings: Settings, row: ControlRow, app_spec: str,
                     declared: set[str]) -> None:
    """Unpause of a workflow `app_spec` does not declare: its pause row is deleted, when
    it has one that pauses; otherwise the name is a typo of a declared one."""
    name = row.workflow
    current = _pause_row(settings, name)
    if current is None or not current.paused:
        check_workflow(name, declared, where=f"declared in {app_spec}, and it is not paused")
    write_control(settings, row, delete=True)
    typer.echo(f"unpaused {name} and deleted its pause row: {app_spec} does not declare it, "
               f"so the starts it collected fail (workflow removed from the declarations) "
               f"on workers running those declarations")


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
    settings = _settings(bootstrap, namespace)
    declared = _declared(app_spec, settings)
    if declared is not None and declared.get(name) is not None:
        typer.echo(f"error: {name} is declared in {app_spec}: `sluicegate workflows unpause "
                   f"{name}` lifts its pause; forget is for workflows that no longer exist",
                   err=True)
        raise typer.Exit(2)
    rows = _control_rows(settings)
    check_workflow(name, set(rows), what="control row for", where="on the control table")
    write_control(settings, ControlRow(workflow=name, paused=False,
                                       at_ms=int(time.time() * 1000)), delete=True)
    state = "paused" if rows[name].paused else "not paused"
    typer.echo(f"forgot {name}: its control row ({state}) is deleted")


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
    from sluicegate.ops.flow import FlowReader, concurrency_limits
    from sluicegate.ops.ledger import LedgerDb, LedgerSqlError, default_db_path

    if fmt not in ("text", "json"):
        typer.echo(f"--format must be text or json, not {fmt!r}", err=True)
        raise typer.Exit(2)
    settings = _settings(bootstrap, namespace)
    app_declared = _declared(app_spec, settings)
    declared = sorted(app_declared.workflows) if app_declared is not None else []
    try:
        with LedgerDb(db or default_db_path(settings)) as ledger:
            reader = FlowReader(settings, ledger, declared,
                                limits=concurrency_limits(app_declared))
            try:
                view = reader.view()
            finally:
                reader.close()
    except LedgerSqlError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if workflow is not None:
        known = declared if app_declared is not None else [w.workflow for w in view.workflows]
        check_workflow(workflow, known, where=where_known(app_spec))
        view = view.only(workflow)
    typer.echo(json.dumps(view.to_json(), indent=2) if fmt == "json" else view.text())


# -- bulk cancel and replay (sluicegate/ops/bulk.py) ------------------------------------

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
    settings = _settings(bootstrap, namespace)
    _check_known(workflow, app_spec, settings)
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
    chosen: bulk.Mode = "redrive" if mode == "redrive" else "retry"
    settings = _settings(bootstrap, namespace)
    if workflow is not None:
        _check_known(workflow, app_spec, settings)
    if commit:
        result = _with_progress(fmt, lambda progress: bulk.apply_replay(
            settings, status, chosen, limit, workflow=workflow, reason=reason,
            progress=progress))
    else:
        result = bulk.preview_replay(settings, status, chosen, limit, workflow=workflow)
    _report(result, fmt)
    if result.failed:
        raise typer.Exit(1)
