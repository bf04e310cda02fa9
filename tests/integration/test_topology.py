"""Topics on the real broker: created once, compacted where state lives, and every record
type survives a trip through Kafka."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sluicegate.admission.worker import Worker
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.kafkautil import watermarks
from sluicegate.ops.cli.root import app as cli
from sluicegate.schemas import RECORD_TYPES, codec
from sluicegate.topology.admin import TopologyError, create_topics
from sluicegate.topology.topics import Topics
from tests.unit.test_codec import records_of

pytestmark = pytest.mark.broker

_COMPACTED = {"control", "limits", "runs"}


def test_topics_create_twice_creates_once_and_compacts_changelogs_control_and_runs(
        settings: Settings) -> None:
    first = create_topics(settings)
    second = create_topics(settings)
    specs = Topics(settings).specs()
    assert {s.name for s in first.created} == {s.name for s in specs}
    assert second.created == []
    assert {s.name for s in second.existing} == {s.name for s in specs}

    admin = AdminClient(settings.client_config())
    resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in specs]
    configs = {r.name: f.result() for r, f in admin.describe_configs(resources).items()}
    topics = Topics(settings)
    for spec in specs:
        policy = configs[spec.name]["cleanup.policy"].value
        expect_compact = spec.name.startswith(f"{settings.namespace}changelog.") or \
            spec.name in {getattr(topics, n) for n in _COMPACTED}
        assert policy == ("compact" if expect_compact else "delete"), spec.name


def test_the_topics_command_reports_what_it_created(settings: Settings) -> None:
    env = {"SLUICEGATE_BOOTSTRAP": settings.bootstrap, "SLUICEGATE_NAMESPACE": settings.namespace}
    runner = CliRunner()
    first = runner.invoke(cli, ["topics", "create"], env=env)
    again = runner.invoke(cli, ["topics", "create"], env=env)
    assert first.exit_code == 0, first.output
    assert f"created  {settings.namespace}changelog.identity" in first.output
    assert "(compacted)" in first.output
    assert again.exit_code == 0
    assert "0 created" in again.output


def test_a_worker_refuses_to_start_on_missing_topics_and_says_how_to_create_them(
        settings: Settings) -> None:
    env = {"SLUICEGATE_BOOTSTRAP": settings.bootstrap, "SLUICEGATE_NAMESPACE": settings.namespace,
           "SLUICEGATE_STATE_DIR": str(settings.state_dir)}
    result = CliRunner().invoke(cli, ["worker", "--app", "tests.apps.identity"], env=env)
    assert result.exit_code == 2, result.output
    assert f"{settings.namespace}stage.runs is missing" in result.output
    assert "sluicegate topics create" in result.output
    # One line says it, with no traceback under it.
    said = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and "Traceback" not in result.output, result.output


def test_a_worker_refuses_topics_with_another_partition_count(settings: Settings) -> None:
    create_topics(settings.with_(partitions=3))
    with pytest.raises(TopologyError) as refused:
        Worker.for_app(load_app("tests.apps.identity"), settings).start()
    assert f"{settings.namespace}starts has 3 partitions, not 6" in str(refused.value)
    assert "SLUICEGATE_PARTITIONS (6)" in str(refused.value)


_TYPES = sorted(RECORD_TYPES, key=lambda c: c.__name__)


def test_every_record_type_round_trips_through_the_broker(settings: Settings) -> None:
    topic = f"{settings.namespace}roundtrip"
    admin = AdminClient(settings.client_config())
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = Producer(settings.client_config())
    consumer = Consumer(settings.client_config(**{"group.id": "rt", "enable.auto.commit": False}))

    @hsettings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.tuples(*(records_of(cls) for cls in _TYPES)))
    def trip(records: tuple[object, ...]) -> None:
        _, start = watermarks(consumer, TopicPartition(topic, 0))
        for record in records:
            producer.produce(topic, codec.encode(record), type(record).__name__.encode(), 0)
        assert producer.flush(10) == 0
        consumer.assign([TopicPartition(topic, 0, start)])
        got: list[object] = []
        while len(got) < len(records):
            messages = consumer.consume(len(records), timeout=10)
            assert messages, "records did not come back"
            for msg in messages:
                cls = next(c for c in _TYPES if c.__name__ == msg.key().decode())
                got.append(codec.decode(cls, msg.value()))
        assert got == list(records)

    try:
        trip()
    finally:
        consumer.close()
