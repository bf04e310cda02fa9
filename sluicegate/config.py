"""Process-wide settings: where the broker is, what the topics are called, how the runtime
commits and how long it waits, the Kafka client settings every client sluicegate makes
shares, and the schema registry records are framed for.

One checked object (`Settings`), as Kafka Streams' `StreamsConfig` is: each setting is
declared once (`VARIABLES`: its type, range, default and what it does), can be given in
code or through an environment variable `SLUICEGATE_<NAME>`, and a value it does not take
is a `SettingsError` naming the variable, what it got and what it takes, in one line.
Kafka client settings (TLS, SASL, ...) pass through `kafka` unchanged to every client, and
schema registry client settings (basic auth, TLS) through `schema_registry`; a Kafka
setting sluicegate sets itself (`RUNTIME_KAFKA`) is refused rather than dropped.

`python -m sluicegate.config --markdown` prints docs/configuration.md from these.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# librdkafka's message.max.bytes default.
DEFAULT_MAX_RECORD_BYTES = 1_000_000
PAYLOAD_RESERVE_BYTES = 64 * 1024
ENV_PREFIX = "SLUICEGATE_"
KAFKA_PREFIX = "SLUICEGATE_KAFKA_"
REGISTRY_PREFIX = "SLUICEGATE_SCHEMA_REGISTRY_"


class SettingsError(ValueError):
    """A setting sluicegate does not take, said in one line: the variable (or the field,
    for a value given in code), what it got and what it takes."""


class _ClientLog:
    """What librdkafka logs (`logger` of a client), as DEBUG lines of `sluicegate.kafka`."""

    _log = logging.getLogger("sluicegate.kafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        self._log.debug(msg, *args)


CLIENT_LOG = _ClientLog()


# -- what a setting takes --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Whole:
    """A whole number from `low` to `high` (no bound when None)."""

    low: int
    high: int | None = None

    @property
    def takes(self) -> str:
        if self.high is None:
            return f"a whole number, at least {self.low}"
        return f"a whole number from {self.low} to {self.high}"

    def parse(self, text: str) -> int:
        return int(text.strip())

    def accepts(self, value: object) -> bool:
        return (isinstance(value, int) and not isinstance(value, bool) and value >= self.low
                and (self.high is None or value <= self.high))


@dataclass(frozen=True, slots=True)
class Text:
    """Text matching `pattern` in full, described as `takes`."""

    pattern: str
    takes: str

    def parse(self, text: str) -> str:
        return text

    def accepts(self, value: object) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None


@dataclass(frozen=True, slots=True)
class Directory:
    """A directory; a relative one is taken from the directory the process starts in."""

    takes: str = "a directory (relative to the working directory)"

    def parse(self, text: str) -> Path:
        if not text.strip():
            raise ValueError("empty")
        return Path.cwd() / text

    def accepts(self, value: object) -> bool:
        return isinstance(value, Path)


Kind = Whole | Text | Directory


@dataclass(frozen=True, slots=True)
class Variable:
    """One setting: the `Settings` field, its kind, its default as the environment would
    write it, and what it does (the configuration page's text)."""

    name: str
    kind: Kind
    default: str
    doc: str
    section: str

    @property
    def env(self) -> str:
        return f"{ENV_PREFIX}{self.name.upper()}"


# How long the worker's transaction may stay open at the broker (producer_tuning in
# engine/runtime.py): a commit interval must leave a cycle well inside it.
TRANSACTION_TIMEOUT_MS = 15_000

VARIABLES: tuple[Variable, ...] = (
    Variable("bootstrap", Text(r"\S+", "Kafka bootstrap servers, `host:port[,host:port...]`"),
             DEFAULT_BOOTSTRAP,
             "The Kafka brokers every client connects to first. Every command checks its "
             "syntax (exit code 2) before it makes a client.", "Kafka and topics"),
    Variable("namespace", Text(r"[A-Za-z0-9._-]{0,100}",
                               "a topic name prefix of at most 100 letters, digits, `.`, `_` "
                               "and `-`"),
             "sg.",
             "The prefix of every topic name (`sg.starts`, `sg.ledger`, ...) and of the "
             "consumer groups and transactional ids: two deployments on one cluster take "
             "two namespaces.", "Kafka and topics"),
    Variable("partitions", Whole(1, 10_000), "6",
             "The partition count of `sg.starts` and of every stage topic. Co-partitioning "
             "is what lets one task own a key's state in every topic that carries that "
             "key, so every process of a deployment takes the same number, and the worker "
             "refuses topics that have another.", "Kafka and topics"),
    Variable("replication", Whole(1, 32_767), "1",
             "The replication factor of the topics `sluicegate topics create` makes.",
             "Kafka and topics"),
    Variable("state_dir", Directory(), ".sluicegate/state",
             "Where a worker keeps its state stores and its identity (`worker.id`, which "
             "names its static group membership and transactional id). One worker per "
             "directory: a second one is refused.", "Worker"),
    Variable("state_backend", Text(r"memory|rocksdb", "`memory` or `rocksdb`"), "memory",
             "Where a worker keeps its tasks' state. `memory`: the working copy in memory, "
             "rebuilt from the changelogs at every assignment (the fastest, and never "
             "stale). `rocksdb`: RocksDB stores under the state directory, for state larger "
             "than memory, restored from where they left off "
             "(docs/decisions/state-backends.md; docs/benchmarks.md has the memory and "
             "restore figures of each).", "Worker"),
    Variable("log_derived", Whole(0, 1), "0",
             "1 while rolling a fleet from a release that logs every row of its stores (the "
             "releases before derived rows, docs/decisions/derived-rows.md): the worker "
             "logs its derived rows too, so a worker of the release before that takes a "
             "partition over finds them. Roll once with 1, then again without it, as Kafka "
             "Streams' `upgrade.from` does (docs/operations.md).", "Worker"),
    Variable("commit_interval_ms", Whole(1, TRANSACTION_TIMEOUT_MS // 2), "100",
             "A worker's transaction commits after this long: what a decision waits for to "
             "become visible. At most half the transaction timeout sluicegate gives the "
             f"worker's producer ({TRANSACTION_TIMEOUT_MS} ms).", "Worker"),
    Variable("commit_max_records", Whole(1, 1_000_000), "10000",
             "... or after this many records consumed, whichever comes first. It only bounds "
             "a transaction's size under load: a commit waits ~10-25 ms for the broker, so "
             "a small cap spends more time committing than deciding (bench/NOTES.md).",
             "Worker"),
    Variable("restore_step_ms", Whole(1, 60_000), "100",
             "How long one step of restoring a task's stores from their changelogs may take "
             "while the worker has other tasks processing (the restoration goes on in the "
             "next cycle; docs/decisions/restore-in-steps.md).", "Worker"),
    Variable("restore_alone_ms", Whole(1, 600_000), "1000",
             "The same, while the worker has no task processing.", "Worker"),
    Variable("poison_after", Whole(1, 100), "2",
             "A record (or timer) whose processing failed this many times is not processed "
             "again: it is dead-lettered with its reason and the partition moves on "
             "(docs/decisions/runtime-faults.md). 1 means no retry.", "Worker"),
    Variable("min_free_bytes", Whole(0), str(16 * 1024 * 1024),
             "A cycle does not commit with less free space than this under the state "
             "directory: it is aborted and read again, with one ERROR line, until there is "
             "room (a store's memtable flush alone can take tens of MiB; "
             "docs/decisions/runtime-faults.md). 0 turns the check off.", "Worker"),
    Variable("call_timeout_ms", Whole(100, 600_000), "5000",
             "The timeout given to each of the producer's transactional calls "
             "(`init_transactions`, `send_offsets_to_transaction`, `commit_transaction`, "
             "`abort_transaction`).", "Worker"),
    Variable("hang_grace_ms", Whole(0, 600_000), "5000",
             "A transactional call still running this long after its timeout is taken to "
             "hang: the producer is replaced by a new one with the same transactional id.",
             "Worker"),
    Variable("flush_timeout_ms", Whole(100, 600_000), "30000",
             "How long a commit waits for the cycle's records to be delivered before the "
             "cycle is aborted.", "Worker"),
    Variable("abort_flush_ms", Whole(0, 600_000), "10000",
             "How long an abort first waits for the records on their way to be delivered.",
             "Worker"),
    Variable("deployment_cap", Whole(0), "0",
             "A deployment-wide cap on runs in flight across every workflow; 0 means none.",
             "Admission"),
    Variable("encryption_keys", Text(r"[^\s]*", "comma-separated `id:base64key` pairs"), "",
             "The keys that seal the payloads of workflows declaring `encrypt_payloads`: "
             "`id:base64key,...`, newest first; older keys still open what they sealed "
             "(docs/decisions/payload-encryption.md). Empty: none configured, and such a "
             "workflow is a load error.", "Admission"),
    Variable("schema_registry_url", Text(r"(?:https?://\S+)?",
                                         "empty, or an http:// or https:// URL"), "",
             "A Confluent-compatible Schema Registry (its REST root, e.g. "
             "`http://host:8081`, or Apicurio's `http://host:8080/apis/ccompat/v7`): "
             "records are framed with its schema ids. Empty: none, records carry their "
             "schema's fingerprint (docs/wire-format.md). The same on every process.",
             "Schema registry"),
    Variable("otel_endpoint", Text(r"(?:https?://\S+)?", "empty, or an http:// or https:// URL"),
             "",
             "An OpenTelemetry collector's OTLP/HTTP root (`http://host:4318`): the worker "
             "records a span per decision and exports them to its `/v1/traces`. Empty: the "
             "standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` "
             "if set, else no spans (the trace context a start carries is carried on "
             "either way; docs/decisions/traces.md). Needs `sluicegate[otel]`.", "Traces"),
    Variable("otel_service_name", Text(r"[^\s]*", "a service name without spaces"), "",
             "The `service.name` of the worker's spans. Empty: the standard "
             "`OTEL_SERVICE_NAME`, else `sluicegate`.", "Traces"),
)
_BY_NAME = {v.name: v for v in VARIABLES}

# Every Kafka client setting sluicegate sets itself on one or more of its clients, and
# why: a user's `SLUICEGATE_KAFKA_<SETTING>` for one of these would be overridden, so it
# is refused (docs/decisions/settings-checked.md). tests/unit/test_config.py checks that
# this lists every setting the code gives a client.
RUNTIME_KAFKA: dict[str, str] = {
    "bootstrap.servers": "set SLUICEGATE_BOOTSTRAP instead",
    "logger": "its log lines go to the sluicegate.kafka logger",
    "error_cb": "the worker and the tools say what the errors mean",
    "transactional.id": "the worker's id, from its state directory",
    "enable.idempotence": "every producer sluicegate makes is idempotent",
    "partitioner": "murmur2_random, the Java client's, puts keys where the stages read them",
    "transaction.timeout.ms": "the worker's transactions, checked against the commit "
                              "interval and the call deadlines",
    "linger.ms": "the worker lingers for the commit interval "
                 "(SLUICEGATE_COMMIT_INTERVAL_MS), the SDK and the tools a few ms",
    "compression.type": "the worker's producer compresses with lz4",
    "group.id": "each reader's group is named by sluicegate",
    "group.instance.id": "the worker's static membership, from its state directory",
    "client.id": "the worker's client id, from its state directory",
    "isolation.level": "read_committed, which exactly-once needs",
    "enable.auto.commit": "offsets are committed with the transaction, or by the reader",
    "enable.auto.offset.store": "an offset is stored only once its record is acted on",
    "auto.offset.reset": "earliest: a new reader skips nothing",
    "enable.partition.eof": "the table readers need to know when they caught up",
    "partition.assignment.strategy": "range, which keeps co-partitioned topics together",
    "session.timeout.ms": "how soon a stopped worker's or engine's partitions move",
    "heartbeat.interval.ms": "paced to the worker's session timeout",
    "fetch.min.bytes": "the worker's fetches are batched "
                       "(docs/decisions/consumer-fetch-batching.md)",
    "fetch.wait.max.ms": "each reader waits as long as its latency allows",
    "topic.metadata.refresh.interval.ms": "a new cancelOn event topic is noticed within "
                                          "seconds",
    "share.acknowledgement.mode": "explicit: an engine on a share group accepts a start "
                                  "once its run is reported started",
}

# SLUICEGATE_ variables that are not settings of a process but of one command, one tool or
# the tests; listed on the configuration page.
OTHER_VARIABLES: dict[str, str] = {
    "SLUICEGATE_TIMEOUT": "`sluicegate --timeout`: seconds a command waits for the broker "
                          "to answer (default 3).",
    "SLUICEGATE_INSPECT_TOKEN": "`sluicegate inspect serve`: the token the console's "
                                "changes need; one is made and printed when unset.",
    "SLUICEGATE_NO_SPEEDUPS": "`1` runs the pure-Python codec in an install that has the C "
                              "extension (docs/decisions/optional-extension.md).",
    "SLUICEGATE_CLOCK_FILE": "for tests only: the worker reads its clock from this file.",
}

# OpenTelemetry's standard variables that sluicegate reads (the worker's spans, when
# SLUICEGATE_OTEL_ENDPOINT is empty), beside those its exporter reads itself.
OTEL_VARIABLES: dict[str, str] = {
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "the full URL the worker exports its spans to "
                                          "(OTLP/HTTP), used as it is.",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "a collector's OTLP/HTTP root; the spans go to its "
                                   "`/v1/traces`.",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "`http/protobuf`, the one sluicegate exports with; "
                                   "another (`grpc`) stops the worker with one line saying so.",
    "OTEL_SDK_DISABLED": "`true` turns the worker's spans off whatever the endpoint "
                         "variables say (SLUICEGATE_OTEL_ENDPOINT still turns them on).",
    "OTEL_TRACES_EXPORTER": "`none` does the same.",
    "OTEL_SERVICE_NAME": "the spans' `service.name` when SLUICEGATE_OTEL_SERVICE_NAME is empty.",
    "OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE": "read by the OTLP "
        "exporter itself (authentication, timeout, gzip, TLS), as OpenTelemetry documents.",
}


def _kafka_key(variable: str, prefix: str) -> str:
    return variable[len(prefix):].lower().replace("_", ".")


def kafka_variable(key: str) -> str:
    """The environment variable that gives the Kafka client setting `key`."""
    return KAFKA_PREFIX + key.upper().replace(".", "_")


def _passthrough_from_env(prefix: str, *, besides: tuple[str, ...] = ()) -> dict[str, str]:
    """`SLUICEGATE_KAFKA_SASL_MECHANISM=PLAIN` becomes `sasl.mechanism=PLAIN` (prefix
    `SLUICEGATE_KAFKA_`); names in `besides` are settings of their own, not passed through."""
    return {
        _kafka_key(key, prefix): value
        for key, value in os.environ.items()
        if key.startswith(prefix) and key[len(prefix):] not in besides
    }


def _kafka_from_env() -> dict[str, str]:
    return _passthrough_from_env(KAFKA_PREFIX)


def _registry_from_env() -> dict[str, str]:
    # SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:secret -> basic.auth.user.info
    return _passthrough_from_env(REGISTRY_PREFIX, besides=("URL",))


def _from_env(name: str) -> Any:
    variable = _BY_NAME[name]
    text = os.environ.get(variable.env)
    if text is None:
        return variable.kind.parse(variable.default)
    try:
        value = variable.kind.parse(text)
    except ValueError:
        value = None
    if value is None or not variable.kind.accepts(value):
        raise SettingsError(f"{variable.env}={text!r}: it takes {variable.kind.takes}")
    return value


def _refused(key: str, value: object, in_env: bool) -> str:
    where = (f"{kafka_variable(key)}={value!s}" if in_env
             else f"Settings(kafka={{{key!r}: {value!r}}})")
    why = RUNTIME_KAFKA.get(key, "it sets it for this client")
    return (f"{where}: sluicegate sets {key} itself ({why}), so it would be ignored;"
            " unset it")


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str = field(default_factory=partial(_from_env, "bootstrap"))
    namespace: str = field(default_factory=partial(_from_env, "namespace"))
    partitions: int = field(default_factory=partial(_from_env, "partitions"))
    replication: int = field(default_factory=partial(_from_env, "replication"))
    state_dir: Path = field(default_factory=partial(_from_env, "state_dir"))
    state_backend: str = field(default_factory=partial(_from_env, "state_backend"))
    log_derived: int = field(default_factory=partial(_from_env, "log_derived"))
    commit_interval_ms: int = field(default_factory=partial(_from_env, "commit_interval_ms"))
    commit_max_records: int = field(default_factory=partial(_from_env, "commit_max_records"))
    restore_step_ms: int = field(default_factory=partial(_from_env, "restore_step_ms"))
    restore_alone_ms: int = field(default_factory=partial(_from_env, "restore_alone_ms"))
    poison_after: int = field(default_factory=partial(_from_env, "poison_after"))
    min_free_bytes: int = field(default_factory=partial(_from_env, "min_free_bytes"))
    call_timeout_ms: int = field(default_factory=partial(_from_env, "call_timeout_ms"))
    hang_grace_ms: int = field(default_factory=partial(_from_env, "hang_grace_ms"))
    flush_timeout_ms: int = field(default_factory=partial(_from_env, "flush_timeout_ms"))
    abort_flush_ms: int = field(default_factory=partial(_from_env, "abort_flush_ms"))
    deployment_cap: int = field(default_factory=partial(_from_env, "deployment_cap"))
    encryption_keys: str = field(default_factory=partial(_from_env, "encryption_keys"))
    kafka: dict[str, str] = field(default_factory=_kafka_from_env)
    schema_registry_url: str = field(default_factory=partial(_from_env, "schema_registry_url"))
    # Registry client settings passed through unchanged (`basic.auth.user.info`,
    # `ssl.ca.location`, ...): SLUICEGATE_SCHEMA_REGISTRY_<SETTING>.
    schema_registry: dict[str, str] = field(default_factory=_registry_from_env)
    otel_endpoint: str = field(default_factory=partial(_from_env, "otel_endpoint"))
    otel_service_name: str = field(default_factory=partial(_from_env, "otel_service_name"))

    def __post_init__(self) -> None:
        if isinstance(self.state_dir, str):  # a path given as text in code
            object.__setattr__(self, "state_dir", Path(self.state_dir))
        for variable in VARIABLES:
            value = getattr(self, variable.name)
            if not variable.kind.accepts(value):
                raise SettingsError(f"Settings({variable.name}={value!r}) ({variable.env}):"
                                    f" it takes {variable.kind.takes}")
        from_env = _kafka_from_env()
        for key, value in self.kafka.items():
            if key in RUNTIME_KAFKA:
                raise SettingsError(_refused(key, value, from_env.get(key) == value))

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """The configuration for one confluent-kafka client: bootstrap, security, overrides.

        librdkafka's own log lines go to the DEBUG level of the `sluicegate.kafka` logger:
        a broker that is away makes a client log every reconnection attempt, and what
        that means is said once, by whoever waits on it, not hundreds of times.

        A user's setting the client sets itself is never dropped without a word: those of
        RUNTIME_KAFKA are refused when the settings are made, and any other one here."""
        clash = sorted(overrides.keys() & self.kafka.keys())
        if clash:
            key = clash[0]
            raise SettingsError(_refused(key, self.kafka[key], key in _kafka_from_env()))
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


# -- the configuration page ------------------------------------------------------------

_PAGE_HEAD = """\
# Configuration

<!-- Generated by `python -m sluicegate.config --markdown` from sluicegate/config.py;
     tests/unit/test_config.py fails when this page is out of date. -->

Every sluicegate process (worker, CLI, SDK, console) reads its settings from the
environment, or from a `Settings(...)` made in code (`Settings(partitions=12)`,
`settings.with_(namespace="acme.")`). A value a setting does not take stops the process
with one line naming the variable, what it got and what it takes (from the command line:
exit code 2):

```
error: SLUICEGATE_PARTITIONS='abc': it takes a whole number from 1 to 10000
```

Every process of a deployment needs the same `SLUICEGATE_NAMESPACE`, `SLUICEGATE_PARTITIONS`
and schema registry settings.
"""

_PAGE_KAFKA = """\
## Kafka and schema registry clients

`SLUICEGATE_KAFKA_<SETTING>` passes a Kafka client setting to every client sluicegate makes
(the worker's, the SDK's, the commands'): the setting's name in capitals with `_` for `.`,
so `SLUICEGATE_KAFKA_SASL_MECHANISM=PLAIN` is `sasl.mechanism=PLAIN`. Security settings
belong here (docs/decisions/kafka-security.md), and `message.max.bytes`, which also bounds
a start's payload (docs/decisions/record-size-limit.md).

`SLUICEGATE_SCHEMA_REGISTRY_<SETTING>` does the same for the schema registry client
(`SLUICEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO=user:secret` is
`basic.auth.user.info`).

Some Kafka client settings are sluicegate's own: it sets them itself on the clients that
need them, so a `SLUICEGATE_KAFKA_` variable for one of them (or `Settings(kafka=...)`)
is refused in one line rather than ignored:

```
error: SLUICEGATE_KAFKA_SESSION_TIMEOUT_MS=45000: sluicegate sets session.timeout.ms itself (...)
```

| setting | why sluicegate sets it |
|---|---|
"""


def _default_text(variable: Variable) -> str:
    if variable.name == "state_dir":
        return "`.sluicegate/state` in the working directory"
    return f"`{variable.default}`" if variable.default else "empty"


def markdown() -> str:
    """docs/configuration.md: every setting, every Kafka client setting sluicegate keeps,
    and the other variables sluicegate reads."""
    lines = [_PAGE_HEAD]
    for section in dict.fromkeys(v.section for v in VARIABLES):
        lines += [f"## {section}", "", "| variable | default | takes | what it does |",
                  "|---|---|---|---|"]
        lines += [f"| `{v.env}` | {_default_text(v)} | {v.kind.takes} | {v.doc} |"
                  for v in VARIABLES if v.section == section]
        lines.append("")
    lines.append(_PAGE_KAFKA.rstrip("\n"))
    lines += [f"| `{key}` | {why} |" for key, why in sorted(RUNTIME_KAFKA.items())]
    lines += ["", "## Other variables", "",
              "Read by one command or tool, not by every process:", "",
              "| variable | what it does |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in OTHER_VARIABLES.items()]
    lines += ["", "## OpenTelemetry's own variables", "",
              "The worker's spans (docs/decisions/traces.md) also follow OpenTelemetry's "
              "standard variables:", "", "| variable | what it does |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in OTEL_VARIABLES.items()]
    return "\n".join(lines) + "\n"


def _main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m sluicegate.config --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
