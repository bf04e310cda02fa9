"""`sluicegate workflows pause|unpause NAME`: the fleet-wide pause row (SPEC.md section 4).

A pause is one row of the compacted `sg.control` topic keyed `pause:<workflow>`; every
worker polls that table each loop, so it applies everywhere within about a second. While
paused, starts collect in the pause stage (never discarded); unpause drains them in
priority order. Unpause writes a row saying `paused=false` rather than a tombstone: the
workers drain on seeing the change, and the row keeps who lifted the pause and when.
"""

from __future__ import annotations

import getpass
import time
from typing import Annotated

import typer
from confluent_kafka import KafkaError, Producer

from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import ControlRow
from sluicegate.streams.control import pause_key
from sluicegate.topology.topics import Topics

app = typer.Typer(help="Operate on workflows: pause and unpause their starts.",
                  no_args_is_help=True)

Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers.",
                                               envvar="SLUICEGATE_BOOTSTRAP")]
Namespace = Annotated[str | None, typer.Option(help="Topic name prefix (default sg.).",
                                               envvar="SLUICEGATE_NAMESPACE")]
AppSpec = Annotated[str | None, typer.Option(
    "--app", help="Module with the declarations; when given, NAME must be declared there "
                  "(a misspelled pause is otherwise a row that pauses nothing).")]
By = Annotated[str | None, typer.Option(help="Who is doing this (default: the login name).")]


def _settings(bootstrap: str | None, namespace: str | None) -> Settings:
    # The top-level CLI's own helper (imported late: cli.py mounts this module).
    from sluicegate.ops.cli import _settings as cli_settings

    return cli_settings(bootstrap, namespace)


def _check_declared(name: str, app_spec: str | None, settings: Settings) -> None:
    if app_spec is None:
        return
    from sluicegate.declare import load_app

    declared = load_app(app_spec, settings)
    if declared.get(name) is None:
        known = ", ".join(sorted(declared.workflows)) or "none"
        typer.echo(f"workflow {name!r} is not declared in {app_spec} (declared: {known})",
                   err=True)
        raise typer.Exit(2)


def write_control(settings: Settings, row: ControlRow, timeout_s: float = 30.0) -> None:
    """Put one row on the control table and wait until the broker has it."""
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    producer.produce(Topics(settings).control, codec.encode(row), pause_key(row.workflow),
                     on_delivery=delivered)
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
    _check_declared(name, app_spec, settings)
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
    """Unpause NAME: the starts that collected are admitted in priority order."""
    settings = _settings(bootstrap, namespace)
    _check_declared(name, app_spec, settings)
    write_control(settings, ControlRow(workflow=name, paused=False,
                                       at_ms=int(time.time() * 1000), reason=reason,
                                       by=_who(by)))
    typer.echo(f"unpaused {name}; its collected starts drain in priority order")
