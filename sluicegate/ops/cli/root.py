"""The command group `sluicegate <group> <verb>`: the root options, the commands of no group,
and the errors an operator can act on as one line (the script starts at `entry.main`)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from sluicegate.ops import signals
from sluicegate.ops.cli import options
from sluicegate.ops.cli.inspect import app as inspect_app
from sluicegate.ops.cli.ledger import app as ledger_app
from sluicegate.ops.cli.limits import app as limits_app
from sluicegate.ops.cli.localkafka import app as kafka_app
from sluicegate.ops.cli.localkafka import registry_app
from sluicegate.ops.cli.options import AppSpec, Bootstrap, Namespace
from sluicegate.ops.cli.runs import app as runs_app
from sluicegate.ops.cli.workflows import app as workflows_app
from sluicegate.ops.services.settings import DEFAULT_TIMEOUT_S


class _OneLineErrors(TyperGroup):
    """Every command's errors that an operator can act on become one line and an exit
    code (`_one_line`) instead of a traceback; `--debug` keeps the traceback."""

    # `Any`: typer vendors its own click, whose Context is not public.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            said = _one_line(exc)
            if said is None or options.given["debug"]:
                raise
            message, code = said
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(code) from None


app = typer.Typer(
    cls=_OneLineErrors,
    name="sluicegate",
    help="Kafka-native admission control for workflow runs.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(kafka_app, name="kafka", help="A local single-node Kafka broker for development.")
app.add_typer(registry_app, name="registry",
              help="A local schema registry for development (Apicurio, in memory).")
topics_app = typer.Typer(help="The topics sluicegate uses.", no_args_is_help=True)
topology_app = typer.Typer(help="The route each workflow's starts take.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")
app.add_typer(topology_app, name="topology")
app.add_typer(workflows_app, name="workflows")
app.add_typer(limits_app, name="limits")
app.add_typer(ledger_app, name="ledger")
app.add_typer(inspect_app, name="inspect")
app.add_typer(runs_app, name="runs")

@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option(
        "--debug", help="Show the traceback of an error, and Kafka clients' own log lines.")
    ] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=0.1, envvar="SLUICEGATE_TIMEOUT",
        help="Seconds to wait for the Kafka broker to answer before giving up.")
    ] = DEFAULT_TIMEOUT_S,
) -> None:
    options.given.update(debug=debug, timeout=timeout)
    if ctx.invoked_subcommand != "worker":
        # Only the worker has a graceful stop; every other command gets the signals'
        # default behaviour back, and a signal sent while it started acts now.
        signals.release()
    if debug:
        logging.basicConfig(level=logging.DEBUG,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@topics_app.command("create")
def topics_create(
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Also the event topics this app's cancelOn entries read.")] = None,
) -> None:
    """Create every topic (idempotent) and say what was created."""
    from sluicegate.declare import load_app
    from sluicegate.topology.admin import create_topics

    settings = options.settings(bootstrap, namespace, reach=True)
    report = create_topics(settings, load_app(app_spec, settings) if app_spec else None)
    for spec in report.created:
        kind = " (compacted)" if spec.compacted else ""
        typer.echo(f"created  {spec.name}  partitions={spec.partitions}{kind}")
    for spec in report.existing:
        typer.echo(f"exists   {spec.name}")
    for spec, actual in report.mismatched:
        typer.echo(f"MISMATCH {spec.name}: has {actual} partitions, wants {spec.partitions}",
                   err=True)
    typer.echo(f"{len(report.created)} created, {len(report.existing)} already there")
    if report.mismatched:
        raise typer.Exit(1)


@topology_app.command("show")
def topology_show(app_spec: AppSpec, namespace: Namespace = None) -> None:
    """Print each workflow's route: its stages in order and the key of each, then where its
    starts land on the starts topic and which hops remain, and why."""
    from sluicegate.declare import load_app
    from sluicegate.topology.landing import Landings, explain
    from sluicegate.topology.route import routes

    settings = options.settings(None, namespace, offline=True)
    app = load_app(app_spec, settings)
    landings = Landings(app, settings.deployment_cap)
    for route in routes(app, settings.deployment_cap):
        typer.echo(route.describe())
        landing = landings.get(route.workflow)
        for line in explain(landing) if landing is not None else ():
            typer.echo(f"  {line}")


@app.command("worker")
def worker(
    app_spec: AppSpec,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
    state_dir: Annotated[Path | None, typer.Option(help="This worker's state directory.")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics on this port (/metrics).")] = None,
    metrics_host: Annotated[str, typer.Option(
        help="The address the metrics listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    leave_on_stop: Annotated[bool, typer.Option(
        help="This worker is not coming back once stopped (a scale-down): leave the group "
             "when it stops, so its partitions move at once instead of after the session "
             "timeout.")] = False,
) -> None:
    """Run every stage for the declarations in MODULE until SIGTERM/SIGINT."""
    from sluicegate.ops.worker import run_worker

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A SIGTERM or SIGINT from the process's first moment stops it gracefully: one sent
    # while it started was kept (`signals.main`) and `run_worker` sees it. Called
    # in-process instead, a worker has a stop of its own.
    stop = signals.STOP if signals.holding() else threading.Event()
    # What no retry fixes (a refused login, missing topics, a state directory in use) is
    # one line and exit code 2 (`_one_line`). A broker that is not there is waited for,
    # at start as later, with one line saying so (a supervisor may start the worker
    # before the broker: docs/decisions/cli-errors.md).
    from sluicegate.kafkautil import KafkaUnreachable, require_broker

    settings = options.settings(bootstrap, namespace, state_dir=state_dir)
    # A refused login is said here, once, before the worker's clients would each report
    # it; a broker that does not answer, the worker says it waits for, and waits.
    with contextlib.suppress(KafkaUnreachable):
        require_broker(settings, 1.5)
    run_worker(app_spec, settings, stop=stop, metrics_port=metrics_port,
               metrics_host=metrics_host, leave_on_stop=leave_on_stop)


@app.command("demo")
def demo(
    port: Annotated[int, typer.Option(help="The local broker's port.")] = 9092,
    app_module: Annotated[str, typer.Option("--app", help="Demo module (app, FUNCTIONS, "
                                            "traffic).")] = "examples.demo",
    rate: Annotated[float, typer.Option(help="Demo starts per second.")] = 3.0,
) -> None:
    """Run the whole loop locally: broker, topics, worker, engine, traffic, decisions."""
    from sluicegate.ops.cli.demo import run_demo

    run_demo(port, app_module, rate)


def _one_line(exc: BaseException) -> tuple[str, int] | None:
    """What an error the operator can act on says, and the exit code: 2 for what the
    command or its settings must change, 1 for what the world must (a broker that is
    not there). None: not such an error, a bug, shown with its traceback."""
    from confluent_kafka import KafkaException

    from sluicegate.config import SettingsError
    from sluicegate.declare import DeclarationError
    from sluicegate.engine.runtime import WorkerError
    from sluicegate.kafkautil import BootstrapError, KafkaAuthError, KafkaUnreachable
    from sluicegate.ops.services.ledger import LedgerSqlError
    from sluicegate.ops.services.names import UnknownName
    from sluicegate.schemas.registry import RegistryError
    from sluicegate.topology.admin import TopologyError

    if isinstance(exc, UnknownName | BootstrapError | KafkaAuthError | TopologyError
                  | WorkerError | RegistryError | SettingsError):
        return str(exc), 2
    if isinstance(exc, DeclarationError):
        if len(exc.problems) == 1:
            return exc.problems[0], 2
        return "\n  ".join([f"{len(exc.problems)} problems in the declarations:",
                            *exc.problems]), 2
    if isinstance(exc, KafkaUnreachable):
        return str(exc), 1
    if isinstance(exc, LedgerSqlError):  # the ledger copy, read to check a name
        return str(exc), 1
    if isinstance(exc, KafkaException) and exc.args:
        error = exc.args[0]
        return f"Kafka: {error.str() if hasattr(error, 'str') else error}", 1
    if isinstance(exc, TimeoutError):
        return f"timed out: {exc}", 1
    return None


def main() -> None:
    # Declarations are named by module (`--app examples.demo`), found from where the
    # command runs, as uvicorn and celery do.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app()
