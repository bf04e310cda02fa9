"""Reading a group's committed offsets when the consumer times out (engine.recovery's
`committed_offsets`): the admin client asks the group's coordinator only once a broker has
just answered it, never into an outage (a request of its to a coordinator aborts the
process when the connection drops under it: confluentinc/librdkafka#4605). The reads that
reach a broker are tested on one in tests/integration/test_recovery.py."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sluicegate.engine.recovery import committed_offsets

TPS = [TopicPartition("sg.starts", 0), TopicPartition("sg.starts", 1)]


class _TimesOut:
    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))


class _Admin:
    """An admin client whose brokers answer (`up`) or not, and which counts the requests
    to the group's coordinator it is given."""

    def __init__(self, up: bool) -> None:
        self.up = up
        self.asked: list[Any] = []

    def list_topics(self, timeout: float) -> object:
        if not self.up:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Connection refused"))
        return object()

    def list_consumer_group_offsets(self, requests: list[Any], **kwargs: Any) -> Any:
        self.asked.append(requests)
        raise AssertionError("not reached in these tests")


def test_no_broker_answering_means_the_coordinator_is_not_asked() -> None:
    admin = _Admin(up=False)
    with pytest.raises(KafkaException, match=r"the consumer timed out, and no broker "
                                             r"answered .*Connection refused"):
        committed_offsets(_TimesOut(), admin, "g", TPS, timeout_s=1.0)  # type: ignore[arg-type]
    assert admin.asked == []


def test_a_broker_answering_lets_the_admin_client_ask_the_coordinator() -> None:
    admin = _Admin(up=True)
    with pytest.raises(AssertionError, match="not reached"):
        committed_offsets(_TimesOut(), admin, "g", TPS, timeout_s=1.0)  # type: ignore[arg-type]
    assert len(admin.asked) == 1


def test_the_metrics_lag_read_asks_no_coordinator_when_no_broker_answers() -> None:
    """The metrics server's and `status`'s read of the workers' lag (ops.services.metrics'
    `input_offsets`) asks the topics' metadata first, and stops there in an outage."""
    from sluicegate.config import Settings
    from sluicegate.ops.services.metrics import input_offsets

    admin = _Admin(up=False)
    with pytest.raises(KafkaException, match="Connection refused"):
        input_offsets(admin, Settings(), timeout_s=1.0)  # type: ignore[arg-type]
    assert admin.asked == []
