"""Kafka security on a real broker: SASL/PLAIN and TLS listeners, configured for every
sluicegate client through one `Settings.kafka`, and a clear error for a refused login.

One extra JVM for the whole module: a broker with both listeners, on free ports.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sluicegate.admission.worker import Worker
from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.declare import App, load_app
from sluicegate.kafkautil import KafkaAuthError
from sluicegate.ops.cli.localkafka import app as kafka_cli
from sluicegate.ops.localkafka.broker import (
    LocalBroker,
    SaslPlain,
    Tls,
    ensure_broker,
    stop_broker,
    tls_files,
)
from sluicegate.ops.localkafka.processes import free_ports
from sluicegate.schemas.records import LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.cli import sluicegate
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

USER, PASSWORD = "sluice", "gate-pw"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    if shutil.which("java") is None or shutil.which("openssl") is None:
        pytest.skip("the secured broker needs java and openssl on PATH")
    port, controller_port, sasl_port, tls_port = free_ports(4)
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    broker = ensure_broker(port=port, controller_port=controller_port, data_dir=data_dir,
                           sasl=SaslPlain(USER, PASSWORD, sasl_port), tls=Tls(tls_port))
    try:
        yield broker
    finally:
        stop_broker(port, data_dir)


@pytest.fixture(scope="module")
def app() -> App:
    return load_app("tests.apps.identity")


def _sasl(password: str = PASSWORD) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": USER, "sasl.password": password}


def _settings(bootstrap: str | None, tmp_path: Path, kafka: dict[str, str]) -> Settings:
    assert bootstrap is not None
    return Settings(bootstrap=bootstrap, namespace=f"t{uuid.uuid4().hex[:8]}.",
                    state_dir=tmp_path / "state", kafka=kafka)


def _one_start_end_to_end(settings: Settings, app: App) -> None:
    """A start goes Client -> worker -> engine, every client on the secured listener."""
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    with WorkerThread(app, settings), Client(app=app, settings=settings) as client, \
            Engine(group=f"{settings.namespace}engine", settings=settings) as engine:
        handle = client.start("note", {"text": "over a secured listener"},
                              wait_decision=True, timeout=30)
        deadline = time.monotonic() + 30
        delivery = None
        while delivery is None or delivery.admitted is None:
            assert time.monotonic() < deadline, "the engine never got the admitted start"
            delivery = engine.poll(0.5)
        engine.started(delivery)
        engine.flush()
        rows = ledger.until(lambda rs: any(r.request_id == handle.request_id for r in rs),
                            timeout=30, what="the start's ledger row")
    ledger.close()
    assert handle.status == "admitted"
    assert delivery.admitted.execution_id == handle.execution_id
    assert [r.outcome for r in rows if r.request_id == handle.request_id] == [Outcome.admitted]


def test_a_start_runs_end_to_end_over_sasl_plain_configured_in_settings(
        secure_broker: LocalBroker, app: App, tmp_path: Path) -> None:
    _one_start_end_to_end(_settings(secure_broker.sasl_bootstrap, tmp_path, _sasl()), app)


def test_a_start_runs_end_to_end_over_sasl_plain_configured_in_the_environment(
        secure_broker: LocalBroker, app: App, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert secure_broker.sasl_bootstrap is not None
    monkeypatch.setenv("SLUICEGATE_BOOTSTRAP", secure_broker.sasl_bootstrap)
    monkeypatch.setenv("SLUICEGATE_NAMESPACE", f"t{uuid.uuid4().hex[:8]}.")
    monkeypatch.setenv("SLUICEGATE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLUICEGATE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("SLUICEGATE_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("SLUICEGATE_KAFKA_SASL_USERNAME", USER)
    monkeypatch.setenv("SLUICEGATE_KAFKA_SASL_PASSWORD", PASSWORD)
    settings = Settings()
    assert settings.kafka == _sasl()
    _one_start_end_to_end(settings, app)


def test_a_wrong_sasl_password_is_refused_at_once_naming_user_mechanism_and_broker(
        secure_broker: LocalBroker, app: App, tmp_path: Path) -> None:
    good = _settings(secure_broker.sasl_bootstrap, tmp_path, _sasl())
    create_topics(good)
    bad = good.with_(kafka=_sasl("not-the-password"), state_dir=tmp_path / "bad-state")
    expected = (f"Kafka authentication failed for user '{USER}' with SASL PLAIN at broker "
                f"{secure_broker.sasl_bootstrap}")
    started = time.monotonic()
    with pytest.raises(KafkaAuthError, match=expected) as refused:
        Client(app=app, settings=bad)
    assert time.monotonic() - started < 5
    assert "Check sasl.username and sasl.password" in str(refused.value)
    assert "not-the-password" not in str(refused.value)

    started = time.monotonic()
    worker = Worker.for_app(app, bad)
    try:
        with pytest.raises(KafkaAuthError, match=expected):
            worker.start()
    finally:
        worker.close()
    with pytest.raises(KafkaAuthError, match=expected):
        Engine(group=f"{bad.namespace}engine", settings=bad)
    with pytest.raises(KafkaAuthError, match=expected):
        create_topics(bad)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("command", [("workflows", "flow"), ("topics", "create"),
                                     ("worker", "--app", "tests.apps.identity")])
def test_a_refused_login_is_one_line_on_the_command_line(
        secure_broker: LocalBroker, command: tuple[str, ...], tmp_path: Path) -> None:
    assert secure_broker.sasl_bootstrap is not None
    env = {f"SLUICEGATE_KAFKA_{k.upper().replace('.', '_')}": v
           for k, v in _sasl("not-the-password").items()}
    ran = sluicegate(*command, bootstrap=secure_broker.sasl_bootstrap,
                     state_dir=tmp_path / "state", env=env, timeout=30)
    assert ran.code == 2
    # The worker logs its start (INFO) before it reaches the broker; the refusal is one
    # line, and nothing else is said.
    said = [line for line in ran.error_lines if " INFO " not in line]
    assert len(said) == 1, ran.stderr
    (line,) = said
    assert line.startswith(f"error: Kafka authentication failed for user '{USER}' with SASL "
                           f"PLAIN at broker {secure_broker.sasl_bootstrap}")
    assert len(ran.error_lines) <= (2 if command[0] == "worker" else 1), ran.stderr
    assert ran.seconds < 5


def test_a_start_runs_end_to_end_over_tls_with_the_generated_ca(
        secure_broker: LocalBroker, app: App, tmp_path: Path) -> None:
    assert secure_broker.ca_path is not None and secure_broker.ca_path.exists()
    settings = _settings(secure_broker.tls_bootstrap, tmp_path,
                         {"security.protocol": "SSL",
                          "ssl.ca.location": str(secure_broker.ca_path)})
    _one_start_end_to_end(settings, app)


def test_tls_without_the_ca_is_refused_naming_the_broker_and_ssl_ca_location(
        secure_broker: LocalBroker, app: App, tmp_path: Path) -> None:
    # No ssl.ca.location: the system trust store does not know the data dir's own CA.
    settings = _settings(secure_broker.tls_bootstrap, tmp_path, {"security.protocol": "SSL"})
    started = time.monotonic()
    with pytest.raises(KafkaAuthError,
                       match=f"TLS handshake with Kafka broker {secure_broker.tls_bootstrap} "
                             "failed") as refused:
        Client(app=app, settings=settings)
    assert time.monotonic() - started < 5
    assert "ssl.ca.location" in str(refused.value)


def test_kafka_up_prints_the_listeners_and_the_ca_file_and_keeps_the_certificates(
        secure_broker: LocalBroker) -> None:
    files = tls_files(secure_broker.data_dir)
    ca_before = files.ca.read_bytes()
    assert secure_broker.sasl_port is not None and secure_broker.tls_port is not None
    result = CliRunner().invoke(kafka_cli, [
        "up", "--port", str(secure_broker.port),
        "--controller-port", str(secure_broker.controller_port),
        "--data-dir", str(secure_broker.data_dir),
        "--sasl-plain", f"{USER}:{PASSWORD}", "--sasl-port", str(secure_broker.sasl_port),
        "--tls", "--tls-port", str(secure_broker.tls_port),
    ])
    assert result.exit_code == 0, result.output
    assert "already running" in result.output
    assert f"SASL_PLAINTEXT (PLAIN) on {secure_broker.sasl_bootstrap}" in result.output
    assert (f"SSL on {secure_broker.tls_bootstrap}; clients set "
            f"ssl.ca.location={files.ca}") in result.output
    # A second start reuses the data dir's CA and keystore: clients that trust it keep working.
    assert tls_files(secure_broker.data_dir) == files
    assert files.ca.read_bytes() == ca_before
