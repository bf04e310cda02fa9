"""The test driver: a worker's stages for an App, in memory, without a broker.

This project's `TopologyTestDriver` (Kafka Streams): `TestDriver(app)` builds every stage
the worker runs (`build_pipeline`), one task per partition with a real store per stage
(RocksDB, in a temporary directory it owns unless given one), and plays the runtime's
part around them:

- a record written to a topic a stage reads is processed by that stage, in the order
  written (one queue for every topic); one sent to an input the stage takes handed over
  (`Node.handed_over`) is processed once the record (or timer, or table row) that sent
  it is, in the order sent, and never written, as the worker does when it owns the
  partition (docs/decisions/in-process-handover.md). The driver owns every partition, so
  every such record is handed over. One sent to an input handed over in order
  (`Node.handed_over_in_order`, a control's) is written and processed in its turn: in
  the order sent, as the worker processes it, and listed in `sent`;
- partitions are chosen as the producers choose them: the record's explicit partition,
  else its key's murmur2 partition (a record without a key goes to partition 0). One
  partition by default; `Settings(partitions=n)` gives n tasks, each with its stores;
- time is a `ManualClock`: `advance(ms)` fires every timer at its due time, in due
  order, as a ticking clock would, and processing never moves it;
- `commit()` writes each store's cycle as the runtime's commit does (the changelog and
  the tables a stage publishes, such as the runs table, are written to their topics
  then); `restart(app=...)` is a worker taking the partitions over: the uncommitted
  store writes and outputs are dropped, the records piped since the last commit are
  read again, and new stage objects (the declarations given, or the same) are restored
  over the committed stores (which stay open: RocksDB's own reopening is the store's
  tests' business, and costs tens of milliseconds a store);
- the control table is set by the test (`pause`, `unpause`, `limit`), not read from Kafka.

Every topic is a list of what was written to it (`sent`); the output topics are also
typed lists of decoded records (`admitted`, `ledger`, `dead_letters`, ...), decoded when
read. A stage that raises fails the call that fed it: the worker's retry and
dead-lettering of a failing record are not played here.

A long run (the benchmarks in memory: `bench/micro.py`, `bench/gate_micro.py`) keeps the
driver lean with:

- `stages=("identity", "runs")`: only the stages named run, of those the worker runs; a
  record sent to an input of a stage left out is written and not processed;
- `keep=(topics.admitted,)`: only the records of the topics named are kept; a record
  written to another topic gets its offset and is dropped, or, if a stage the driver runs
  reads it, processed and not listed. `count(topic)` counts a topic's records, kept or
  not; `sent` and the typed lists of a topic not kept raise;
- `take(topic)`: a topic read as a consumer reads it, the records since the last `take`;
- `process(stage, records)`: records given to a stage as read from its input, written
  nowhere;
- `with driver.cycle():` one cycle of the worker's loop: the timers due fire at its end,
  and it commits, where otherwise the driver looks for due timers after every record.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from pydantic import BaseModel

from sluicegate import tracing
from sluicegate.admission.app import Pipeline, build_pipeline
from sluicegate.admission.control import ControlTable
from sluicegate.admission.limits import KeyLimits, limits_key
from sluicegate.admission.overrides import RATE_LIMIT, THROTTLE, override_row, target_of
from sluicegate.admission.stage import StageContext
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App, Origin
from sluicegate.engine.clock import DEFAULT_START_MS, ManualClock
from sluicegate.engine.stage import Headers, InputRecord, Stage
from sluicegate.engine.store import StoreTransaction
from sluicegate.engine.task import StageState, Task
from sluicegate.engine.timers import Timers
from sluicegate.engine.topology import Node
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedStart,
    ControlRow,
    DeadLetter,
    EngineCommand,
    KeyLimit,
    LedgerRecord,
    OverrideRow,
    PendingStart,
    Record,
    Reply,
    RunEvent,
    RunEventKind,
    RunRow,
    StartRequest,
    record,
)
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.topics import Topics

R = TypeVar("R", bound=Record)


class SetControlTable(ControlTable):
    """The control table as the test sets it: no consumer, nothing to read."""

    def __init__(self, settings: Settings) -> None:  # no super(): it would make a consumer
        self.topic = Topics(settings).control
        self.rows: dict[str, ControlRow] = {}
        self.overrides: dict[str, OverrideRow] = {}

    def catch_up(self, timeout_s: float = 30.0) -> None:
        return None

    def poll(self) -> list[ControlRow | OverrideRow]:
        return []

    def close(self) -> None:
        return None


@record
class Written:
    """One record written to a topic: by a stage, by the driver's commit, or piped in."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """A start request piped in: the request, its Kafka key and partition, and the
    execution id a fresh run of it gets (identity places it on that partition)."""

    request: StartRequest
    key: bytes
    partition: int
    execution_id: str

    @property
    def request_id(self) -> str:
        return self.request.request_id


class TestDriver:
    """`TestDriver(app)`: pipe records in, move time, read every topic. Close it (or use
    it as a context manager) to close its stores and delete the directory it made."""

    __test__ = False  # not a test class, though pytest would collect its name

    def __init__(self, app: App, settings: Settings | None = None, *,
                 state_dir: Path | None = None, start_ms: int = DEFAULT_START_MS,
                 stages: Collection[str] | None = None,
                 keep: Collection[str] | None = None) -> None:
        """`stages`: the names of the stages to run (every stage the worker runs unless
        given); `keep`: the topics whose records are kept (every topic unless given)."""
        settings = settings or Settings(partitions=1)
        self._run = None if stages is None else frozenset(stages)
        self._keep = None if keep is None else frozenset(keep)
        self._own_dir = state_dir is None
        self.state_dir = Path(tempfile.mkdtemp(prefix="sluicegate-driver-")
                              if state_dir is None else state_dir)
        self.settings = settings.with_(state_dir=self.state_dir)
        self.topics = Topics(self.settings)
        self.clock = ManualClock(start_ms)
        self.control = SetControlTable(self.settings)
        # The limits table as the test sets it (`set_limit`): nothing read from Kafka.
        self.limits = KeyLimits(self.topics.limits)
        self._limit_offset = 0
        self.app = app
        # Every record written, in order, and by topic; per (topic, partition) the next
        # offset.
        self._all: list[Written] = []
        self._log: dict[str, list[Written]] = {}
        self._offsets: dict[tuple[str, int], int] = {}
        # How long each list was at the last commit; the records piped in since then.
        self._committed: dict[str, int] = {}
        self._committed_all = 0
        self._committed_offsets: dict[tuple[str, int], int] = {}
        # Per topic only counted (`keep`), the records stages sent to it; at the last commit.
        self._dropped: dict[str, int] = {}
        self._committed_dropped: dict[str, int] = {}
        # Per topic, how many of its records `take` has returned.
        self._taken: dict[str, int] = {}
        self._piped: list[Written] = []
        # Records written to a stage's input and not yet processed, in the order written.
        self._queue: deque[Written] = deque()
        # Records handed over and not yet processed, in the order sent: the stage that
        # takes each, its partition, and what was sent.
        self._handoffs: deque[tuple[Node, int, str, bytes, bytes | None, Headers | None,
                                    object | None]] = deque()
        self._requests = 0
        self._in_cycle = False
        self.tasks: dict[int, Task] = {}
        try:
            self._open(app)
        except BaseException:
            self.close()  # the directory it made goes too
            raise

    # -- wiring, as the worker wires a task ------------------------------------------

    def _open(self, app: App) -> None:
        self.app = app
        self.pipeline: Pipeline = build_pipeline(app, self.settings, self.control, self.limits)
        topology = self.pipeline.topology
        if self._run is not None:
            unknown = self._run - {node.name for node in topology.nodes}
            if unknown:
                raise ValueError(f"no stage {', '.join(sorted(unknown))}: the worker runs "
                                 f"{', '.join(node.name for node in topology.nodes)}")
            topology = replace(topology, nodes=tuple(
                node for node in topology.nodes if node.name in self._run))
        self._builder = StartBuilder(app, self.settings)
        self._node_for_topic: dict[str, Node] = {
            topic: node for node in topology.nodes for topic in node.inputs}
        self._handed_over: dict[str, Node] = {
            topic: node for node in topology.nodes for topic in node.handed_over}
        self._control_readers = [node.name for node in topology.nodes
                                 if self.control.name in node.reads]
        # Nobody reads the limits table when no limit declares per_key.
        self._limits_readers = [
            node.name for node in topology.nodes if self.limits.name in node.reads
            and self.limits in self.pipeline.topology.global_tables]
        # A restart takes the open stores over: what they hold is what was committed.
        stores = {p: {name: state.store for name, state in task.states.items()
                      if state.store is not None} for p, task in self.tasks.items()}
        self.tasks = {
            p: Task(p, topology, self.state_dir, self._send, self.clock.now_ms,
                    self.settings.max_record_bytes, stores.get(p), self.clock.monotonic_ms,
                    self.settings.state_backend, bool(self.settings.log_derived))
            for p in range(self.settings.partitions)}
        # What the worker does once a task's stores are restored: the derived rows made
        # again from the others (their logs do not carry them), `restored` in a
        # transaction, then every row of the control table told to its stages.
        for task in self.tasks.values():
            task.rebuild_derived()
            for state in task.stateful():
                state.stage.restored(state.ctx)
            for row in list(self.control.rows.values()):
                self._control_changed(task, row)
            for change in list(self.limits.rows.values()):
                self._limits_changed(task, change)
        self._settle()

    def _partition(self, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            return partition
        return 0 if key is None else partition_for(key, self.settings.partitions)

    def _send(self, topic: str, key: bytes | None, value: bytes | None,
              partition: int | None = None, headers: Headers | None = None,
              message: object | None = None) -> None:
        node = self._handed_over.get(topic)
        if node is not None and key is not None:
            # Handed over: processed once what sent it is, in the sender's cycle, and never
            # written.
            self._handoffs.append((node, self._partition(key, partition), topic, key, value,
                                   headers, message))
            return
        keep = self._keep
        if keep is not None and topic not in keep and topic not in self._node_for_topic:
            # Only counted (`_counted`, inlined on every output's path): no partition or
            # offset, which nothing would see.
            self._dropped[topic] = self._dropped.get(topic, 0) + 1
            return
        self._write(topic, self._partition(key, partition), key, value, headers)

    def _write(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               headers: Headers | None = None, piped: bool = False) -> int:
        """Write a record, and say its offset: kept if its topic is, queued if a stage reads
        it, and (`piped`) read again by `restart` unless committed first."""
        tp = (topic, partition)
        offset = self._offsets.get(tp, 0)
        self._offsets[tp] = offset + 1
        kept = self._keep is None or topic in self._keep
        read = topic in self._node_for_topic
        if kept or read or piped:
            written = Written(topic, partition, offset, key, value, headers)
            if kept:
                self._all.append(written)
                self._log.setdefault(topic, []).append(written)
            if read:
                self._queue.append(written)
            if piped:
                self._piped.append(written)
        return offset

    def _counted(self, topic: str) -> bool:
        """Whether `topic`'s records are only counted: neither kept nor read."""
        return self._keep is not None and topic not in self._keep \
            and topic not in self._node_for_topic

    def _count(self, last: dict[str, int], topic: str, partition: int, n: int) -> None:
        """`n` records written to `topic` and only counted; `last`: the last one's offset."""
        if n:
            tp = (topic, partition)
            self._offsets[tp] = self._offsets.get(tp, 0) + n
            last[topic] = self._offsets[tp] - 1

    def _settle(self) -> None:
        """Process what is queued, and fire the timers due now, until nothing is left: what
        a worker's cycles do while the clock stands still. In a `cycle`, the timers wait
        for its end."""
        while True:
            while self._queue or self._handoffs:
                if self._handoffs:
                    node, p, topic, key, value, headers, message = self._handoffs.popleft()
                    node.stage.process_handed_over(self.tasks[p].states[node.name].ctx,
                                                   topic, key, value, headers, message)
                    continue
                written = self._queue.popleft()
                node = self._node_for_topic[written.topic]
                node.stage.process(self.tasks[written.partition].states[node.name].ctx,
                                   InputRecord(written.topic, written.partition,
                                               written.offset, written.key, written.value,
                                               self.clock.now_ms(), written.headers))
            if self._in_cycle or not self._fire(self.clock.now_ms()):
                return

    def _fire(self, now: int) -> bool:
        """Fire every timer due at or before `now`, as the worker's loop does; whether any
        fired."""
        fired = False
        for task in self.tasks.values():
            for state in task.stateful():
                timers = state.timers
                assert timers is not None
                next_due = timers.next_due
                if next_due is None or next_due > now:
                    continue
                for due_ms, key, value in timers.due(now):
                    timers.cancel(due_ms, key)
                    state.stage.fire(state.ctx, due_ms, key, value)
                    fired = True
        return fired

    # -- input -----------------------------------------------------------------------

    def pipe(self, topic: str, value: Record | bytes | None, key: bytes | str | None = None,
             *, partition: int | None = None, headers: Headers | None = None) -> None:
        """Write a record to `topic` (a record is encoded) as a producer would, and process
        everything it leads to."""
        raw = codec.encode(value) if value is not None and not isinstance(value, bytes) \
            else value
        key_bytes = key.encode() if isinstance(key, str) else key
        self._write(topic, self._partition(key_bytes, partition), key_bytes, raw, headers,
                    piped=True)
        self._settle()

    def process(self, stage: str, records: Iterable[InputRecord]) -> None:
        """Each record processed by `stage`, on its partition, as if read from the stage's
        input, then everything they lead to: records handed over in-process, as a stage of
        the worker hands them over. They are written nowhere, so `restart` does not read
        them again; what they send to other stages' topics is processed after the last of
        them, as a worker's next batch would."""
        process = self.stage(stage).process
        contexts = {p: task.states[stage].ctx for p, task in self.tasks.items()}
        for input_record in records:
            process(contexts[input_record.partition], input_record)
        self._settle()

    def start(self, workflow: str, payload: BaseModel | Mapping[str, Any], *,
              id: str | None = None, at: int | None = None, origin: str | Origin = "event",
              request_id: str | None = None, reply_partition: int | None = None,
              headers: Headers | None = None) -> Started:
        """A start request built as the SDK builds it (`Client.start`: validation, the key,
        the payload sealed when the workflow encrypts, the caller's current trace context
        as its headers unless `headers` are given), requested now, piped to the starts
        topic. Request ids are `req-1`, `req-2`, ... unless given."""
        if request_id is None:
            self._requests += 1
            request_id = f"req-{self._requests}"
        self._builder.reply_partition = reply_partition
        request, key = self._builder.build(workflow, payload, id=id, at=at, origin=origin,
                                           request_id=request_id,
                                           requested_at_ms=self.clock.now_ms())
        n = self.settings.partitions
        partition = partition_for(key, n)
        self.pipe(self.topics.starts, request, key, partition=partition,
                  headers=headers if headers is not None else tracing.current_trace())
        return Started(request, key, partition,
                       execution_id_for(workflow, request_id, partition, n))

    def report(self, execution_id: str, kind: RunEventKind, *, workflow: str | None = None,
               **fields: Any) -> None:
        """An engine's report on a run (`Engine.started`, `completed`, ...), now; the
        workflow is the run's admitted one unless given."""
        if workflow is None:
            workflow = next((a.workflow for a in reversed(self.admitted)
                             if a.execution_id == execution_id), None)
            if workflow is None:
                raise ValueError(f"no run {execution_id} was admitted: pass its workflow")
        self.pipe(self.topics.run_events, RunEvent(
            execution_id=execution_id, workflow=workflow, kind=kind,
            at_ms=self.clock.now_ms(), **fields), execution_id)

    def event(self, name: str, body: Mapping[str, Any] | bytes,
              key: bytes | str | None = None) -> None:
        """A cancelOn event published to its topic."""
        raw = body if isinstance(body, bytes) else codec.dump_payload(dict(body))
        self.pipe(self.topics.event(name), raw, key)

    def forward(self, start: PendingStart, *, stage: str = "identity", payload: Any = None,
                headers: Headers | None = None, partition: int = 0) -> None:
        """`start` let go by `stage` (its hop): on to the next hop of its route, keyed as
        the route says, as that stage's `Router.forward` sends it."""
        ctx = self.tasks[partition].states[stage].ctx
        self.pipeline.router.forward(ctx, start, payload, headers)
        self._settle()

    # -- time, control, commit, restart ------------------------------------------------

    @contextmanager
    def cycle(self) -> Iterator[None]:
        """One cycle of the worker's loop, for a long run: what is piped, reported or
        processed inside it is processed at once, as ever, but the timers due fire when it
        ends, and then it commits, as the worker fires them and commits at the end of a
        cycle (outside a cycle the driver looks for due timers after every record, which
        can cost a store read each time). Time stands still inside one: `advance`,
        `commit` and `restart` raise. If its body raises, nothing fires or commits."""
        self._outside_cycle("cycle()")
        self._in_cycle = True
        try:
            yield
        finally:
            self._in_cycle = False
        self._settle()
        self.commit()

    def _outside_cycle(self, what: str) -> None:
        if self._in_cycle:
            raise RuntimeError(f"{what} inside a cycle(): a cycle ends with its commit")

    @property
    def now_ms(self) -> int:
        return self.clock.now_ms()

    def advance(self, ms: int) -> None:
        """Time passes: each timer due meanwhile fires at its due time, earliest first, and
        what it sends is processed before the next one's time comes."""
        self._outside_cycle("advance()")
        end = self.clock.now_ms() + ms
        if ms < 0:
            raise ValueError(f"advance({ms}): time cannot go backwards")
        while True:
            due = [d for task in self.tasks.values() for state in task.stateful()
                   if state.timers is not None and (d := state.timers.next_due) is not None]
            if not due or min(due) > end:
                break
            self.clock.set(max(self.clock.now_ms(), min(due)))
            self._settle()
        self.clock.set(end)
        self._settle()

    def pause(self, workflow: str, reason: str | None = None) -> None:
        """`sluicegate workflows pause`: every task sees the row, as the worker applies it."""
        self._control(ControlRow(workflow=workflow, paused=True, at_ms=self.now_ms,
                                 reason=reason))

    def unpause(self, workflow: str) -> None:
        self._control(ControlRow(workflow=workflow, paused=False, at_ms=self.now_ms))

    def _control(self, row: ControlRow) -> None:
        previous = self.control.rows.get(row.workflow)
        self.control.rows[row.workflow] = row
        if previous is not None and previous.paused == row.paused:
            return
        for task in self.tasks.values():
            self._control_changed(task, row)
        self._settle()

    def limit(self, workflow: str | None = None, *, concurrency: int | None = None,
              rate_limit: tuple[int, int] | None = None,
              throttle: tuple[int, int] | None = None, control: str = "concurrency",
              pool: str | None = None, nth: int = 1, reason: str | None = None,
              by: str | None = None) -> OverrideRow:
        """`sluicegate workflows limit`: an override of a concurrency limit, or of a
        rateLimit or a throttle (`rate_limit`, `throttle`: limit and period in ms), told
        to every task as the worker tells it. None given: the override of `control`
        (`concurrency`, `rateLimit`, `throttle`) is cleared, the declaration applies
        again. Only the control row: the command writes the ledger row."""
        rate = rate_limit if rate_limit is not None else throttle
        if rate is not None:
            control = RATE_LIMIT if rate_limit is not None else THROTTLE
        target = target_of(self.app, workflow, control, pool=pool, nth=nth)
        limit, period_ms = rate if rate is not None else (concurrency, None)
        row = override_row(target, self.now_ms, limit, period_ms, reason=reason, by=by)
        self.control.overrides[target.name] = row
        for task in self.tasks.values():
            self._control_changed(task, row)
        self._settle()
        return row

    def _control_changed(self, task: Task, row: ControlRow | OverrideRow) -> None:
        for name in self._control_readers:
            state = task.states[name]
            state.stage.table_changed(state.ctx, self.control.name, row)

    def set_limit(self, name: str, key: str, limit: int, *, reason: str | None = None,
                  by: str | None = None) -> None:
        """`sluicegate limits set NAME KEY LIMIT`: the row every worker reads."""
        row = KeyLimit(limit=limit, at_ms=self.now_ms, reason=reason, by=by)
        self.limits_record(limits_key(name, key), codec.encode(row))

    def unset_limit(self, name: str, key: str) -> None:
        """`sluicegate limits unset NAME KEY`: a tombstone, the key back to its default."""
        self.limits_record(limits_key(name, key), None)

    def limits_record(self, key: bytes | None, value: bytes | None) -> None:
        """A record on the limits topic as any system may write it (a bad one too)."""
        self._outside_cycle("limits_record()")
        record = InputRecord(self.topics.limits, 0, self._limit_offset, key, value,
                             self.now_ms)
        self._limit_offset += 1
        found = self.limits.apply(record)
        if found is None:
            return
        for task in self.tasks.values():
            self._limits_changed(task, found)
        self._settle()

    def _limits_changed(self, task: Task, row: object) -> None:
        for name in self._limits_readers:
            state = task.states[name]
            state.stage.table_changed(state.ctx, self.limits.name, row)

    def commit(self) -> None:
        """What the runtime does at commit: each store's writes of the cycle to its log (the
        changelog, or the topic of a table the stage publishes), then to the store with
        the offsets of those logs. A table's rows then reach the stages that read it."""
        self._outside_cycle("commit()")
        for task in self.tasks.values():
            for state in task.stateful():
                assert state.tx is not None
                if state.tx.changes:
                    self._commit_state(state, task.partition)
        self._committed = {topic: len(written) for topic, written in self._log.items()}
        self._committed_all = len(self._all)
        self._committed_offsets = dict(self._offsets)
        self._committed_dropped = dict(self._dropped)
        self._piped.clear()
        self._settle()

    def _commit_state(self, state: StageState, partition: int) -> None:
        assert state.tx is not None
        last: dict[str, int] = {}
        for topic, rows in state.logged(bool(self.settings.log_derived)).items():
            if self._counted(topic):
                # No log of this topic is kept or read (a lean driver): count, make nothing.
                self._count(last, topic, partition, len(rows))
                continue
            for key, value in rows:
                last[topic] = self._write(topic, partition, key, value)
        state.tx.commit(last.get(state.changelog), {
            table.name: last[table.topic] for table in state.tables if table.topic in last})

    def restart(self, app: App | None = None) -> None:
        """A worker (with `app`'s declarations, or the same) takes every partition over
        from one that stopped: what was not committed is gone (store writes, outputs) and
        the records piped since the last commit are read again; new stages over the
        committed stores, `restored` called, the control table re-applied."""
        self._outside_cycle("restart()")
        for task in self.tasks.values():
            task.discard()
        for topic, log in self._log.items():
            del log[self._committed.get(topic, 0):]
        del self._all[self._committed_all:]
        self._offsets = dict(self._committed_offsets)
        self._dropped = dict(self._committed_dropped)
        self._taken = {topic: min(n, len(self._log.get(topic, ())))
                       for topic, n in self._taken.items()}
        self._queue.clear()
        self._handoffs.clear()
        self._open(app if app is not None else self.app)
        replay, self._piped = self._piped, []
        for written in replay:
            self.pipe(written.topic, written.value, written.key, partition=written.partition,
                      headers=written.headers)

    def close(self) -> None:
        for task in self.tasks.values():
            task.close()
        self.tasks = {}
        if self._own_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- what the stages see -----------------------------------------------------------

    def stage(self, name: str) -> Stage:
        return self.tasks[0].states[name].stage

    def context(self, stage: str, partition: int = 0) -> StageContext:
        """A stage's context on a partition: its store and timers as the stage sees them
        (the cycle's writes included)."""
        return self.tasks[partition].states[stage].ctx

    def store(self, stage: str, partition: int = 0) -> StoreTransaction:
        return self.context(stage, partition).store

    def timers(self, stage: str, partition: int = 0) -> Timers:
        return self.context(stage, partition).timers

    # -- the topics --------------------------------------------------------------------

    def sent(self, topic: str | None = None) -> list[Written]:
        """Every record written to `topic` (or to any topic kept), in the order written; a
        record handed over in-process is never written."""
        return list(self._all if topic is None else self._kept(topic))

    def read(self, topic: str, cls: type[R]) -> list[R]:
        """The records written to `topic`, decoded (tombstones left out)."""
        return [codec.decode(cls, w.value) for w in self._kept(topic) if w.value is not None]

    def take(self, topic: str) -> list[Written]:
        """The records written to `topic` since the last `take` of it (the first: every
        one), as a consumer reads them; `sent` still lists them all."""
        log = self._kept(topic)
        first = self._taken.get(topic, 0)
        self._taken[topic] = len(log)
        return log[first:]

    def offsets(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the records written to it so far (kept or only
        counted), changelogs included."""
        return dict(self._offsets)

    def count(self, topic: str) -> int:
        """How many records were written to `topic`, kept or not (those dropped by a
        `restart` left out)."""
        return self._dropped.get(topic, 0) + sum(
            n for (t, _partition), n in self._offsets.items() if t == topic)

    def _kept(self, topic: str) -> list[Written]:
        if self._keep is not None and topic not in self._keep:
            raise ValueError(f"{topic}'s records are not kept: TestDriver(keep=...) "
                             f"keeps {', '.join(sorted(self._keep)) or 'none'}")
        return self._log.get(topic, [])

    @property
    def admitted(self) -> list[AdmittedStart]:
        return self.read(self.topics.admitted, AdmittedStart)

    @property
    def ledger(self) -> list[LedgerRecord]:
        return self.read(self.topics.ledger, LedgerRecord)

    @property
    def dead_letters(self) -> list[DeadLetter]:
        return self.read(self.topics.deadletter, DeadLetter)

    @property
    def replies(self) -> list[Reply]:
        return self.read(self.topics.replies, Reply)

    @property
    def commands(self) -> list[EngineCommand]:
        return self.read(self.topics.commands, EngineCommand)

    @property
    def starts(self) -> list[StartRequest]:
        """The starts topic: the requests piped in, and those stages sent (onFailure)."""
        return self.read(self.topics.starts, StartRequest)

    @property
    def runs(self) -> list[RunRow]:
        """The runs table's rows as committed (`commit()` writes them)."""
        return self.read(self.topics.runs, RunRow)
