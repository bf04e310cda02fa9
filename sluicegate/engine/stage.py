"""What a stage is, and what it sees of the runtime.

A stage receives one record at a time with a context; through the context it reads and
writes its own partition's store, schedules timers and sends records. It never touches a
consumer, a producer or a transaction: the runtime owns all I/O (as a Kafka Streams
processor does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

from sluicegate.engine.held import HeldTable
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.tables import HeldStateTable, StateTable, StoreReader, TableSpec
from sluicegate.engine.timers import Timers

T = TypeVar("T")

# Kafka record headers, as the client gives and takes them: (name, value) in order.
Headers = list[tuple[str, str | bytes | None]]


@dataclass(slots=True)
class InputRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    # None when the record has none (nearly always). Only sluicegate's own stage topics
    # carry headers it reads (docs/decisions/record-headers.md).
    headers: Headers | None = None
    # The value decoded, when the record was handed over in-process by a stage that had
    # it (`Node.handed_over`): the receiving stage need not decode `value` again.
    message: object | None = None


class Send(Protocol):
    """Produce one record in the current transaction: to `partition`, or (None) to the
    key's partition as the producer's partitioner places it (`Topology.partitioner`); with
    `headers` when given. `message` is the record `value` encodes, for a stage the record
    may be handed over to (`Stage.process_handed_over`)."""

    def __call__(self, topic: str, key: bytes | None, value: bytes | None,
                 partition: int | None = None, headers: Headers | None = None,
                 message: object | None = None, /) -> None: ...


class StageContext(Generic[T]):
    """One stage's view of one partition during one commit cycle. `topics` is what the
    topology gives its stages to name the topics they send to (`Topology.topics`); the
    engine passes it on and never reads it."""

    __slots__ = ("_clock", "_dead_letter", "_monotonic", "_store", "_tables", "_timers",
                 "beside", "logs_derived", "partition", "send", "stage", "topics")

    def __init__(
        self,
        stage: str,
        partition: int,
        topics: T,
        store: StoreTransaction | None,
        timers: Timers | None,
        send: Send,
        clock: Callable[[], int],
        dead_letter: DeadLetterHandler,
        monotonic: Callable[[], int] | None = None,
        tables: tuple[TableSpec[Any, Any], ...] = (),
        legacy_rows: bool = False,
        beside: frozenset[str] = frozenset(),
    ) -> None:
        """`tables`: the stage's tables (`Stage.tables`), over `store`; `legacy_rows`: their
        values written as a release before typed tables wrote them, and every derived row
        logged too (a rolling upgrade: SLUICEGATE_LOG_DERIVED); `beside`: the names of the
        stages the task runs with this one (whose stores `Stage.derives_from` may name)."""
        self.stage = stage
        self.beside = beside
        # Whether the task logs its derived rows as well (a rolling upgrade): a row a
        # release before logged must then be written where that release reads it.
        self.logs_derived = legacy_rows
        self.partition = partition
        self.topics = topics
        self._store = store
        self._timers = timers
        # The runtime's own function, called straight: it is on every output's path.
        self.send = send
        self._clock = clock
        self._monotonic = monotonic or clock
        self._dead_letter = dead_letter
        self._tables: dict[str, StateTable[Any, Any] | HeldStateTable[Any, Any]] = {}
        if tables:
            if store is None:
                raise RuntimeError(f"stage {stage} declares tables and has no store")
            held = store.held
            self._tables = {
                spec.name: (HeldStateTable(spec, cast(HeldTable, held.tables[spec.prefix]))
                            if spec.held and held is not None and spec.prefix in held.tables
                            else StateTable(spec, store, legacy_rows))
                for spec in tables}

    def table(self, name: str) -> StateTable[Any, Any] | HeldStateTable[Any, Any]:
        """The stage's table `name` (`Stage.tables`) in this cycle's transaction."""
        try:
            return self._tables[name]
        except KeyError:
            raise KeyError(f"stage {self.stage} declares no table {name!r} "
                           f"(it has {', '.join(self._tables) or 'none'})") from None

    def dead_letter(self, record: InputRecord, reason: str) -> None:
        """Tell where someone will look that `record` is not processed, and why: the
        topology's dead-letter handler (`Topology.dead_letter`)."""
        self._dead_letter(self, record, reason)

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

    @property
    def monotonic_ms(self) -> int:
        """The time this worker has itself spent, in ms from an arbitrary start: a step of
        the wall clock does not move it (engine/clock.py)."""
        return self._monotonic()


class Stage(ABC):
    """A stage's processing: what it does with a record, a due timer, a restored partition
    and a changed row of a global table. How it is wired (its name, the topics it reads,
    its store and what it publishes from it) is the topology's (`engine.topology.Node`),
    as Kafka Streams keeps a processor's wiring in its `Topology`."""

    # Its state: named tables, each with its key prefix and codecs, reached through the
    # context (`ctx.table(name)`; docs/decisions/typed-tables.md).
    tables: tuple[TableSpec[Any, Any], ...] = ()
    # The key prefixes of the store rows that are derived from its other rows (counters,
    # indexes): kept in the store for reads, never logged, and made again by `derive`
    # when the store is restored (docs/decisions/derived-rows.md). A stage with tables
    # lists its derived tables' prefixes here (`tables.derived_prefixes`).
    derived: tuple[bytes, ...] = ()
    # The prefixes of the keys of the timers it derives (kept under
    # DERIVED_TIMER_PREFIX, which `derived` then lists, and which `derive` makes too).
    derived_timers: tuple[bytes, ...] = ()
    # The stages of the same task whose stores some of its derived rows follow from too
    # (the concurrency stage's holders of the runs it admitted in its own task follow
    # from the runs stage's rows): `derive` is given their stores, and a restore that
    # writes one of them makes this stage's derived rows again as well.
    derives_from: tuple[str, ...] = ()

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        """Every derived row (under `derived`), computed from the store's other rows and
        from `beside`, the stores of the stages of `derives_from` that the task runs."""
        return {}

    @abstractmethod
    def process(self, ctx: StageContext[Any], record: InputRecord) -> None:
        """Handle one input record. Bad input is the stage's to dead-letter and ledger."""

    def process_handed_over(self, ctx: StageContext[Any], topic: str, key: bytes,
                            value: bytes | None, headers: Headers | None,
                            message: object | None) -> None:
        """Handle a record another stage of this worker sent to `topic`, an input this stage
        takes handed over (`Node.handed_over`), on this partition, in the sender's
        transaction: what was sent, `message` the record `value` encodes if the sender
        passed it. By default it is processed as the record read from the topic would be,
        with offset -1 (it is never written there) and the current time; a stage that can
        take `message` as it is overrides this and skips the record
        (docs/decisions/in-process-handover.md)."""
        self.process(ctx, InputRecord(topic, ctx.partition, -1, key, value, ctx.now_ms,
                                      headers, message))

    def unprocessable(self, ctx: StageContext[Any], record: InputRecord, reason: str) -> None:
        """`record` is not processed: it failed again when its cycle was replayed, or its
        outputs cannot be written. Say so where someone will look, and nothing more: a
        dead letter with `reason` by default; a stage whose records are requests adds the
        ledger row each needs. A timer given up on comes here too, as a record of topic
        `timer:<stage>` with offset -1, its timer key and value."""
        ctx.dead_letter(record, reason)

    def fire(self, ctx: StageContext[Any], due_ms: int, key: bytes, value: bytes) -> None:  # noqa: B027 - optional
        """A timer this stage scheduled is due; the runtime has already removed it."""

    def restored(self, ctx: StageContext[Any]) -> None:  # noqa: B027 - an optional hook
        """The partition's store is restored and about to process; runs in the current
        transaction, so it may send (e.g. fail starts of a workflow no longer declared)."""

    def table_changed(self, ctx: StageContext[Any], table: str, row: object) -> None:  # noqa: B027
        """A row of the global table `table` changed (`GlobalTable.poll`), seen by every
        task of a stage that reads the table (`Node.reads`); and once a task is restored,
        each of the table's rows (`GlobalTable.rows`). Runs in the current transaction, so
        it may send."""


# Where a record that is not processed is told: (its stage's context, the record, why).
DeadLetterHandler = Callable[[StageContext[Any], InputRecord, str], None]
