"""A local single-node Kafka broker for development and tests: `sluicegate kafka up|down`."""

from sluicegate.ops.localkafka.broker import (
    DEFAULT_KAFKA_VERSION,
    BrokerError,
    BrokerStatus,
    LocalBroker,
    SaslPlain,
    Tls,
    broker_answers,
    broker_status,
    default_data_dir,
    ensure_broker,
    stop_broker,
)
from sluicegate.ops.localkafka.processes import free_ports

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "BrokerError",
    "BrokerStatus",
    "LocalBroker",
    "SaslPlain",
    "Tls",
    "broker_answers",
    "broker_status",
    "default_data_dir",
    "ensure_broker",
    "free_ports",
    "stop_broker",
]
