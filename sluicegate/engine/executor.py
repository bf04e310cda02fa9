"""The cycle executor: what a worker does with the records of a cycle, between reading
them and committing them, whatever it reads them from and writes them to.

It hands each record to its stage, hands over what stages send to each other
(in-process, in the order sent), fires due timers, keeps track of the records that fail
(retried in a replayed cycle, then given to their stage's `unprocessable` hook), holds
what is sent to an in-order input until it has caught up, and commits: the stores'
changelog rows, the consumed offsets and the transaction's commit, then the stores.

It reaches Kafka only through a `CycleIO`: the worker's (engine/runtime.py: the
transactional producer, the consumer, rebalancing) or the test driver's in-memory log
(sluicegate/testing.py), so the two run the same cycle.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.engine.store import StoreUnwritable
from sluicegate.engine.task import StageState, Task
from sluicegate.engine.topology import Node, Topology
from sluicegate.engine.transactions import describe

log = logging.getLogger(__name__)

# Called with the topic, partition and offset a record was written at.
Delivered = Callable[[str, int, int], None]


class CycleIO(Protocol):
    """What the executor asks of the log it reads from and writes to."""

    def begin_transaction(self) -> None:
        """A cycle's transaction begins (nothing if one is open)."""

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                partition: int | None, headers: Headers | None,
                delivered: Delivered | None = None) -> None:
        """Write a record in the cycle's transaction (`partition` None: the key's)."""

    def produce_log(self, topic: str, partition: int,
                    rows: list[tuple[bytes, bytes | None]], delivered: Delivered) -> None:
        """Write a store's rows to one of its logs in the cycle's transaction, in order;
        `delivered` is told the last one's offset."""

    def commit_transaction(self, consumed: dict[tuple[str, int], int]) -> None:
        """Send the next offsets to read to the transaction and commit it."""

    def about_the_record(self, exc: BaseException) -> bool:
        """Whether a failure while processing a record is the record's (retry it, then
        give up on it) rather than the broker's or a service's (retry the cycle)."""

    def stores_behind(self, exc: StoreUnwritable) -> None:
        """The cycle committed, but a store could not write it: it is behind its logs."""


class RecordFailed(Exception):
    """Processing one record (or one timer) failed; `unit` names it for the replay."""

    def __init__(self, unit: tuple[Any, ...], reason: str) -> None:
        super().__init__(reason)
        self.unit = unit
        self.reason = reason


class HandoverFailed(Exception):
    """A stage failed on a record held for an in-order input and handed over at catch-up,
    outside the processing of the record that sent it."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class CatchUp:
    """An in-order input's partition this worker owns but does not hand over to yet: the
    consumer must first read past `target` (the partition's high watermark when its
    tasks had joined; None until then) and past what this worker wrote to it
    (`own_end`). Records sent to it meanwhile are `held` until then, or until the cycle
    commits, when they are written to the topic behind the rest."""

    target: int | None = None
    own_end: int = 0
    held: list[tuple[bytes, bytes | None, Headers | None, object | None]] = field(
        default_factory=list)


# A record handed over, waiting to be processed: what sent it (the record or
# timer whose failure a failure of it is; None for a table row, a restored task or a
# record held at catch-up), the stage and task that take it, and what was sent.
Handoff = tuple[InputRecord | tuple[Any, ...] | None, Node, Task, str, bytes, bytes | None,
                Headers | None, object | None]


def _tell_rows(state: StageState, table: str, rows: list[Any]) -> None:
    for row in rows:
        state.stage.table_changed(state.ctx, table, row)


def _unit_of(sender: InputRecord | tuple[Any, ...]) -> tuple[Any, ...]:
    """What names a record (its topic, partition and offset) or a timer for a retry."""
    if isinstance(sender, InputRecord):
        return (sender.topic, sender.partition, sender.offset)
    return sender


def _unit_text(unit: tuple[Any, ...]) -> str:
    if unit[0] == "timer":
        return f"{unit[1]}'s timer due at {unit[3]} ({unit[4]!r})"
    return f"{unit[0]}[{unit[1]}]@{unit[2]}"


class Executor:
    """The cycle of one worker's tasks (`tasks`, which the owner adds and removes)."""

    def __init__(self, topology: Topology, io: CycleIO, partitions: int, poison_after: int,
                 log_derived: bool = False) -> None:
        self.topology = topology
        self.io = io
        self.partitions = partitions
        self.poison_after = poison_after
        self.log_derived = log_derived
        self.tasks: dict[int, Task] = {}
        self._partitioner = topology.partitioner
        self.node_for_topic: dict[str, Node] = {
            topic: node for node in topology.nodes for topic in node.inputs}
        self.handed_over: dict[str, Node] = {
            topic: node for node in topology.nodes
            for topic in (*node.handed_over, *node.handed_over_in_order)}
        # The inputs handed over in order, and the state of each partition of them this
        # worker owns: handed over (`drained`), catching up, or through the topic only
        # (a stage failed on a record it was handed at catch-up). One never joined goes
        # through its topic.
        self.in_order = frozenset(
            topic for node in topology.nodes for topic in node.handed_over_in_order)
        self.drained: set[tuple[str, int]] = set()
        self.catching: dict[tuple[str, int], CatchUp] = {}
        self.topic_only: set[tuple[str, int]] = set()
        # The offset each of them began reading at when its task joined.
        self.joined_at: dict[tuple[str, int], int] = {}
        # Records handed over: processed in the order sent, each stage taking a run of
        # records as it would from its topic, and before anything else is (a timer, a
        # table row, the commit).
        self.handoffs: deque[Handoff] = deque()
        # The record or timer being processed: what a record it hands over came from (a
        # record itself, its unit made only if something it sent fails).
        self.unit: InputRecord | tuple[Any, ...] | None = None
        # Global table -> the stages that read it.
        self.readers: dict[str, list[str]] = {
            table.name: [node.name for node in topology.nodes if table.name in node.reads]
            for table in topology.global_tables}
        # (topic, partition) -> next offset to commit, for records processed this cycle
        self.progress: dict[tuple[str, int], int] = {}
        # (topic, partition) -> the first offset read this cycle: where an abort goes back to
        self.first: dict[tuple[str, int], int] = {}
        # (topic, partition) -> the offset of the last record of a store's log this cycle
        self._log_offsets: dict[tuple[str, int], int] = {}
        # A record or timer whose processing failed -> (failures, the last reason)
        self.suspects: dict[tuple[Any, ...], tuple[int, str]] = {}
        # A stage's hook that failed as a restored task joined: (stage, partition) ->
        # (failures, the last reason); kept until the join succeeds, across commits.
        self.join_failures: dict[tuple[str, str, int], tuple[int, str]] = {}

    # -- records and timers ----------------------------------------------------------

    def process(self, task: Task, record: InputRecord) -> None:
        """`record`, read from its topic, processed by its stage; its offset is committed
        with the cycle."""
        topic, partition, offset = record.topic, record.partition, record.offset
        tp = (topic, partition)
        if tp not in self.progress:
            self.first[tp] = offset
        node = self.node_for_topic[topic]
        self.unit = record
        if not (self.suspects and self._given_up(node, task, (topic, partition, offset),
                                                 record)):
            try:
                node.stage.process(task.states[node.name].ctx, record)
            except RecordFailed:
                raise
            except Exception as exc:
                raise self._record_failed(node, (topic, partition, offset), exc) from exc
        self.progress[tp] = offset + 1

    def process_given(self, node: Node, records: list[InputRecord]) -> None:
        """Records given to `node`'s stage as read from its input, each on its partition's
        task (the test driver's `process`): written nowhere, so no offset to commit."""
        process, name, tasks = node.stage.process, node.name, self.tasks
        for record in records:
            task = tasks[record.partition]
            self.unit = record
            if self.suspects and self._given_up(node, task, _unit_of(record), record):
                continue
            try:
                process(task.states[name].ctx, record)
            except RecordFailed:
                raise
            except Exception as exc:
                raise self._record_failed(node, _unit_of(record), exc) from exc

    def _record_failed(self, node: Node, unit: tuple[Any, ...],
                       exc: Exception) -> RecordFailed:
        """`exc`, raised by `node`'s stage on the record `unit`, as the record's failure;
        re-raised when it is not the record's."""
        if not self.io.about_the_record(exc):
            raise exc
        return RecordFailed(unit, f"{node.name} failed on {_unit_text(unit)}: "
                                  f"{describe(exc)}")

    def suspect(self, failure: RecordFailed) -> None:
        """`failure`'s record failed (again): the replayed cycle retries it, or gives up on
        it once it has failed `poison_after` times."""
        failures = self.suspects.get(failure.unit, (0, ""))[0] + 1
        self.suspects[failure.unit] = (failures, failure.reason)
        if failures >= self.poison_after:
            log.error("%s (failed %d times: it will be dead-lettered)", failure.reason, failures)
        else:
            log.warning("%s (retrying it once in a replayed cycle)", failure.reason)

    def _given_up(self, node: Node, task: Task, unit: tuple[Any, ...],
                  record: InputRecord) -> bool:
        """Whether `record` failed too often to be processed again; if so, its stage's
        `unprocessable` hook has just recorded it instead."""
        suspect = self.suspects.get(unit)
        if suspect is None or suspect[0] < self.poison_after:
            return False
        stage, ctx = node.stage, task.states[node.name].ctx
        reason = f"could not be processed ({suspect[0]} attempts): {suspect[1]}"
        if self.handoffs:
            # What the records before it sent is theirs to fail, not this record's.
            self.hand_over_queued(unit)
        try:
            stage.unprocessable(ctx, record, reason)
            if self.handoffs:
                self.hand_over_queued()
        except Exception as exc:
            if not self.io.about_the_record(exc):
                raise
            # The stage's own account of it cannot be written either: a bare dead letter.
            log.error("%s: its stage could not record it (%s); a bare dead letter instead",
                      reason, describe(exc))
            ctx.dead_letter(record, reason)
        return True

    def apply_tables(self) -> None:
        """The global tables' changed rows, told to the stages that read them."""
        self.unit = None
        for table in self.topology.global_tables:
            readers = self.readers[table.name]
            for row in table.poll():
                self.io.begin_transaction()
                for task in self.tasks.values():
                    for name in readers:
                        state = task.states[name]
                        state.stage.table_changed(state.ctx, table.name, row)
            if self.handoffs:
                self.hand_over_queued()

    def fire_timers(self, now: int) -> int:
        """Fire every timer due at or before `now`, earliest first per stage; how many."""
        fired = 0
        for task in self.tasks.values():
            for state in task.stateful():
                timers = state.timers
                assert timers is not None
                next_due = timers.next_due
                if next_due is None or next_due > now:
                    continue
                self.io.begin_transaction()
                for due_ms, key, value in timers.due(now):
                    timers.cancel(due_ms, key)
                    self._fire(state, task.partition, due_ms, key, value)
                    fired += 1
        return fired

    def _fire(self, state: StageState, partition: int, due_ms: int, key: bytes,
              value: bytes) -> None:
        node = state.node
        stage = node.stage
        unit = self.unit = ("timer", node.name, partition, due_ms, key)
        if self.suspects and unit in self.suspects:
            timer = InputRecord(f"timer:{node.name}", partition, -1, key, value, due_ms)
            if self._given_up(node, self.tasks[partition], unit, timer):
                return
        try:
            stage.fire(state.ctx, due_ms, key, value)
            if self.handoffs:
                self.hand_over_queued()
        except Exception as exc:
            if not self.io.about_the_record(exc):
                raise
            raise RecordFailed(unit, f"{node.name} failed on its timer due at {due_ms} "
                                     f"({key!r}): {describe(exc)}") from exc

    # -- what stages send ------------------------------------------------------------

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             partition: int | None = None, headers: Headers | None = None,
             message: object | None = None) -> None:
        """A stage's output: handed over when a stage of a task here takes it, held while
        its in-order input catches up, else written to its topic."""
        node = self.handed_over.get(topic)
        if node is not None and key is not None:
            p = self._partitioner(key, self.partitions) if partition is None else partition
            task = self.tasks.get(p)
            if task is not None:
                tp = (topic, p) if topic in self.in_order else None
                if tp is None or tp in self.drained:
                    # Handed over: processed after the slice of records that sent it, in
                    # the order sent, in this transaction, and never written to its topic.
                    # No stage is ever called again while it is still processing one, and
                    # each takes a run of records as it would from its topic. It has no
                    # offset of its own: a failure is the failure of the record (or timer)
                    # whose processing sent it.
                    self.handoffs.append((self.unit, node, task, topic, key, value, headers,
                                          message))
                    return
                catching = self.catching.get(tp)
                if catching is not None:
                    catching.held.append((key, value, headers, message))
                    return
        self.io.produce(topic, key, value, partition, headers)

    def hand_over_queued(self, owner: InputRecord | tuple[Any, ...] | None = None) -> None:
        """Process the records handed over, and those they send in turn, in the order
        sent. One that fails fails the record or timer that sent it (`RecordFailed`),
        which is retried and then given up on as any is; one of no record's fails as the
        stage would have failed where it sent it. `owner`: the unit being processed,
        which the queue's own records are not."""
        handoffs = self.handoffs
        while handoffs:
            unit, node, task, topic, key, value, headers, message = handoffs.popleft()
            self.unit = unit
            try:
                node.stage.process_handed_over(task.states[node.name].ctx, topic, key,
                                               value, headers, message)
            except RecordFailed:
                raise
            except Exception as exc:
                if unit is None or not self.io.about_the_record(exc):
                    raise
                sender = _unit_of(unit)
                raise RecordFailed(sender, f"{node.name} failed on a record handed over from "
                                           f"{_unit_text(sender)}: {describe(exc)}") from exc
        self.unit = owner

    # -- in-order inputs -------------------------------------------------------------

    def join_in_order(self, partition: int, begins: dict[str, int]) -> None:
        """A task joined: its in-order inputs catch up, from the offsets it begins at."""
        for topic in self.in_order:
            tp = (topic, partition)
            self.joined_at[tp] = begins.get(topic, -1)
            if tp not in self.topic_only and tp not in self.catching:
                self.catching[tp] = CatchUp()

    def hold_in_order(self) -> None:
        """New tasks are joining: what they read may have been sent to the in-order inputs
        this worker hands over to, so every such partition catches up again, to an end
        read once they have all joined."""
        for tp in self.drained:
            self.catching[tp] = CatchUp()
        self.drained.clear()
        for catching in self.catching.values():
            catching.target = None

    def release(self, positions: dict[tuple[str, int], int]) -> None:
        """After a batch, given how far the consumer has read each catching partition
        whose end is known: those read past everything sent to them before are handed
        over from here on, beginning with the records held for them. A stage that fails
        on a held record fails the cycle (`HandoverFailed`): it is read again, with those
        partitions' records going through their topics for as long as the worker owns
        them, where a record that fails is retried and given up on as any is."""
        released = []
        for key, position in positions.items():
            catching = self.catching[key]
            assert catching.target is not None
            # No position: nothing returned since the task joined, where it began reading.
            at = position if position >= 0 else self.joined_at.get(key, -1)
            needed = max(catching.target, catching.own_end)
            if needed > 0 and at < needed:
                continue
            del self.catching[key]
            self.drained.add(key)
            released.append(key)
            if not self.catching:
                log.info("read up to the ends of the stage topics taken in order: their "
                         "records are handed over in this process")
            if catching.held:
                topic, partition = key
                node, task = self.handed_over[topic], self.tasks[partition]
                self.handoffs.extend((None, node, task, topic, *held)
                                     for held in catching.held)
        try:
            self.hand_over_queued()
        except Exception as exc:
            if not self.io.about_the_record(exc):
                raise
            self.drained.difference_update(released)
            self.topic_only.update(released)
            log.warning("a stage failed on a record handed over at catch-up (%s): the cycle "
                        "is read again, and %s go through their topics", describe(exc),
                        ", ".join(f"{t}[{p}]" for t, p in released))
            raise HandoverFailed(exc) from exc

    def forget_in_order(self, partitions: set[int]) -> None:
        for states in (self.drained, self.topic_only):
            states.difference_update([tp for tp in states if tp[1] in partitions])
        for held in (self.catching, self.joined_at):
            for tp in [tp for tp in held if tp[1] in partitions]:
                del held[tp]

    def _sent_in_order(self, topic: str, partition: int, offset: int) -> None:
        catching = self.catching.get((topic, partition))
        if catching is not None:
            catching.own_end = max(catching.own_end, offset + 1)

    # -- commit and abort ------------------------------------------------------------

    def commit(self) -> None:
        """The cycle's end, in the exactly-once order: its outputs, state and input
        progress commit or vanish together, and the stores follow the commit."""
        # What is still handed over is part of this cycle; what is held for an in-order
        # input goes to its topic, behind what was sent there before.
        if self.handoffs:
            self.hand_over_queued()
        for (topic, partition), catching in self.catching.items():
            for key, value, headers, _ in catching.held:
                self.io.produce(topic, key, value, partition, headers, self._sent_in_order)
            catching.held.clear()
        # Each store's writes of the cycle to its logs (the changelog, or the topic of a
        # table the stage publishes), in its partition; derived rows to none.
        self._log_offsets.clear()
        changed = [(task.partition, state) for task in self.tasks.values()
                   for state in task.stateful() if state.tx is not None and state.tx.pending]
        for partition, state in changed:
            for topic, rows in state.logged(self.log_derived).items():
                self.io.produce_log(topic, partition, rows, self._delivered)
        # The offsets consumed go to the transaction, which commits.
        self.io.commit_transaction(self.progress)
        self.progress.clear()
        self.first.clear()
        if self.suspects:
            self.suspects.clear()
        # Only now the stores, each with the offsets of its last rows in its logs.
        logged = self._log_offsets
        try:
            for p, state in changed:
                assert state.tx is not None
                state.tx.commit(logged.get((state.changelog, p)), {
                    table.name: logged[(table.topic, p)] for table in state.tables
                    if (table.topic, p) in logged})
        except StoreUnwritable as exc:
            self.io.stores_behind(exc)

    def _delivered(self, topic: str, partition: int, offset: int) -> None:
        tp = (topic, partition)
        if offset > self._log_offsets.get(tp, -1):
            self._log_offsets[tp] = offset

    def discard(self) -> dict[tuple[str, int], int]:
        """Drop the cycle: its store writes, what it handed over or held; an in-order
        input read this cycle catches up again, to as far as it had read. Returns where
        each partition it read from goes back to."""
        for task in self.tasks.values():
            task.discard()
        self.handoffs.clear()
        for catching in self.catching.values():
            catching.held.clear()
        for tp in [tp for tp in self.drained if tp in self.progress]:
            self.drained.discard(tp)
            self.catching[tp] = CatchUp(self.progress[tp])
        targets = self.first
        self.progress = {}
        self.first = {}
        return targets

    # -- a restored task joins -------------------------------------------------------

    def join(self, task: Task) -> None:
        """A restored task's first work, in a transaction, so a stage can act on what it
        finds (fail the starts of a workflow that is no longer declared, say), and catch
        up with the global tables. A stage hook that raises fails it as a record fails a
        cycle (`RecordFailed`); one that fails `poison_after` times is skipped, said in one
        ERROR line, so a deterministic failure does not keep the partition from joining."""
        self.io.begin_transaction()
        self.unit = None
        partition = task.partition
        hooks: list[tuple[tuple[str, str, int], Callable[[], object]]] = [
            ((state.node.name, "restored", partition), partial(state.stage.restored, state.ctx))
            for state in task.stateful()]
        for table in self.topology.global_tables:
            rows = list(table.rows.values())
            for name in self.readers[table.name]:
                hooks.append(((name, f"the {table.name} table", partition),
                              partial(_tell_rows, task.states[name], table.name, rows)))
        for unit, hook in hooks:
            failed = self.join_failures.get(unit)
            if failed is not None and failed[0] >= self.poison_after:
                log.error("%s failed on %s of partition %d %d times (%s): skipped, the "
                          "partition joins without it", unit[0], unit[1], partition,
                          failed[0], failed[1])
                continue
            try:
                hook()
                if self.handoffs:
                    self.hand_over_queued()
            except Exception as exc:
                if not self.io.about_the_record(exc):
                    raise
                reason = f"{unit[0]} failed on {unit[1]} of partition {partition}: " \
                         f"{describe(exc)}"
                failures = (failed[0] if failed else 0) + 1
                self.join_failures[unit] = (failures, describe(exc))
                log.warning("%s (trying again as the partition joins again)", reason)
                raise RecordFailed(unit, reason) from exc
        for unit in [u for u in self.join_failures if u[2] == partition]:
            del self.join_failures[unit]
