"""Shared fixtures. The Kafka broker starts lazily, once per session, only for tests that ask
for `bootstrap` (or `settings`); tests/unit never touch it.

Where the broker comes from, in order:
1. `SLUICEGATE_BOOTSTRAP` if set (an existing broker; nothing is started or stopped);
2. testcontainers with apache/kafka, if it is installed and a Docker engine answers;
3. the local Maven-jar broker (`sluicegate kafka up`) on its own port and temporary data dir,
   so it never meets a developer's broker on 9092.

The schema registry starts the same way, only for tests that ask for `schema_registry_url`:
`SLUICEGATE_TEST_SCHEMA_REGISTRY_URL` if set, else the local Apicurio registry (`sluicegate
registry up`) on a free port. (Not SLUICEGATE_SCHEMA_REGISTRY_URL: that would put every
test's processes on registry framing.)
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from sluicegate import tracing
from sluicegate.config import Settings
from sluicegate.ops.localkafka.broker import (
    LocalBroker,
    ensure_broker,
    stop_broker,
)
from sluicegate.ops.localkafka.processes import free_ports, port_in_use
from sluicegate.ops.localkafka.registry import ensure_registry, stop_registry
from sluicegate.schemas import codec

# The suite shares two cores with a broker and workers: a per-example deadline would fail
# on the machine's load, not on the code.
hypothesis_settings.register_profile("sluicegate", deadline=None)
hypothesis_settings.load_profile("sluicegate")

KAFKA_IMAGE = "apache/kafka:4.4.0"
# Fixed ports make a leftover test broker easy to find; another run already holding them
# (a second engineer's pytest on the same box) makes us fall back to free ports.
TEST_PORT, TEST_CONTROLLER_PORT = 19092, 19093


@dataclass(frozen=True)
class SessionKafka:
    bootstrap: str
    local: LocalBroker | None  # set when this session started the local broker itself


def _docker_kafka(stack: contextlib.ExitStack) -> str | None:
    """A broker in a container, or None when testcontainers or a Docker engine is missing."""
    try:
        import docker
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs
    except ImportError:
        return None
    try:
        docker.from_env().ping()
    except Exception:
        return None
    (port,) = free_ports(1)
    # Setting any KAFKA_* variable drops the image's default server.properties, so all of it
    # is given. Same port inside and out, so the advertised address works from the host.
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(port, port)
    for key, value in env.items():
        container = container.with_env(key, value)
    stack.enter_context(container)
    wait_for_logs(container, "Kafka Server started", timeout=90)
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def session_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionKafka]:
    env = os.environ.get("SLUICEGATE_BOOTSTRAP")
    if env:
        yield SessionKafka(env, None)
        return
    with contextlib.ExitStack() as stack:
        docker_bootstrap = _docker_kafka(stack)
        if docker_bootstrap is not None:
            yield SessionKafka(docker_bootstrap, None)
            return
        port, controller_port = TEST_PORT, TEST_CONTROLLER_PORT
        if port_in_use(port) or port_in_use(controller_port):
            port, controller_port = free_ports(2)
        data_dir = tmp_path_factory.mktemp("kafka")
        broker = ensure_broker(port=port, controller_port=controller_port, data_dir=data_dir)
        stack.callback(stop_broker, port, data_dir)
        yield SessionKafka(broker.bootstrap, broker)


@pytest.fixture(scope="session")
def bootstrap(session_kafka: SessionKafka) -> str:
    """`host:port` of the session's Kafka broker."""
    return session_kafka.bootstrap


@pytest.fixture(scope="session")
def local_broker(session_kafka: SessionKafka) -> LocalBroker:
    """The session's broker when this session started it with the local-broker code."""
    if session_kafka.local is None:
        pytest.skip("the session broker was not started by sluicegate.ops.localkafka")
    return session_kafka.local


@pytest.fixture
def settings(bootstrap: str, tmp_path: Path) -> Iterator[Settings]:
    """Settings on the session broker, with a namespace and state dir of this test's own.
    The namespace's topics are deleted after the test: the broker keeps a file open per
    partition, and a session of a few hundred namespaces would otherwise run it out of
    file descriptors."""
    settings = Settings(
        bootstrap=bootstrap,
        namespace=f"t{uuid.uuid4().hex[:8]}.",
        state_dir=tmp_path / "state",
    )
    yield settings
    _delete_topics(settings)


def _delete_topics(settings: Settings) -> None:
    """Delete the namespace's topics, best effort: a test that stopped the broker, or
    changed its security, leaves them."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.client_config())
    try:
        names = [name for name in admin.list_topics(timeout=5).topics
                 if name.startswith(settings.namespace)]
        if names:
            for future in admin.delete_topics(names, operation_timeout=10).values():
                future.result(timeout=15)
    except Exception:  # the broker's state is not what this test checks
        pass


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible REST root of the session's schema registry."""
    env = os.environ.get("SLUICEGATE_TEST_SCHEMA_REGISTRY_URL")
    if env:
        yield env
        return
    (port,) = free_ports(1)
    data_dir = tmp_path_factory.mktemp("registry")
    registry = ensure_registry(port=port, data_dir=data_dir)
    try:
        yield registry.url
    finally:
        stop_registry(port, data_dir)


@pytest.fixture
def restore_codec() -> Iterator[None]:
    """For a test that configures this process's codec: gives back the one it had."""
    previous = codec.default()
    yield
    codec.use(previous)


@pytest.fixture(scope="session")
def _tracer_provider() -> Any:
    """One OpenTelemetry SDK tracer provider for the session, this process's global one (it
    can be set only once), keeping every span it records in memory."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider, exporter


@pytest.fixture
def recorded_spans(_tracer_provider: Any) -> Iterator[Any]:
    """The spans this process records during the test, read from the SDK's in-memory
    exporter: a producer's and an engine's (through the global provider) and the worker's
    decision spans (`tracing.use`), which stop being recorded after the test."""
    provider, exporter = _tracer_provider
    exporter.clear()
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        exporter.clear()
