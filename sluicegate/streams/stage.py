"""What a stage is, and what it sees of the runtime.

A stage receives one record at a time with a context; through the context it reads and
writes its own partition's store, schedules timers and sends records. It never touches a
consumer, a producer or a transaction: the runtime owns all I/O (as a Kafka Streams
processor does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.schemas.records import ControlRow
from sluicegate.streams.store import StoreTransaction
from sluicegate.streams.timers import Timers
from sluicegate.topology.topics import Topics


@dataclass(frozen=True, slots=True)
class InputRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


# (topic, key, value, partition or None for the key's murmur2 partition)
Send = Callable[[str, bytes | None, bytes | None, int | None], None]


class StageContext:
    """One stage's view of one partition during one commit cycle."""

    __slots__ = ("_clock", "_send", "_store", "_timers", "partition", "stage", "topics")

    def __init__(
        self,
        stage: str,
        partition: int,
        topics: Topics,
        store: StoreTransaction | None,
        timers: Timers | None,
        send: Send,
        clock: Callable[[], int],
    ) -> None:
        self.stage = stage
        self.partition = partition
        self.topics = topics
        self._store = store
        self._timers = timers
        self._send = send
        self._clock = clock

    @property
    def store(self) -> StoreTransaction:
        if self._store is None:
            raise RuntimeError(f"stage {self.stage} is stateless and has no store")
        return self._store

    @property
    def timers(self) -> Timers:
        if self._timers is None:
            raise RuntimeError(f"stage {self.stage} is stateless and has no timers")
        return self._timers

    @property
    def now_ms(self) -> int:
        return self._clock()

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             partition: int | None = None) -> None:
        self._send(topic, key, value, partition)


class Stage(ABC):
    """One control (or the identity/runs bookkeeping) as a stream processor."""

    name: str
    stateful: bool = True

    @abstractmethod
    def inputs(self, topics: Topics) -> tuple[str, ...]:
        """The topics this stage consumes; all share the stage topics' partition count."""

    @abstractmethod
    def process(self, ctx: StageContext, record: InputRecord) -> None:
        """Handle one input record. Bad input is the stage's to dead-letter and ledger."""

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:  # noqa: B027 - optional
        """A timer this stage scheduled is due; the runtime has already removed it."""

    def restored(self, ctx: StageContext) -> None:  # noqa: B027 - an optional hook
        """The partition's store is restored and about to process; runs in the current
        transaction, so it may send (e.g. fail starts of a workflow no longer declared)."""

    def control_changed(self, ctx: StageContext, row: ControlRow) -> None:  # noqa: B027
        """A control row changed (a workflow paused or unpaused), seen by every task."""
