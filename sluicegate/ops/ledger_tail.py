"""`sluicegate ledger tail [--workflow W]`: each decision as it is written to the ledger,
one line each, as `sluicegate demo` prints them (its `_print`)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sluicegate.config import Settings


def follow(settings: Settings, workflow: str | None, *, timeout_s: float = 3.0) -> None:
    """Print decisions from now on until Ctrl-C; the first line (on stderr) says the
    tail has begun, so nothing written after it is missed."""
    from confluent_kafka import Consumer, TopicPartition
    from rich.console import Console

    from sluicegate.kafkautil import watermarks
    from sluicegate.ops.demo import _print, ctrl_c_stops
    from sluicegate.schemas import codec
    from sluicegate.schemas.records import LedgerRecord
    from sluicegate.topology.admin import TopologyError
    from sluicegate.topology.topics import Topics

    ctrl_c_stops()
    topic = Topics(settings).ledger
    consumer = Consumer(settings.client_config(**{
        # assign() only, never a commit: the group id is a formality of the client.
        "group.id": f"{settings.namespace}ledger-tail", "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TopologyError(f"Kafka at {settings.bootstrap} has no topic {topic}: run "
                                "`sluicegate topics create` (or check --namespace)")
        # From the end each partition has now: what is decided from here on.
        consumer.assign([TopicPartition(topic, p, max(0, watermarks(
            consumer, TopicPartition(topic, p), timeout_s)[1])) for p in meta.partitions])
        which = f" of {workflow}" if workflow else ""
        typer.echo(f"following the decisions{which} on {topic} from now (Ctrl-C stops)",
                   err=True)
        console = Console(soft_wrap=True)
        while True:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is not None or msg.value() is None:
                    continue
                try:
                    record = codec.decode(LedgerRecord, msg.value())
                except codec.DecodeError:
                    continue
                if workflow is None or record.workflow == workflow:
                    _print(console, record)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()


def tail(
    workflow: Annotated[str | None, typer.Option(help="Only this workflow's decisions.")] = None,
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Module with the declarations; --workflow must be declared there "
                      "(without it, one the cluster has seen).")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="Kafka bootstrap servers.", envvar="SLUICEGATE_BOOTSTRAP")] = None,
    namespace: Annotated[str | None, typer.Option(
        help="Topic name prefix (default sg.).", envvar="SLUICEGATE_NAMESPACE")] = None,
) -> None:
    """Print each decision as it is written to the ledger, until Ctrl-C."""
    from sluicegate.ops.cli import _settings

    # No broker, an unknown workflow: one line from the CLI's error handling.
    settings = _settings(bootstrap, namespace, reach=True)
    if workflow is not None:
        from sluicegate.declare import load_app
        from sluicegate.ops.names import check_workflow, known_workflows, where_known

        declared = load_app(app_spec, settings) if app_spec else None
        check_workflow(workflow, known_workflows(settings, declared),
                       where=where_known(app_spec))
    follow(settings, workflow)
