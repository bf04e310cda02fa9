"""Process-wide settings: where the broker is, what the topics are called, how the runtime
commits, the Kafka client settings every client sluicegate makes shares, and the schema
registry records are framed for.

Each setting can be given in code, or through an environment variable `SLUICEGATE_<NAME>`;
Kafka client settings (TLS, SASL, ...) pass through `kafka` unchanged to every client, and
schema registry client settings (basic auth, TLS) through `schema_registry`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# librdkafka's message.max.bytes default.
DEFAULT_MAX_RECORD_BYTES = 1_000_000
PAYLOAD_RESERVE_BYTES = 64 * 1024


class _ClientLog:
    """What librdkafka logs (`logger` of a client), as DEBUG lines of `sluicegate.kafka`."""

    _log = logging.getLogger("sluicegate.kafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        self._log.debug(msg, *args)


CLIENT_LOG = _ClientLog()


def _env(name: str, default: str) -> str:
    return os.environ.get(f"SLUICEGATE_{name}", default)


def _passthrough_from_env(prefix: str, *, besides: tuple[str, ...] = ()) -> dict[str, str]:
    """`SLUICEGATE_KAFKA_SASL_MECHANISM=PLAIN` becomes `sasl.mechanism=PLAIN` (prefix
    `SLUICEGATE_KAFKA_`); names in `besides` are settings of their own, not passed through."""
    return {
        key[len(prefix):].lower().replace("_", "."): value
        for key, value in os.environ.items()
        if key.startswith(prefix) and key[len(prefix):] not in besides
    }


def _kafka_from_env() -> dict[str, str]:
    return _passthrough_from_env("SLUICEGATE_KAFKA_")


def _registry_from_env() -> dict[str, str]:
    # SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:secret -> basic.auth.user.info
    return _passthrough_from_env("SLUICEGATE_SCHEMA_REGISTRY_", besides=("URL",))


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
    # The interval is what a decision waits for to become visible; the record cap only
    # bounds a transaction's size under load (a commit waits ~10-25 ms for the broker, so
    # a small cap spends more time committing than deciding: bench/NOTES.md).
    commit_interval_ms: int = field(
        default_factory=lambda: int(_env("COMMIT_INTERVAL_MS", "100"))
    )
    commit_max_records: int = field(
        default_factory=lambda: int(_env("COMMIT_MAX_RECORDS", "10000"))
    )
    # A deployment-wide cap on runs in flight across every workflow; 0 means none.
    deployment_cap: int = field(default_factory=lambda: int(_env("DEPLOYMENT_CAP", "0")))
    # Comma-separated `id:base64key` pairs, newest first; empty means none configured.
    encryption_keys: str = field(default_factory=lambda: _env("ENCRYPTION_KEYS", ""))
    kafka: dict[str, str] = field(default_factory=_kafka_from_env)
    # A Confluent-compatible Schema Registry (its REST root, e.g. http://host:8081, or
    # Apicurio's http://host:8080/apis/ccompat/v7): records are framed with its schema ids.
    # Empty: none, records carry their schema's fingerprint (docs/wire-format.md).
    schema_registry_url: str = field(default_factory=lambda: _env("SCHEMA_REGISTRY_URL", ""))
    # Registry client settings passed through unchanged (`basic.auth.user.info`,
    # `ssl.ca.location`, ...): SLUICEGATE_SCHEMA_REGISTRY_<SETTING>.
    schema_registry: dict[str, str] = field(default_factory=_registry_from_env)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The configuration for one confluent-kafka client: bootstrap, security, overrides.

        librdkafka's own log lines go to the DEBUG level of the `sluicegate.kafka` logger:
        a broker that is away makes a client log every reconnection attempt, and what
        that means is said once, by whoever waits on it, not hundreds of times."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": CLIENT_LOG}
        config.update(self.kafka)
        config.update(overrides)
        return config

    @property
    def max_record_bytes(self) -> int:
        """The largest record a sluicegate producer writes (its `message.max.bytes`,
        librdkafka's default unless set); the broker and topics must accept it."""
        return int(self.kafka.get("message.max.bytes", DEFAULT_MAX_RECORD_BYTES))

    @property
    def max_payload_bytes(self) -> int:
        """The largest payload (sealed, when the workflow encrypts) a start may carry: a
        record minus room for what travels with a payload (the admitted start's and the
        run row's other fields, a pending start's, a batch's item framing). A bigger one
        could be taken but not admitted, so the SDK refuses it and the worker rejects it
        (docs/decisions/record-size-limit.md)."""
        return self.max_record_bytes - PAYLOAD_RESERVE_BYTES

    def registry_config(self) -> dict[str, Any]:
        """The configuration of a schema registry client: the URL and the pass-through."""
        return {**self.schema_registry, "url": self.schema_registry_url}

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
