"""The test driver: a worker's stages for an App, in memory, without a broker.

This project's `TopologyTestDriver` (Kafka Streams): `TestDriver(app)` builds every stage
the worker runs (`build_pipeline`), one task per partition with a real store per stage
(in memory, or RocksDB in a temporary directory it owns unless given one, as the
settings' state backend says), and plays the runtime's part around them:

- a record written to a topic a stage reads is processed by that stage, in the order
  written (one queue for every topic); one sent to an input the stage takes handed over
  (`Node.handed_over`) is processed once the record (or timer, or table row) that sent
  it is, in the order sent, and never written, as the worker does when it owns the
  partition (docs/decisions/in-process-handover.md). The driver owns every partition, so
  every such record is handed over. One sent to an input handed over in order
  (`Node.handed_over_in_order`, a control's) is written and processed in its turn: in
  the order sent, as the worker processes it, and listed in `sent`; or, with
  `in_order=True`, handed over, as a worker does once it has read everything sent there
  before (the driver always has);
- partitions are chosen as the producers choose them: the record's explicit partition,
  else its key's murmur2 partition (a record without a key goes to partition 0). One
  partition by default; `Settings(partitions=n)` gives n tasks, each with its stores;
- time is a `ManualClock`: `advance(ms)` fires every timer at its due time, in due
  order, as a ticking clock would, and processing never moves it;
- it runs the worker's own cycle executor (engine/executor.py), with this driver as its
  log: `commit()` is the worker's commit (the changelog and the tables a stage
  publishes, such as the runs table, are written to their topics, then the stores);
  `restart(app=...)` is a worker taking the partitions over: the uncommitted store
  writes and outputs are dropped, the records piped since the last commit are read
  again, and new stage objects (the declarations given, or the same) are restored as a
  worker restores them: a store in memory made anew from its logs as committed, its
  derived rows made again, then `restored` and the control table; a store on disk
  (RocksDB), or one whose logs a lean driver does not keep, is taken over (reopening
  RocksDB is the store's tests' business, and costs tens of milliseconds a store);
- a record (or timer) that fails aborts the cycle since the last commit, which is read
  again: the record retried, then given to its stage's `unprocessable` (a dead letter
  with the reason) once it has failed `poison_after` times, as in the worker; a failure
  that is not the record's (a service's) raises;
- the control table is set by the test (`pause`, `unpause`, `limit`), and the limits table
  (`set_limit`, `unset_limit`, `limits_record`), not read from Kafka.

Every topic is a list of what was written to it (`sent`); the output topics are also
typed lists of decoded records (`admitted`, `ledger`, `dead_letters`, ...), decoded when
read.

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
  nowhere (read again if the cycle aborts before a commit);
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
from sluicegate.admission.limits import BadLimitRow, KeyLimits, LimitChange, limits_key
from sluicegate.admission.overrides import RATE_LIMIT, THROTTLE, override_row, target_of
from sluicegate.admission.stage import StageContext
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App, Origin
from sluicegate.engine.clock import DEFAULT_START_MS, ManualClock
from sluicegate.engine.executor import Delivered, Executor, HandoverFailed, RecordFailed
from sluicegate.engine.recovery import write_replayed
from sluicegate.engine.stage import Headers, InputRecord, Send, Stage
from sluicegate.engine.store import Store, StoreTransaction, StoreUnwritable
from sluicegate.engine.task import Task
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
        # Rows set since the executor last polled (`Executor.apply_tables`).
        self.changed: list[ControlRow | OverrideRow] = []

    def catch_up(self, timeout_s: float = 30.0) -> None:
        return None

    def poll(self) -> list[ControlRow | OverrideRow]:
        changed, self.changed = self.changed, []
        return changed

    def close(self) -> None:
        return None


class SetLimitsTable(KeyLimits):
    """The limits table as the test sets it (`TestDriver.set_limit`): nothing read from
    Kafka; the rows that changed wait for the executor's next poll."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.changed: list[LimitChange | BadLimitRow] = []

    def poll(self) -> list[LimitChange | BadLimitRow]:
        changed, self.changed = self.changed, []
        return changed


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
                 keep: Collection[str] | None = None, in_order: bool = False) -> None:
        """`stages`: the names of the stages to run (every stage the worker runs unless
        given); `keep`: the topics whose records are kept (every topic unless given);
        `in_order`: records sent to an input handed over in order are handed over, as a
        worker does once it has caught up, rather than written to their topic."""
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
        self.limits = SetLimitsTable(self.topics.limits)
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
        # What the cycle since the last commit read, in order: the records piped in, and
        # the batches given to `process`; an abort reads it again.
        self._since: list[Written | tuple[Node, list[InputRecord]]] = []
        # Records written to a stage's input and not yet processed, in the order written;
        # batches given to `process` and not yet processed.
        self._queue: deque[Written] = deque()
        self._batches: deque[tuple[Node, list[InputRecord]]] = deque()
        self._requests = 0
        self._in_cycle = False
        self._in_order = in_order
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
        executor = self._executor = Executor(topology, self, self.settings.partitions,
                                             self.settings.poison_after,
                                             bool(self.settings.log_derived))
        self._node_for_topic = executor.node_for_topic
        self._nodes = {node.name: node for node in topology.nodes}
        self._not_the_records: tuple[type[Exception], ...] = (
            StoreUnwritable, *topology.service_errors)
        # A restart takes the stores on disk over, in step with their logs as of the last
        # commit, as a worker restarted on the same state directory does; stores in
        # memory are gone with the worker that had them, and restored from their logs.
        # A lean driver that does not keep a store's logs takes that store over too.
        stores: dict[int, dict[str, Store]] = {}
        for p, task in self.tasks.items():
            stores[p] = {}
            for name, state in task.states.items():
                if state.store is None:
                    continue
                logs = (state.changelog, *(table.topic for table in state.tables))
                keep = self._keep
                if state.store.persistent or (keep is not None and not keep.issuperset(logs)):
                    stores[p][name] = state.store
                else:
                    state.store.close()
        self.tasks = executor.tasks
        send = self._sender()
        for p in range(self.settings.partitions):
            task = Task(p, topology, self.state_dir, send, self.clock.now_ms,
                        self.settings.max_record_bytes, stores.get(p), self.clock.monotonic_ms,
                        self.settings.state_backend, bool(self.settings.log_derived))
            self._restore(task)
            self.tasks[p] = task
        for task in self.tasks.values():
            self._join(task)
        self._settle()

    def _restore(self, task: Task) -> None:
        """What a worker's restoration does, from the logs in memory: each store replays
        its logs from the offset it is at, then its derived rows are made again."""
        for state in task.stateful():
            store = state.store
            assert store is not None
            for topic, prefix, table in ((state.changelog, b"", None),
                                         *((t.topic, t.prefix, t.name) for t in state.tables)):
                at = store.changelog_offset if table is None else store.table_offset(table)
                rows = [(w.key, w.value) for w in self._log.get(topic, ())
                        if w.partition == task.partition and w.offset > at
                        and w.key is not None]
                if rows:
                    last = max(w.offset for w in self._log[topic]
                               if w.partition == task.partition)
                    write_replayed(store, {prefix + key: value for key, value in rows},
                                   last, table)
        task.rebuild_derived()

    def _join(self, task: Task) -> None:
        """A restored task joins as the worker's does: `restored`, then the global tables'
        rows, each hook that fails tried again until it is skipped (`poison_after`)."""
        if self._in_order:
            self._executor.join_in_order(task.partition, {})
        while True:
            try:
                self._executor.join(task)
                return
            except RecordFailed:
                task.discard()
                self._executor.handoffs.clear()

    def _partition(self, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            return partition
        return 0 if key is None else partition_for(key, self.settings.partitions)

    def _sender(self) -> Send:
        """What the stages send with: the executor's `send` for a topic a stage takes
        handed over (it decides between handing over, holding and writing); any other
        record the executor would only write, so it is written (`produce`) or, in a lean
        driver, counted when no stage reads its topic, at no more cost than that."""
        keep, read, dropped = self._keep, self._node_for_topic, self._dropped
        handed_over, send, produce = self._executor.handed_over, self._executor.send, self.produce

        def sending(topic: str, key: bytes | None, value: bytes | None,
                    partition: int | None = None, headers: Headers | None = None,
                    message: object | None = None) -> None:
            if topic in handed_over:
                send(topic, key, value, partition, headers, message)
            elif keep is not None and topic not in keep and topic not in read:
                dropped[topic] = dropped.get(topic, 0) + 1
            else:
                produce(topic, key, value, partition, headers)

        return sending

    # -- the log, as the executor writes to it (its CycleIO) ---------------------------

    def begin_transaction(self) -> None:
        return None

    def produce(self, topic: str, key: bytes | None, value: bytes | None,
                partition: int | None, headers: Headers | None,
                delivered: Delivered | None = None) -> None:
        p = self._partition(key, partition)
        offset = self._write(topic, p, key, value, headers)
        if delivered is not None:
            delivered(topic, p, offset)

    def produce_log(self, topic: str, partition: int,
                    rows: list[tuple[bytes, bytes | None]], delivered: Delivered) -> None:
        if self._counted(topic):
            # No log of this topic is kept or read (a lean driver): count, make nothing.
            tp = (topic, partition)
            last = self._offsets[tp] = self._offsets.get(tp, 0) + len(rows)
            delivered(topic, partition, last - 1)
            return
        for key, value in rows:
            last = self._write(topic, partition, key, value)
        delivered(topic, partition, last)

    def commit_transaction(self, consumed: dict[tuple[str, int], int]) -> None:
        self._committed = {topic: len(written) for topic, written in self._log.items()}
        self._committed_all = len(self._all)
        self._committed_offsets = dict(self._offsets)
        self._committed_dropped = dict(self._dropped)
        self._since.clear()

    def about_the_record(self, exc: BaseException) -> bool:
        return not isinstance(exc, self._not_the_records)

    def stores_behind(self, exc: StoreUnwritable) -> None:
        raise exc

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
                self._since.append(written)
        return offset

    def _counted(self, topic: str) -> bool:
        """Whether `topic`'s records are only counted: neither kept nor read."""
        return self._keep is not None and topic not in self._keep \
            and topic not in self._node_for_topic

    def _settle(self) -> None:
        """Process what is queued, and fire the timers due now, until nothing is left: what
        a worker's cycles do while the clock stands still. In a `cycle`, the timers wait
        for its end. A record (or timer) that fails aborts the cycle, as in the worker:
        what it did since the last commit is dropped and read again, the failing record
        retried, then given up on (`poison_after`)."""
        while True:
            try:
                self._drain()
                return
            except RecordFailed as failure:
                self._executor.suspect(failure)
                self._abort()
            except HandoverFailed:
                # A stage failed on a record held for an in-order input: read again, with
                # that input going through its topic from now on, as in the worker.
                self._abort()

    def _drain(self) -> None:
        executor = self._executor
        queue, batches, handoffs = self._queue, self._batches, executor.handoffs
        process = executor.process
        tasks = self.tasks
        while True:
            while queue or handoffs or batches:
                if handoffs:
                    executor.hand_over_queued()
                elif batches:
                    executor.process_given(*batches.popleft())
                else:
                    written = queue.popleft()
                    process(tasks[written.partition],
                            InputRecord(written.topic, written.partition, written.offset,
                                        written.key, written.value, self.clock.now_ms(),
                                        written.headers))
            if executor.catching:
                # Everything written is read: the in-order inputs have caught up.
                for tp, catching in executor.catching.items():
                    if catching.target is None:
                        catching.target = self._offsets.get(tp, 0)
                executor.release({tp: self._offsets.get(tp, 0) for tp in executor.catching})
                if handoffs:
                    continue
            if self._in_cycle or not executor.fire_timers(self.clock.now_ms()):
                return

    def _abort(self) -> None:
        """The worker's abort: the cycle's store writes and outputs dropped, and what it
        read read again."""
        self._executor.discard()
        replay = self._rewind()
        for entry in replay:
            if isinstance(entry, Written):
                self._write(entry.topic, entry.partition, entry.key, entry.value,
                            entry.headers, piped=True)
            else:
                self._since.append(entry)
                self._batches.append(entry)

    def _rewind(self) -> list[Written | tuple[Node, list[InputRecord]]]:
        """Back to the last commit: what was written since is gone; returns what was read
        since."""
        for topic, log in self._log.items():
            del log[self._committed.get(topic, 0):]
        del self._all[self._committed_all:]
        self._offsets = dict(self._committed_offsets)
        self._dropped.clear()  # in place: the stages' send counts into it
        self._dropped.update(self._committed_dropped)
        self._taken = {topic: min(n, len(self._log.get(topic, ())))
                       for topic, n in self._taken.items()}
        self._queue.clear()
        self._batches.clear()
        replay, self._since = self._since, []
        return replay

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
        batch = (self._nodes[stage], list(records))
        self._since.append(batch)
        self._batches.append(batch)
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
        self.control.changed.append(row)
        self._executor.apply_tables()
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
        self.control.changed.append(row)
        self._executor.apply_tables()
        self._settle()
        return row

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
        self.limits.changed.append(found)
        self._executor.apply_tables()
        self._settle()

    def commit(self) -> None:
        """What the runtime does at commit (`Executor.commit`): each store's writes of the
        cycle to its log (the changelog, or the topic of a table the stage publishes),
        then to the store with the offsets of those logs. A table's rows then reach the
        stages that read it."""
        self._outside_cycle("commit()")
        self._executor.commit()
        self._settle()

    def restart(self, app: App | None = None) -> None:
        """A worker (with `app`'s declarations, or the same) takes every partition over
        from one that stopped: what was not committed is gone (store writes, outputs) and
        the records piped since the last commit are read again; new stages over the
        committed stores, `restored` called, the control table re-applied."""
        self._outside_cycle("restart()")
        self._executor.discard()
        replay = self._rewind()
        self._open(app if app is not None else self.app)
        for written in replay:
            if isinstance(written, Written):
                self.pipe(written.topic, written.value, written.key,
                          partition=written.partition, headers=written.headers)

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

    def derive(self, stage: str, partition: int = 0) -> dict[bytes, bytes]:
        """The derived rows `stage` would make at a restore from its rows as they are now
        (the cycle's writes included), and from those of the stages it derives rows from
        (`Stage.derives_from`): to hold against the derived rows it keeps as it goes."""
        task = self.tasks[partition]
        beside = {name: self.store(name, partition) for name in task.beside(
            self.stage(stage))}
        return self.stage(stage).derive(self.store(stage, partition), beside)

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

    def counts(self) -> dict[str, int]:
        """Per topic, how many records were written to it, kept or only counted (a
        lean driver counts the records of a topic it neither keeps nor reads, the
        ledger say, without writing them)."""
        totals = dict(self._dropped)
        for (topic, _partition), n in self._offsets.items():
            totals[topic] = totals.get(topic, 0) + n
        return totals

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
