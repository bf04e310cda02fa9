"""Small Kafka client helpers shared by the runtime, the SDK and the tools."""

from __future__ import annotations

import logging
import re
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from sluicegate.config import Settings

# librdkafka reports a refused login or a failed TLS handshake only through the error
# callback; its blocking calls just time out with "all brokers down". These codes are the
# ones no retry can fix.
_AUTH_CODES = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL)
# "sasl_plaintext://127.0.0.1:9094/bootstrap: SASL authentication error: ..." -> the address
_BROKER_PREFIX = re.compile(r"^\w+://(?P<broker>[^/\s]+)(?:/\S*)?:\s*")


class KafkaAuthError(RuntimeError):
    """The broker refused this client's credentials, or the TLS handshake with it failed."""

    def __init__(self, message: str, error: KafkaError) -> None:
        super().__init__(message)
        self.error = error


def _auth_message(settings: Settings, error: KafkaError) -> str:
    reason = error.str()
    match = _BROKER_PREFIX.match(reason)
    broker = match.group("broker") if match else settings.bootstrap
    if match:
        reason = reason[match.end():]
    kafka = settings.kafka
    protocol = kafka.get("security.protocol", "PLAINTEXT")
    if error.code() == KafkaError._SSL:
        return (
            f"TLS handshake with Kafka broker {broker} failed ({reason}). Check that "
            "ssl.ca.location (SLUICEGATE_KAFKA_SSL_CA_LOCATION) names the CA that signed the "
            f"broker's certificate, and that {broker} is a TLS listener "
            f"(security.protocol is {protocol})."
        )
    mechanism = kafka.get("sasl.mechanism", kafka.get("sasl.mechanisms", "GSSAPI"))
    user = kafka.get("sasl.username", "(none)")
    return (
        f"Kafka authentication failed for user {user!r} with SASL {mechanism} at broker "
        f"{broker} ({reason}). Check sasl.username and sasl.password "
        "(SLUICEGATE_KAFKA_SASL_USERNAME / SLUICEGATE_KAFKA_SASL_PASSWORD), and that the "
        f"listener at {broker} expects {protocol} with {mechanism}."
    )


class KafkaUnreachable(RuntimeError):
    """No broker at the bootstrap answered within the time given."""


class BootstrapError(ValueError):
    """A bootstrap servers setting that is not a list of `host:port`."""


# `host:port`, `[v6]:port`, each optionally after a listener's `PROTOCOL://`.
_ADDRESS = re.compile(r"^(?:[A-Za-z_]+://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+)"
                      r"(?::(?P<port>[^:]*))?$")


# "127.0.0.1:1/bootstrap: Connect to ... failed: Connection refused (after 0ms in state
# CONNECT)" -> "Connect to ... failed: Connection refused"
_CLIENT_PREFIX = re.compile(r"^(?:\w+://)?[^/\s]+/\S*:\s*")
_AFTER = re.compile(r"\s*\(after \d+ms in state \w+\)")


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """The (host, port) of each address in a bootstrap servers setting, or BootstrapError
    saying what is wrong. A missing port is an error, not librdkafka's silent 9092: a
    bootstrap without one is more often a mistake than a broker on the default port."""
    addresses: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        match = _ADDRESS.match(part)
        if match is None:
            raise BootstrapError(f"bootstrap {text!r}: {part!r} is not host:port")
        port = match.group("port")
        if port is None:
            raise BootstrapError(f"bootstrap {text!r}: {part!r} has no port "
                                 f"(write {match.group('host')}:9092 for the default one)")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise BootstrapError(f"bootstrap {text!r}: the port of {part!r} must be a number "
                                 "from 1 to 65535")
        addresses.append((match.group("host"), int(port)))
    return addresses


def _probe(settings: Settings, timeout_s: float) -> list[KafkaError] | None:
    """None when the cluster answered a metadata request within `timeout_s`; otherwise
    the errors the client reported meanwhile. A refused login or TLS handshake raises
    KafkaAuthError at once."""
    errors: list[KafkaError] = []
    admin = AdminClient(settings.client_config(error_cb=errors.append))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
            return None
        except KafkaException:
            admin.poll(0)  # serves the error callback
        refused = next((e for e in errors if e.code() in _AUTH_CODES), None)
        if refused is not None:
            raise KafkaAuthError(_auth_message(settings, refused), refused)
        if time.monotonic() >= deadline:
            return errors


def check_access(settings: Settings, timeout_s: float = 10.0) -> None:
    """Fail fast with a KafkaAuthError if the broker refuses these settings' credentials.

    Called where a sluicegate process first talks to Kafka (Client, Engine, Worker.start,
    create_topics), so a wrong password is one clear error within a second, not a raw
    librdkafka error after a 30 s timeout. A broker that does not answer at all is left
    to the caller's own timeouts, as before: it may still be starting (`require_broker`
    is for a caller that should not wait).
    """
    _probe(settings, timeout_s)


def require_broker(settings: Settings, timeout_s: float) -> None:
    """Raise KafkaUnreachable unless a broker at the bootstrap answers within `timeout_s`
    (KafkaAuthError if it refuses these credentials): what a command checks first, so
    that no broker is one line naming the address, not a client's retries."""
    errors = _probe(settings, timeout_s)
    if errors is None:
        return
    # The first error that says why (the refused connection, the name that does not
    # resolve), rather than the "all brokers are down" that follows it.
    telling = [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN] or errors
    reason = ""
    if telling:
        text = _CLIENT_PREFIX.sub("", telling[0].str())
        reason = f" ({_AFTER.sub('', text)})"
    raise KafkaUnreachable(
        f"no Kafka broker answered at {settings.bootstrap} within {timeout_s:g}s{reason}; "
        "is it running? `sluicegate kafka status` says whether the local one is, "
        "--timeout waits longer")


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """(low, high) offsets of a partition, retrying while the broker is still electing its
    leader (a topic created a moment ago answers NOT_LEADER for a short while)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=min(10.0, timeout_s),
                                                       cached=False)
            return low, high
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            code = error.code() if isinstance(error, KafkaError) else None
            retriable = isinstance(error, KafkaError) and (error.retriable() or code in (
                KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION))
            if not retriable or time.monotonic() > deadline:
                raise
            if code == KafkaError._UNKNOWN_PARTITION:
                # The client's metadata predates the topic: ask for it explicitly.
                consumer.list_topics(tp.topic, timeout=5.0)
            time.sleep(0.1)


# Errors a client reports while it cannot reach the cluster; it retries them by itself.
_UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError._RESOLVE, KafkaError._TIMED_OUT})
_REPEAT_EVERY_S = 60.0


class ClientErrors:
    """The error callbacks of one process's clients, said the way an operator can read
    them: a broker that cannot be reached is one WARNING line when it starts (and one a
    minute while it lasts), not a line per client per reconnection attempt; `reached()`
    says when it is over. Other errors are one line each, repeats within a minute aside."""

    def __init__(self, who: str) -> None:
        self._who = who
        self._log = logging.getLogger("sluicegate.kafka")
        self._down_since: float | None = None
        self._said: dict[tuple[int, str], float] = {}

    def config(self, client: str) -> dict[str, object]:
        return {"error_cb": lambda error: self._error(client, error)}

    def _error(self, client: str, error: KafkaError) -> None:
        now = time.monotonic()
        if error.code() in _UNREACHABLE:
            if self._down_since is None:
                self._down_since = now
                self._said.clear()
            key = (KafkaError._ALL_BROKERS_DOWN, "")
        else:
            key = (error.code(), client)
        last = self._said.get(key)
        if last is not None and now - last < _REPEAT_EVERY_S:
            self._log.debug("%s %s: %s", self._who, client, error.str())
            return
        self._said[key] = now
        if error.code() in _UNREACHABLE:
            self._log.warning("%s: Kafka cannot be reached (%s); retrying", self._who,
                              error.str())
        else:
            self._log.warning("%s %s: %s: %s", self._who, client, error.name(), error.str())

    def reached(self) -> None:
        """The cluster answered: end an outage, saying how long it lasted."""
        if self._down_since is not None:
            self._log.warning("%s: Kafka reached again after %.1fs", self._who,
                              time.monotonic() - self._down_since)
            self._down_since = None

