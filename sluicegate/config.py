"""Process-wide settings: where the broker is, what the topics are called, how the runtime
commits, and the Kafka client settings every client sluicegate makes shares.

Each setting can be given in code, or through an environment variable `SLUICEGATE_<NAME>`;
Kafka client settings (TLS, SASL, ...) pass through `kafka` unchanged to every client.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _env(name: str, default: str) -> str:
    return os.environ.get(f"SLUICEGATE_{name}", default)


def _kafka_from_env() -> dict[str, str]:
    """`SLUICEGATE_KAFKA_SASL_MECHANISM=PLAIN` becomes `sasl.mechanism=PLAIN`."""
    prefix = "SLUICEGATE_KAFKA_"
    return {
        key[len(prefix):].lower().replace("_", "."): value
        for key, value in os.environ.items()
        if key.startswith(prefix)
    }


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str = field(default_factory=lambda: _env("BOOTSTRAP", DEFAULT_BOOTSTRAP))
    namespace: str = field(default_factory=lambda: _env("NAMESPACE", "sg."))
    # Every stage topic, and sg.starts, has this many partitions: co-partitioning is what
    # lets one task own a key's state in every topic that carries that key.
    partitions: int = field(default_factory=lambda: int(_env("PARTITIONS", "6")))
    replication: int = field(default_factory=lambda: int(_env("REPLICATION", "1")))
    state_dir: Path = field(
        default_factory=lambda: Path(_env("STATE_DIR", str(Path.cwd() / ".sluicegate" / "state")))
    )
    # Exactly-once batching: a transaction commits after this many records or this long.
    commit_interval_ms: int = field(
        default_factory=lambda: int(_env("COMMIT_INTERVAL_MS", "100"))
    )
    commit_max_records: int = field(
        default_factory=lambda: int(_env("COMMIT_MAX_RECORDS", "2000"))
    )
    # A deployment-wide cap on runs in flight across every workflow; 0 means none.
    deployment_cap: int = field(default_factory=lambda: int(_env("DEPLOYMENT_CAP", "0")))
    # Comma-separated `id:base64key` pairs, newest first; empty means none configured.
    encryption_keys: str = field(default_factory=lambda: _env("ENCRYPTION_KEYS", ""))
    kafka: dict[str, str] = field(default_factory=_kafka_from_env)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The configuration for one confluent-kafka client: bootstrap, security, overrides."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        config.update(self.kafka)
        config.update(overrides)
        return config

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
