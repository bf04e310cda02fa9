"""`sluicegate kafka up|down|status` and `sluicegate registry up|down|status`: thin wrappers
over `sluicegate.ops.localkafka` (broker.py, registry.py) that print and set exit codes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from sluicegate.ops.localkafka.broker import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_KAFKA_VERSION,
    DEFAULT_PORT,
    BrokerError,
    SaslPlain,
    Tls,
    broker_status,
    ensure_broker,
    stop_broker,
)
from sluicegate.ops.localkafka.registry import (
    DEFAULT_REGISTRY_PORT,
    ensure_registry,
    registry_status,
    registry_url,
    stop_registry,
)

app = typer.Typer(no_args_is_help=True, add_completion=False)

Port = Annotated[int, typer.Option("--port", help="The PLAINTEXT listener on 127.0.0.1.")]
DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Broker state; default <user data dir>/kafka-<port>."),
]


def _fail(err: BrokerError) -> typer.Exit:
    typer.echo(f"error: {err}", err=True)
    return typer.Exit(1)


@app.command()
def up(
    port: Port = DEFAULT_PORT,
    controller_port: Annotated[
        int, typer.Option("--controller-port", help="The KRaft controller listener.")
    ] = DEFAULT_CONTROLLER_PORT,
    data_dir: DataDir = None,
    kafka_version: Annotated[
        str, typer.Option("--kafka-version", help="Apache Kafka 4.x version from Maven Central.")
    ] = DEFAULT_KAFKA_VERSION,
    sasl_plain: Annotated[
        str | None,
        typer.Option("--sasl-plain", help="USER:PASS: add a SASL_PLAINTEXT listener (PLAIN)."),
    ] = None,
    sasl_port: Annotated[
        int | None, typer.Option("--sasl-port", help="Port of that listener; default port+2.")
    ] = None,
    tls: Annotated[
        bool, typer.Option("--tls", help="Add an SSL listener; its CA is made for the data dir.")
    ] = False,
    tls_port: Annotated[
        int | None, typer.Option("--tls-port", help="Port of that listener; default port+3.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker.")] = 90.0,
) -> None:
    """Start a single-node KRaft broker (no-op if ours already runs on that port)."""
    started = time.monotonic()
    try:
        sasl = SaslPlain.parse(sasl_plain, sasl_port or port + 2) if sasl_plain else None
        ssl = Tls(tls_port or port + 3) if tls or tls_port else None
        broker = ensure_broker(port, controller_port, data_dir, kafka_version, timeout, sasl, ssl)
    except BrokerError as err:
        raise _fail(err) from None
    if broker.already_running:
        typer.echo(f"already running: Kafka on {broker.bootstrap} (pid {broker.pid})")
    else:
        typer.echo(
            f"started Kafka {broker.kafka_version} on {broker.bootstrap} (pid {broker.pid}) "
            f"in {time.monotonic() - started:.1f}s"
        )
    if broker.sasl_bootstrap:
        typer.echo(f"SASL_PLAINTEXT (PLAIN) on {broker.sasl_bootstrap}")
    if broker.tls_bootstrap:
        typer.echo(f"SSL on {broker.tls_bootstrap}; clients set ssl.ca.location={broker.ca_path}")
    typer.echo(f"data: {broker.data_dir}\nlog:  {broker.log_path}")


@app.command()
def down(
    port: Port = DEFAULT_PORT,
    data_dir: DataDir = None,
    timeout: Annotated[float, typer.Option(help="Seconds before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker started by `up` on that port (no-op if none)."""
    try:
        stopped = stop_broker(port, data_dir, timeout)
    except BrokerError as err:
        raise _fail(err) from None
    if stopped:
        typer.echo(f"stopped Kafka on 127.0.0.1:{port}")
    else:
        typer.echo(f"no broker of ours running on 127.0.0.1:{port}")


@app.command()
def status(port: Port = DEFAULT_PORT, data_dir: DataDir = None) -> None:
    """Whether a broker answers on that port (exit 0) or not (exit 1), and whether it is ours."""
    st = broker_status(port, data_dir)
    owner = f"ours, pid {st.pid}" if st.pid is not None else "not started by sluicegate"
    if st.answers:
        typer.echo(f"Kafka answers on {st.bootstrap} ({owner})")
        return
    if st.pid is not None:
        typer.echo(f"no answer on {st.bootstrap}, but our broker process (pid {st.pid}) is alive")
    else:
        typer.echo(f"no broker answers on {st.bootstrap}")
    raise typer.Exit(1)


# -- `sluicegate registry up|down|status`: the local schema registry ----------------------

registry_app = typer.Typer(no_args_is_help=True, add_completion=False)

RegistryPort = Annotated[int, typer.Option("--port", help="The registry's port on 127.0.0.1.")]
RegistryDir = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Pid file and log; default <user data dir>/registry-<port>."),
]


@registry_app.command("up")
def registry_up(
    port: RegistryPort = DEFAULT_REGISTRY_PORT,
    data_dir: RegistryDir = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for it.")] = 120.0,
) -> None:
    """Start a Confluent-compatible schema registry (Apicurio, schemas kept in memory)."""
    started = time.monotonic()
    try:
        registry = ensure_registry(port, data_dir, timeout=timeout)
    except BrokerError as err:
        raise _fail(err) from None
    if registry.already_running:
        typer.echo(f"already running: schema registry at {registry.url} (pid {registry.pid})")
    else:
        typer.echo(f"started a schema registry at {registry.url} (pid {registry.pid}) in "
                   f"{time.monotonic() - started:.1f}s")
    typer.echo(f"use it: SLUICEGATE_SCHEMA_REGISTRY_URL={registry.url}\nlog: {registry.log_path}")


@registry_app.command("down")
def registry_down(port: RegistryPort = DEFAULT_REGISTRY_PORT, data_dir: RegistryDir = None) -> None:
    """Stop the registry started by `up` on that port (no-op if none); its schemas go with it."""
    try:
        stopped = stop_registry(port, data_dir)
    except BrokerError as err:
        raise _fail(err) from None
    typer.echo(f"stopped the schema registry on 127.0.0.1:{port}" if stopped
               else f"no schema registry of ours running on 127.0.0.1:{port}")


@registry_app.command("status")
def registry_status_cmd(port: RegistryPort = DEFAULT_REGISTRY_PORT,
                        data_dir: RegistryDir = None) -> None:
    """Whether a registry answers on that port (exit 0) or not (exit 1)."""
    answers, pid = registry_status(port, data_dir)
    owner = f"ours, pid {pid}" if pid is not None else "not started by sluicegate"
    if answers:
        typer.echo(f"a schema registry answers at {registry_url(port)} ({owner})")
        return
    typer.echo(f"no schema registry answers at {registry_url(port)}"
               + (f", but ours (pid {pid}) is alive" if pid is not None else ""))
    raise typer.Exit(1)
