"""sluicegate: a Kafka-native admission controller for workflow runs."""

__version__ = "0.1.0"
