"""`sluicegate kafka up|down|status`: thin wrappers over broker.py that print and set exit codes."""

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
