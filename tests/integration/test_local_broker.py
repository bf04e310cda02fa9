"""`sluicegate kafka up|down|status` and the Python API behind it, against real JVMs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from typer.testing import CliRunner

from sluicegate.ops.cli.localkafka import app
from sluicegate.ops.localkafka.broker import (
    BrokerError,
    LocalBroker,
    SaslPlain,
    broker_answers,
    broker_status,
    ensure_broker,
    stop_broker,
)
from sluicegate.ops.localkafka.processes import free_ports

pytestmark = pytest.mark.broker
runner = CliRunner()


def _dir_args(broker: LocalBroker) -> list[str]:
    return ["--port", str(broker.port), "--data-dir", str(broker.data_dir)]


def test_up_again_is_a_no_op(local_broker: LocalBroker) -> None:
    again = ensure_broker(
        port=local_broker.port,
        controller_port=local_broker.controller_port,
        data_dir=local_broker.data_dir,
    )
    assert again.already_running
    assert again.pid == local_broker.pid

    controller = ["--controller-port", str(local_broker.controller_port)]
    result = runner.invoke(app, ["up", *_dir_args(local_broker), *controller])
    assert result.exit_code == 0, result.output
    assert f"already running: Kafka on {local_broker.bootstrap} (pid {local_broker.pid})" in (
        result.output
    )
    assert broker_status(local_broker.port, local_broker.data_dir).pid == local_broker.pid


def test_status_reports_our_broker(local_broker: LocalBroker) -> None:
    result = runner.invoke(app, ["status", *_dir_args(local_broker)])
    assert result.exit_code == 0, result.output
    assert f"ours, pid {local_broker.pid}" in result.output


def test_status_of_an_empty_port_exits_1(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    result = runner.invoke(app, ["status", "--port", str(port), "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no broker answers" in result.output
    assert not broker_answers(f"127.0.0.1:{port}", timeout=0.5)


def test_up_on_a_taken_port_names_the_port(tmp_path: Path) -> None:
    port, controller_port = free_ports(2)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        # The port check comes before Java and Maven, so no JVM starts here.
        with pytest.raises(BrokerError, match=f"port {port} "):
            ensure_broker(port=port, controller_port=controller_port, data_dir=tmp_path)
        result = runner.invoke(
            app,
            ["up", "--port", str(port), "--controller-port", str(controller_port),
             "--data-dir", str(tmp_path)],
        )  # fmt: skip
        assert result.exit_code == 1
        assert f"port {port} " in result.output
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", controller_port))
        squatter.listen()
        with pytest.raises(BrokerError, match=f"port {controller_port} "):
            ensure_broker(port=port, controller_port=controller_port, data_dir=tmp_path)


def test_down_stops_a_second_broker_with_sasl(tmp_path: Path, local_broker: LocalBroker) -> None:
    # The one test that starts a second JVM; it also covers the optional SASL/PLAIN listener.
    port, controller_port, sasl_port = free_ports(3)
    data_dir = tmp_path / "kafka"
    broker = ensure_broker(
        port=port,
        controller_port=controller_port,
        data_dir=data_dir,
        sasl=SaslPlain("alice", "s3cret", sasl_port),
    )
    try:
        assert not broker.already_running
        assert broker.pid != local_broker.pid
        assert broker_answers(broker.bootstrap)
        sasl_bootstrap = broker.sasl_bootstrap
        assert sasl_bootstrap is not None

        def sasl_admin(password: str) -> AdminClient:
            return AdminClient(
                {
                    "bootstrap.servers": sasl_bootstrap,
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "alice",
                    "sasl.password": password,
                }
            )

        assert sasl_admin("s3cret").list_topics(timeout=10).brokers
        with pytest.raises(KafkaException):
            sasl_admin("wrong").list_topics(timeout=3)
    finally:
        stopped = stop_broker(port, data_dir)
    assert stopped
    assert not broker_answers(broker.bootstrap, timeout=0.5)
    result = runner.invoke(app, ["status", "--port", str(port), "--data-dir", str(data_dir)])
    assert result.exit_code == 1, result.output
    # Idempotent: a second down finds nothing and says so.
    assert not stop_broker(port, data_dir)
    result = runner.invoke(app, ["down", "--port", str(port), "--data-dir", str(data_dir)])
    assert result.exit_code == 0
    assert "no broker of ours" in result.output
    # The session broker is untouched.
    assert broker_answers(local_broker.bootstrap)
