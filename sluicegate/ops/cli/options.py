"""The options every command shares, and the settings a command runs with.

The root callback (`sluicegate [--debug] [--timeout S] ...`, `root.py`) records its options
here before a command runs; `settings` gives a command its settings with that timeout.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from sluicegate.config import Settings
from sluicegate.ops.services.settings import DEFAULT_TIMEOUT_S, command_settings

Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers.",
                                               envvar="SLUICEGATE_BOOTSTRAP")]
Namespace = Annotated[str | None, typer.Option(help="Topic name prefix (default sg.).",
                                               envvar="SLUICEGATE_NAMESPACE")]
AppSpec = Annotated[str, typer.Option("--app", help="Module with the declarations (`module` "
                                      "or `module:attr`).")]

# Set by the root callback before a command runs.
given: dict[str, Any] = {"debug": False, "timeout": DEFAULT_TIMEOUT_S}


def settings(bootstrap: str | None, namespace: str | None, *, offline: bool = False,
             reach: bool = False, **more: object) -> Settings:
    """The command's settings (`command_settings`); with `reach`, a broker must answer
    within --timeout."""
    return command_settings(bootstrap, namespace, offline=offline, reach=reach,
                            timeout_s=given["timeout"], **more)


def fail(message: str, code: int = 2) -> typer.Exit:
    """`error: <message>` on stderr, and the exit code to raise (docs/decisions/cli-errors.md)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)
