"""What the engine runs, described apart from running it (Kafka Streams' `Topology`): the
stages, each with its wiring (a `Node`: its name, the topics it reads, its store, what it
publishes and hears of), the global tables, and what the engine must be told of the
application around it: how keys are partitioned, where a record that cannot be processed
goes, what to make sure of at start, which errors are not a record's fault. Whoever
assembles the stages builds one (`sluicegate/admission/app.py`); the worker
(`runtime.Worker`) and the test driver run it. The engine imports nothing of the
application: what it knows of it is here.

A global table is read in full by every worker, outside its consumer group (Kafka
Streams' global tables); the engine catches up with it before it processes anything,
polls it from its loop, and tells the stages that read it of each row that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate.engine.stage import DeadLetterHandler, Stage


@dataclass(frozen=True, slots=True)
class Table:
    """Rows of a stage's store that the stage publishes as a table topic (the runs table):
    the store rows under `prefix` are logged to `topic`, keyed by the rest of their key,
    instead of to the changelog, and restored from it. The topic is their changelog, so a
    row is written to Kafka once (Kafka Streams' source-topic changelog)."""

    name: str
    prefix: bytes
    topic: str


class GlobalTable(Protocol):
    """A table every worker reads whole. Its rows are whatever its owner makes of its
    records: the engine hands them to the stages as they come and reads none itself."""

    @property
    def name(self) -> str: ...

    @property
    def rows(self) -> Mapping[Any, object]:
        """The rows as read so far: each is told to a task's stages once it is restored."""

    def catch_up(self) -> None:
        """Read to the table's end (at start, before anything is processed); a Kafka error
        or a TimeoutError while Kafka does not answer."""

    def poll(self) -> Sequence[object]:
        """Read what arrived since the last call; the rows that changed."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Node:
    """One stage as the topology wires it: Kafka Streams' `addProcessor(name, supplier,
    parents)` with the processor's store. The name names its store and its context."""

    name: str
    stage: Stage
    # The topics whose records it processes; every input topic has the same partition count.
    inputs: tuple[str, ...]
    # The topic its store is logged to and restored from; None: no store, and no timers.
    changelog: str | None = None
    # The rows of its store it publishes as table topics instead of logging them.
    tables: tuple[Table, ...] = ()
    # The inputs whose records a stage of the same worker hands over in-process when the
    # worker owns the partition they are for: processed after the slice of records that
    # sent them, in the order sent, in the sender's transaction, and never written to the
    # topic (offset -1). Only for an input where no record's order against one already
    # in the topic matters (docs/decisions/in-process-handover.md).
    handed_over: tuple[str, ...] = ()
    # The inputs whose records are handed over in the order they were sent: once the
    # worker has read everything sent to that partition before (all of it committed
    # before its tasks joined, and whatever this worker itself wrote there), a record for
    # a partition it owns is processed after the slice of records that sent it, in the
    # order sent and the same transaction, and never written to the topic. Until then
    # they go through the topic, behind the records already in it
    # (docs/decisions/in-process-handover.md).
    handed_over_in_order: tuple[str, ...] = ()
    # The global tables whose changed rows it is told of (`Stage.table_changed`).
    reads: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StartupStep:
    """Something a worker makes sure of at start, in order, before it joins its group
    (the topics are there, the codec is configured): tried again while Kafka does not
    answer (a Kafka error, `KafkaUnreachable`, a TimeoutError), said once as `waiting for
    Kafka to <what>`. Any other error stops the worker, and should say in one line what
    to do."""

    what: str
    run: Callable[[], object]


@dataclass(frozen=True, slots=True)
class Topology:
    # The consumer group every worker running it joins.
    group: str
    nodes: tuple[Node, ...]
    # The partition of a key among n partitions, as the producer's partitioner
    # (`murmur2_random`, Kafka's own) places it: where a record sent without a partition
    # lands, so the worker knows whether it owns it (the handover).
    partitioner: Callable[[bytes, int], int]
    # Where a record that is not processed is told (`StageContext.dead_letter`): by
    # default a stage's `unprocessable`, and the worker's last resort when that fails too.
    dead_letter: DeadLetterHandler
    # Handed to every stage's context, to name the topics it sends to (`StageContext.topics`).
    topics: Any = None
    global_tables: tuple[GlobalTable, ...] = ()
    startup: tuple[StartupStep, ...] = ()
    # Errors of a service the stages call (a schema registry) that say nothing against the
    # record: the cycle is aborted and read again as it was, as for the broker's errors,
    # instead of the record being retried and then dead-lettered.
    service_errors: tuple[type[Exception], ...] = ()
