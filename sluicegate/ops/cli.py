"""The one command-line entry point: `sluicegate <group> <verb>`."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from sluicegate.config import Settings
from sluicegate.ops.inspect import app as inspect_app
from sluicegate.ops.ledger_cli import app as ledger_app
from sluicegate.ops.localkafka.cli import app as kafka_app
from sluicegate.ops.localkafka.cli import registry_app
from sluicegate.ops.workflows import app as workflows_app

app = typer.Typer(
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
app.add_typer(ledger_app, name="ledger")
app.add_typer(inspect_app, name="inspect")

Bootstrap = Annotated[str | None, typer.Option(help="Kafka bootstrap servers.",
                                               envvar="SLUICEGATE_BOOTSTRAP")]
Namespace = Annotated[str | None, typer.Option(help="Topic name prefix (default sg.).",
                                               envvar="SLUICEGATE_NAMESPACE")]
AppSpec = Annotated[str, typer.Option("--app", help="Module with the declarations (`module` "
                                      "or `module:attr`).")]


def _settings(bootstrap: str | None, namespace: str | None, *, offline: bool = False,
              **more: object) -> Settings:
    """The command's settings; unless `offline`, the process's codec is configured from
    them (with a schema registry: its framing, every schema registered), so every command
    reads and writes records as the workers do."""
    changes: dict[str, object] = {k: v for k, v in more.items() if v is not None}
    if bootstrap:
        changes["bootstrap"] = bootstrap
    if namespace:
        changes["namespace"] = namespace
    settings = Settings().with_(**changes)
    if not offline:
        from sluicegate.topology.framing import configure_codec

        configure_codec(settings)
    return settings


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

    settings = _settings(bootstrap, namespace)
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
    """Print each workflow's route: its stages in order and the key of each."""
    from sluicegate.declare import load_app
    from sluicegate.topology.route import routes

    settings = _settings(None, namespace, offline=True)
    for route in routes(load_app(app_spec, settings), settings.deployment_cap):
        typer.echo(route.describe())


@app.command("worker")
def worker(
    app_spec: AppSpec,
    bootstrap: Bootstrap = None,
    namespace: Namespace = None,
    state_dir: Annotated[Path | None, typer.Option(help="This worker's state directory.")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve Prometheus metrics on this port (/metrics).")] = None,
) -> None:
    """Run every stage for the declarations in MODULE until SIGTERM/SIGINT."""
    from sluicegate.kafkautil import KafkaAuthError
    from sluicegate.ops.worker import run_worker
    from sluicegate.schemas.registry import RegistryError
    from sluicegate.streams.runtime import WorkerError
    from sluicegate.topology.admin import TopologyError

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run_worker(app_spec, _settings(bootstrap, namespace, state_dir=state_dir),
                   metrics_port=metrics_port)
    except (TopologyError, WorkerError, KafkaAuthError, RegistryError) as exc:
        # A configuration or authorisation problem: no retry fixes it, one line says it.
        typer.echo(f"sluicegate worker: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("demo")
def demo(
    port: Annotated[int, typer.Option(help="The local broker's port.")] = 9092,
    app_module: Annotated[str, typer.Option("--app", help="Demo module (app, FUNCTIONS, "
                                            "traffic).")] = "examples.demo",
    rate: Annotated[float, typer.Option(help="Demo starts per second.")] = 3.0,
) -> None:
    """Run the whole loop locally: broker, topics, worker, engine, traffic, decisions."""
    from sluicegate.ops.demo import run_demo

    run_demo(port, app_module, rate)


def main() -> None:
    # Declarations are named by module (`--app examples.demo`), found from where the
    # command runs, as uvicorn and celery do.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    app()
