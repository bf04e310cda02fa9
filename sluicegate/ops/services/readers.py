"""The two ways the operator's tools read a topic, shared by every service that reads one:

- `TableReader`: a topic from its start, then on from where the last read stopped (the
  runs table, the identity changelog, the dead letters counted);
- `Tail`: a topic from the end each partition has now, or from its last few records
  (`ledger tail`, the demo, the newest dead letters).

Both assign their partitions and never commit (the group id is a formality of the
client), and read read_committed: what an aborted transaction wrote is never seen, and a
transaction still open holds its partition short of its end until it ends. The ledger's
DuckDB copy keeps its offsets in its own file and reads with its own loop
(`sluicegate.ops.services.ledger`), and the control table is the workers' own reader
(`sluicegate.admission.control.ControlTable`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from sluicegate.config import Settings
from sluicegate.kafkautil import watermarks
from sluicegate.topology.admin import TopologyError

# How long a fetch may wait for records: short for a reader that stops at the end, the
# client's default for a tail that runs until Ctrl-C.
SHORT_WAIT_MS = 20
TAIL_WAIT_MS = 500


def open_consumer(settings: Settings, group: str, wait_ms: int = SHORT_WAIT_MS) -> Consumer:
    return Consumer(settings.client_config(**{
        # assign() only, never a commit: the group id is a formality of the client.
        "group.id": group,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": wait_ms,
    }))


def partitions(consumer: Consumer, topic: str, timeout_s: float) -> list[int] | None:
    """The topic's partitions, or None when Kafka does not have it."""
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None:
        return None
    return sorted(meta.partitions)


def read_to_end(consumer: Consumer, positions: dict[int, int], ends: dict[int, int],
                on_record: Callable[[Message], None], timeout_s: float) -> list[int]:
    """Read the assigned partitions on from `positions` (moved as records are read) to
    `ends`; the partitions still short of their end after `timeout_s` (a transaction
    still open holds a partition short of it: the reader has what is committed so far)."""
    behind = {p for p, end in ends.items() if positions[p] < end}
    deadline = time.monotonic() + timeout_s
    while behind and time.monotonic() < deadline:
        for msg in consumer.consume(5000, timeout=0.2):
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None or partition not in positions:
                continue
            error = msg.error()
            if error is not None:
                # The end's offset is past any transaction marker, which no record reports.
                if error.code() == KafkaError._PARTITION_EOF:
                    positions[partition] = max(positions[partition], offset)
            else:
                on_record(msg)
                positions[partition] = offset + 1
            if positions[partition] >= ends.get(partition, 0):
                behind.discard(partition)
    return sorted(behind)


class TableReader:
    """A topic read from its start, then on: each `read_on` reads from where the last one
    stopped to the end each partition had when it began, and hands every record to
    `apply(key, value)` (a tombstone's value is None). A topic Kafka does not have reads
    as empty."""

    def __init__(self, settings: Settings, topic: str, group: str,
                 apply: Callable[[bytes | None, bytes | None], None]) -> None:
        self.settings = settings
        self.topic = topic
        self.group = group
        self.apply = apply
        self._consumer: Consumer | None = None
        self._next: dict[int, int] = {}

    def read_on(self, timeout_s: float = 10.0) -> list[int]:
        """Read on to the current end; the partitions that did not reach it in time."""
        if self._consumer is None:
            self._consumer = open_consumer(self.settings, self.group)
            self._next = dict.fromkeys(
                partitions(self._consumer, self.topic, timeout_s) or [], 0)
            self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                                   for p in self._next])
        ends = {p: watermarks(self._consumer, TopicPartition(self.topic, p), timeout_s)[1]
                for p in self._next}
        return read_to_end(self._consumer, self._next, ends,
                           lambda msg: self.apply(msg.key(), msg.value()), timeout_s)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class Tail:
    """A topic from the end each partition has now, or, with `back`, from the last `back`
    records of each; `ends` is where each partition ended when the tail began. A topic
    Kafka does not have is a TopologyError saying how to create it."""

    def __init__(self, settings: Settings, topic: str, group: str, *, back: int = 0,
                 timeout_s: float = 30.0, wait_ms: int = TAIL_WAIT_MS) -> None:
        self.topic = topic
        self._consumer = open_consumer(settings, group, wait_ms)
        try:
            found = partitions(self._consumer, topic, timeout_s)
            if found is None:
                raise TopologyError(f"Kafka at {settings.bootstrap} has no topic {topic}: "
                                    "run `sluicegate topics create` (or check --namespace)")
            self.ends: dict[int, int] = {}
            self._next: dict[int, int] = {}
            for p in found:
                low, high = watermarks(self._consumer, TopicPartition(topic, p), timeout_s)
                self.ends[p] = high
                self._next[p] = max(0, low, high - back)
            self._consumer.assign([TopicPartition(topic, p, at)
                                   for p, at in self._next.items()])
        except BaseException:
            self._consumer.close()
            raise

    def records(self, timeout_s: float = 0.5) -> Iterator[Message]:
        """The records that arrive within `timeout_s` (none of the client's events)."""
        for msg in self._consumer.consume(500, timeout=timeout_s):
            if msg.error() is None:
                yield msg

    def to_the_ends(self, timeout_s: float) -> list[Message]:
        """The records up to the ends the partitions had when the tail began (fewer when
        that takes more than `timeout_s`)."""
        found: list[Message] = []
        read_to_end(self._consumer, self._next, self.ends, found.append, timeout_s)
        return found

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Tail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
