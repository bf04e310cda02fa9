"""The limits table: per-key limits set outside the declarations (tenant tiers), read in
full by every worker (a global table, as the control table is).

A concurrency, throttle or rateLimit limit declared with `per_key="NAME"` takes the limit
of each of its keys from `sg.limits` (compacted), whose rows are keyed `NAME:<key value>`
with a `KeyLimit` value; a key the table does not name keeps the declared limit. Any
system may write the rows (a Kafka Connect source on a billing database, a script,
`sluicegate limits set`). A record that is not a limit is dead-lettered with its reason by
the task that owns its key, and the key keeps the limit it had.

`key_limit` is the one rule every stage asks: the table's value when it names the key,
else the declared limit (docs/decisions/limits-table.md).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.declare.validation import MAX_LIMIT
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import KeyLimit
from sluicegate.topology.topics import Topics

# Its name as a global table of the engine (`GlobalTable.name`).
LIMITS_TABLE = "limits"
# Between the rows' name (a declared `per_key`, which cannot contain it) and the key value.
SEP = ":"


def limits_key(name: str, key: str) -> bytes:
    """The Kafka key of the row giving key `key` of the limits named `name` its limit."""
    return f"{name}{SEP}{key}".encode()


@dataclass(frozen=True, slots=True)
class LimitChange:
    """A row of the limits table as read: key `key` of the limits named `name` has
    `limit` (None: the row was deleted, the key is back to the declared limit)."""

    name: str
    key: str
    limit: int | None
    at_ms: int = 0
    reason: str | None = None
    by: str | None = None


@dataclass(frozen=True, slots=True)
class BadLimitRow:
    """A record of the limits table that is no limit, and why: the task that owns its
    key dead-letters it (`dead_letter_here`); the table keeps the key's previous limit."""

    record: InputRecord
    reason: str


def parse(key: bytes | None, value: bytes | None) -> LimitChange | str:
    """A record of the limits table as a change, or the reason it is none."""
    if key is None:
        return "a limits row needs its key, '<per_key>:<key value>'"
    text = key.decode(errors="replace")
    name, sep, key_value = text.partition(SEP)
    if not sep or not name:
        return (f"limits row key {text!r} is not '<per_key>:<key value>' (the name a "
                "limit declares as per_key, a colon, the key's value)")
    if value is None:
        return LimitChange(name, key_value, None)
    try:
        row = codec.decode(KeyLimit, value)
    except codec.DecodeError as exc:
        return f"limits row {text!r} is not a KeyLimit: {exc}"
    if not 1 <= row.limit <= MAX_LIMIT:
        return (f"limits row {text!r}: limit {row.limit} is not from 1 to {MAX_LIMIT:,}; "
                "the key keeps its previous limit")
    return LimitChange(name, key_value, row.limit, row.at_ms, row.reason, row.by)


class KeyLimits:
    """The rows of the limits table, by (name, key value): what `key_limit` reads."""

    name = LIMITS_TABLE

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.rows: dict[tuple[str, str], LimitChange] = {}

    def apply(self, record: InputRecord) -> LimitChange | BadLimitRow | None:
        """Take one record of the topic in; what changed (None: nothing did)."""
        change = parse(record.key, record.value)
        if isinstance(change, str):
            return BadLimitRow(record, change)
        where = (change.name, change.key)
        if change.limit is None:
            gone = self.rows.pop(where, None)
            return None if gone is None else change
        previous = self.rows.get(where)
        self.rows[where] = change
        return None if previous is not None and previous.limit == change.limit else change

    def limit(self, name: str, key: str) -> int | None:
        row = self.rows.get((name, key))
        return None if row is None else row.limit

    # The engine's GlobalTable protocol; the worker's table reads Kafka (LimitsTable).
    def catch_up(self) -> None:
        return None

    def poll(self) -> list[LimitChange | BadLimitRow]:
        return []

    def close(self) -> None:
        return None


def key_limit(table: KeyLimits | None, per_key: str | None, key: str, declared: int) -> int:
    """The limit of key `key` of a limit declared `declared` with `per_key`: the table's
    when it names the key, else the declared one."""
    if per_key is None or table is None:
        return declared
    found = table.limit(per_key, key)
    return declared if found is None else found


def declares_per_key(app: App) -> bool:
    """Whether any limit of `app` takes its values from the limits table."""
    for wf in app.workflows.values():
        options = (*wf.concurrency, *wf.throttle, wf.rate_limit)
        if any(o is not None and o.per_key is not None for o in options):
            return True
    return False


def owns(key: bytes | None, partition: int, partitions: int) -> bool:
    """Whether the task of `partition` owns `key` (dead-letters a bad row of it)."""
    return (0 if key is None else partition_for(key, partitions)) == partition


class LimitsTable(KeyLimits):
    """The worker's limits table: `sg.limits` read from its beginning outside the consumer
    group, caught up before anything is processed, then polled from the loop, as the
    control table is (admission/control.py)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(Topics(settings).limits)
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"{settings.namespace}limits-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        }))
        self._consumer.assign([TopicPartition(self.topic, 0, 0)])

    def catch_up(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._read(0.2, None):
                return
        raise TimeoutError(f"could not read {self.topic} to its end within {timeout_s}s")

    def poll(self) -> list[LimitChange | BadLimitRow]:
        changed: list[LimitChange | BadLimitRow] = []
        self._read(0.0, changed)
        return changed

    def _read(self, timeout: float, changed: list[LimitChange | BadLimitRow] | None) -> bool:
        """Read what is there; True at the end of the topic while catching up. Bad rows
        read while catching up are not told again: the workers that read them as they
        came dead-lettered them."""
        for msg in self._consumer.consume(500, timeout=timeout):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and changed is None:
                    return True
                continue
            _, stamp = msg.timestamp()
            found = self.apply(InputRecord(msg.topic() or self.topic, msg.partition() or 0,
                                           msg.offset() or 0, msg.key(), msg.value(), stamp))
            if found is not None and changed is not None:
                changed.append(found)
        return False

    def close(self) -> None:
        self._consumer.close()


def rows_of(table: Mapping[tuple[str, str], LimitChange], name: str | None = None,
            ) -> list[LimitChange]:
    """The table's rows (of the limits named `name`), in name and key order."""
    return [row for where, row in sorted(table.items())
            if name is None or where[0] == name]
