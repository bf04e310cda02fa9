"""What the fault suite shares: mixed traffic, an engine that counts what is in flight,
and the invariants, read back from the topics as any user of sluicegate could.

The invariants, after every fault:
- every start request has exactly one final decision in the ledger (queued is not final);
- no execution is admitted twice (sg.admitted, read_committed);
- no limit is broken: one admission per idempotency key and per rateLimit window, and
  never more runs in flight per concurrency key than its limit;
- a record that cannot be processed has exactly one dead letter and one `rejected` row.

`SLUICEGATE_FAULTS_SCALE` multiplies the traffic and the number of faults (`make faults`
runs the suite at 10).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.ops.localkafka.broker import LocalBroker, ensure_broker, stop_broker
from sluicegate.ops.localkafka.processes import free_ports
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Outcome,
    PendingStart,
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.faults import GATE_LIMIT, app
from tests.integration.kafka_helpers import TopicReader, WorkerProcess

SCALE = float(os.environ.get("SLUICEGATE_FAULTS_SCALE", "1"))
APP = "tests.apps.faults"
FINAL = frozenset(Outcome) - {Outcome.queued}


def scaled(n: int) -> int:
    return max(1, round(n * SCALE))


# Every fault test's marks: it needs the broker, and its time limit grows with the traffic
# and faults (pytest's own 300 s ends a test at ten times them long before it is done).
MARKS = [pytest.mark.broker, pytest.mark.timeout(300 * max(1.0, SCALE))]


def alter_configs(settings: Settings, resource: ConfigResource,
                  entries: dict[str, str | None]) -> None:
    """Set (or, for None, put back to the default) configuration entries of a topic or a
    broker, as an operator would."""
    admin = AdminClient(settings.client_config())
    resource.incremental_configs = [
        ConfigEntry(name, value, incremental_operation=(
            AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET))
        for name, value in entries.items()]
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=10)


# -- a broker of the test's own, to restart ---------------------------------------------


class FaultBroker:
    """A local broker on ports of its own, so restarting it disturbs no other test."""

    def __init__(self, data_dir: Path) -> None:
        self.port, self.controller_port = free_ports(2)
        self.data_dir = data_dir
        self.broker: LocalBroker = ensure_broker(port=self.port,
                                                 controller_port=self.controller_port,
                                                 data_dir=data_dir)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def down(self) -> None:
        stop_broker(self.port, self.data_dir)

    def up(self) -> None:
        self.broker = ensure_broker(port=self.port, controller_port=self.controller_port,
                                    data_dir=self.data_dir)

    def stop(self) -> None:
        stop_broker(self.port, self.data_dir)


# -- traffic ----------------------------------------------------------------------------


@dataclass
class Traffic:
    """The start requests produced, by request id: their workflow."""

    workflows: dict[str, str] = field(default_factory=dict)

    def produce(self, client: Client, n: int, rng: random.Random) -> None:
        """`n` starts of every kind: passthrough, idempotent (a fifth of them repeats),
        gated by concurrency, debounced, rate limited."""
        for _ in range(n):
            kind = rng.randrange(10)
            if kind < 2:
                wf, payload = "note", {"text": uuid.uuid4().hex[:8]}
            elif kind < 4:
                order = rng.randrange(max(1, n // 3))
                wf, payload = "sendReceipt", {"orderId": f"o{order}", "amount": order}
            elif kind < 8:
                wf, payload = "gated", {"account": f"a{rng.randrange(8)}", "n": kind}
            elif kind < 9:
                wf, payload = "indexDocument", {"doc": f"d{rng.randrange(20)}", "n": 0}
            else:
                wf, payload = "lowStockAlert", {"product": f"p{rng.randrange(30)}"}
            handle = client.submit(wf, payload)
            self.workflows[handle.request_id] = wf


# -- an engine that counts ----------------------------------------------------------------


class InFlight:
    """Runs in flight per concurrency slot as an engine sees them, and the most there ever
    were. The count is never above the worker's (an engine learns of an admission after
    it happened and reports an end before the slot is freed), so a count over the limit
    is a limit broken."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()

    def started(self, admitted: AdmittedStart) -> list[str]:
        """Count a run the engine starts; returns the slots it holds."""
        slots = [s.key for s in admitted.slots if s.stage == "concurrency"]
        for slot in slots:
            self.now[slot] += 1
            self.most[slot] = max(self.most[slot], self.now[slot])
        return slots

    def ended(self, slots: list[str]) -> None:
        for slot in slots:
            self.now[slot] -= 1


class CountingEngine:
    """An engine in a thread: it runs each admitted start for a moment and reports it
    completed, and counts the runs in flight per concurrency slot as it sees them
    (`InFlight`)."""

    def __init__(self, settings: Settings, hold_s: float = 0.02) -> None:
        self._engine = Engine(group=f"{settings.namespace}engine-{uuid.uuid4().hex[:6]}",
                              settings=settings)
        self._hold_s = hold_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.in_flight = InFlight()
        self.seen: set[str] = set()
        self.error: BaseException | None = None

    def __enter__(self) -> CountingEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._engine.close()
        if self.error is not None:
            raise self.error

    def undelivered(self) -> str:
        """The reports the engine's producer failed to deliver so far (said, not raised)."""
        errors = list(self._engine._errors)
        return f"{len(errors)} ({errors[:3]})" if errors else "none"

    def _run(self) -> None:
        running: list[tuple[float, AdmittedStart, list[str]]] = []
        try:
            while not self._stop.is_set():
                delivery = self._engine.poll(0.02)
                if delivery is not None and delivery.admitted is not None:
                    admitted = delivery.admitted
                    # At-least-once towards the engine: a start seen again is the same run.
                    if admitted.execution_id not in self.seen:
                        self.seen.add(admitted.execution_id)
                        self._engine.started(delivery)
                        slots = self.in_flight.started(admitted)
                        running.append((time.monotonic() + self._hold_s, admitted, slots))
                now = time.monotonic()
                for item in [r for r in running if r[0] <= now]:
                    running.remove(item)
                    _, admitted, slots = item
                    self.in_flight.ended(slots)
                    self._engine.completed(admitted.execution_id, admitted.workflow)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc


class HoldingEngine:
    """An engine in a thread: it starts every run it is handed and completes it at once,
    except the runs of the accounts it holds, which it keeps running until released (or
    finished one by one). It counts the runs in flight per concurrency slot (`InFlight`)."""

    def __init__(self, settings: Settings, held: set[str]) -> None:
        self._engine = Engine(group=f"{settings.namespace}engine-{uuid.uuid4().hex[:6]}",
                              settings=settings)
        self._held = set(held)
        self._finishing: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.handed: Counter[str] = Counter()
        self.completed: set[str] = set()
        self.in_flight = InFlight()
        self.error: BaseException | None = None

    def release(self, account: str) -> None:
        """Complete the account's runs, those held and those to come."""
        with self._lock:
            self._held.discard(account)

    def finish(self, execution_id: str) -> None:
        """Complete one run, held or not, once it has been handed over."""
        with self._lock:
            self._finishing.add(execution_id)

    def __enter__(self) -> HoldingEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._engine.close()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        running: list[tuple[AdmittedStart, list[str]]] = []
        try:
            while not self._stop.is_set():
                delivery = self._engine.poll(0.05)
                if delivery is not None and delivery.admitted is not None:
                    admitted = delivery.admitted
                    self.handed[admitted.execution_id] += 1
                    if self.handed[admitted.execution_id] == 1:
                        self._engine.started(delivery)
                        running.append((admitted, self.in_flight.started(admitted)))
                with self._lock:
                    done = [(r, slots) for r, slots in running
                            if _account(r) not in self._held
                            or r.execution_id in self._finishing]
                for item in done:
                    run, slots = item
                    running.remove(item)
                    self.in_flight.ended(slots)
                    self._engine.completed(run.execution_id, run.workflow)
                    self.completed.add(run.execution_id)
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc


def _account(run: AdmittedStart) -> str | None:
    """The account a run is for, if its workflow has one."""
    account = json.loads(run.payload).get("account")
    return None if account is None else str(account)


# -- what the topics say --------------------------------------------------------------------


class KnownFault(AssertionError):
    """The work is stuck on a fault known and not fixed yet (its message says which)."""


class Outcomes:
    def __init__(self, settings: Settings) -> None:
        topics = Topics(settings)
        self.ledger = TopicReader(settings, topics.ledger, LedgerRecord)
        self.admitted = TopicReader(settings, topics.admitted, AdmittedStart)
        self.deadletters = TopicReader(settings, topics.deadletter, DeadLetter)
        # The final decisions per request, of the ledger rows read so far (`_final`): kept
        # as they are read, so a wait is not a walk of the whole ledger at every poll.
        self._final: dict[str, list[LedgerRecord]] = defaultdict(list)
        self._read = 0

    def poll(self) -> None:
        self.ledger.poll(0.1)
        self.admitted.poll(0.0)
        self.deadletters.poll(0.0)

    def _decided(self) -> dict[str, list[LedgerRecord]]:
        records = self.ledger.records
        for row in records[self._read:]:
            if row.outcome in FINAL:
                self._final[row.request_id].append(row)
        self._read = len(records)
        return self._final

    def final(self) -> dict[str, list[LedgerRecord]]:
        """Each request's final decisions in the ledger read so far (a copy)."""
        return defaultdict(list, {r: list(rows) for r, rows in self._decided().items()})

    def wait_until_decided(self, request_ids: set[str], timeout_s: float,
                           progress: float | None = None, by: float | None = None,
                           explain: Callable[[], str] | None = None,
                           stuck: Callable[[], str | None] | None = None) -> None:
        """Until each of `request_ids` has a final decision; `progress` (a fraction)
        returns as soon as that share of them has one. `by`: a monotonic time the wait
        ends by at the latest (the test's own limit, so this says what is missing before
        pytest-timeout ends the test without a word); `explain` adds to the failure.
        `stuck`, asked every few seconds: the known fault the work is stuck on, if it is
        (`KnownFault` is raised then, rather than waiting out the time)."""
        timeout_s *= max(1.0, SCALE)  # more traffic and faults take longer
        deadline = time.monotonic() + timeout_s
        if by is not None and by < deadline:
            deadline, timeout_s = by, max(0.0, by - time.monotonic())
        want = len(request_ids) if progress is None else int(len(request_ids) * progress)
        asked = time.monotonic()
        while True:
            final = self._decided()
            decided = sum(1 for r in request_ids if r in final)
            if decided >= want:
                return
            if stuck is not None and time.monotonic() - asked > 5.0:
                asked = time.monotonic()
                fault = stuck()
                if fault is not None:
                    raise KnownFault(f"{fault}; {len(request_ids) - decided} of "
                                     f"{len(request_ids)} requests undecided")
            if time.monotonic() > deadline:
                missing = sorted(r for r in request_ids if r not in final)
                raise AssertionError(
                    f"after {timeout_s:.0f}s, {len(request_ids) - decided} of "
                    f"{len(request_ids)} requests have no final decision (e.g. "
                    f"{missing[:5]})\n{self.undecided(missing)}"
                    + ("" if explain is None else "\n" + explain()))
            self.poll()

    def undecided(self, missing: list[str]) -> str:
        """What the ledger says of requests with no final decision: the last row of each
        (a queued start waits for a slot; no row at all, it was never decided), counted."""
        last: dict[str, LedgerRecord] = {}
        for row in self.ledger.records:
            last[row.request_id] = row
        said = Counter(
            "no ledger row" if r not in last else
            f"{last[r].workflow} {last[r].outcome.value} (stage {last[r].stage}, "
            f"key {last[r].key})" for r in missing)
        return "undecided, by their last ledger row: " + "; ".join(
            f"{n} x {what}" for what, n in said.most_common(8))

    def settle(self, quiet_s: float = 2.0) -> None:
        """Read until nothing new arrives for `quiet_s`: whatever else comes is extra."""
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            before = (len(self.ledger.records), len(self.admitted.records),
                      len(self.deadletters.records))
            self.poll()
            if (len(self.ledger.records), len(self.admitted.records),
                    len(self.deadletters.records)) != before:
                last = time.monotonic()

    def close(self) -> None:
        for reader in (self.ledger, self.admitted, self.deadletters):
            reader.close()


def check_invariants(outcomes: Outcomes, traffic: Traffic,
                     engine: CountingEngine | None = None) -> None:
    final = outcomes.final()
    twice = {r: [row.outcome.value for row in rows] for r, rows in final.items()
             if len(rows) > 1}
    # Said with what tells the decisions apart: the workflow, the key, the stage, when
    # each was decided and the run it made.
    assert not twice, "requests decided more than once: " + "; ".join(
        f"{r} ({traffic.workflows.get(r)}): " + ", ".join(
            f"{row.outcome.value} key={row.key} stage={row.stage} "
            f"decided_at={row.decided_at_ms} execution={row.execution_id}"
            for row in final[r]) for r in list(twice)[:5])
    undecided = [r for r in traffic.workflows if r not in final]
    assert not undecided, f"{len(undecided)} requests have no final decision: {undecided[:5]}"
    executions = Counter(a.execution_id for a in outcomes.admitted.records)
    duplicated = [e for e, n in executions.items() if n > 1]
    assert not duplicated, f"executions admitted more than once: {duplicated[:5]}"
    admitted_rows = [rows[0] for rows in final.values() if rows[0].outcome is Outcome.admitted]
    assert {row.execution_id for row in admitted_rows} <= set(executions), (
        "an admitted decision whose admitted start is not on sg.admitted")
    # Limits. An idempotency key is spent once; a rateLimit key admits one an hour.
    for workflow, field_name in (("sendReceipt", "orderId"), ("lowStockAlert", "product")):
        keys = Counter(json.loads(a.payload)[field_name] for a in outcomes.admitted.records
                       if a.workflow == workflow)
        over = {k: n for k, n in keys.items() if n > 1}
        assert not over, f"{workflow}: keys admitted more than once: {over}"
    if engine is not None:
        over = {k: n for k, n in engine.in_flight.most.items() if n > GATE_LIMIT}
        assert not over, f"more runs in flight than the limit of {GATE_LIMIT}: {over}"
    # Valid traffic never reaches the dead-letter topic.
    ours = set(traffic.workflows)
    letters = [d for d in outcomes.deadletters.records if request_id_of(d.value) in ours]
    assert not letters, f"valid starts dead-lettered: {[d.reason for d in letters[:3]]}"


def open_transactions(settings: Settings) -> str:
    """The partitions of the namespace's topics whose last stable offset is short of their
    high watermark (a transaction open on them: a read_committed reader waits there)."""
    lines = []
    readers = {level: Consumer(settings.client_config(**{
        "group.id": f"test-watermarks-{uuid.uuid4().hex[:6]}", "isolation.level": level}))
        for level in ("read_committed", "read_uncommitted")}
    try:
        topics = readers["read_committed"].list_topics(timeout=10).topics
        for name in sorted(t for t in topics if t.startswith(settings.namespace)):
            for p in sorted(topics[name].partitions):
                tp = TopicPartition(name, p)
                stable = readers["read_committed"].get_watermark_offsets(tp, timeout=5)[1]
                high = readers["read_uncommitted"].get_watermark_offsets(tp, timeout=5)[1]
                if stable < high:
                    lines.append(f"{name}[{p}]: stable at {stable}, high watermark {high}")
    except Exception as exc:  # a diagnosis must not hide the failure it explains
        lines.append(f"(watermarks not read: {exc})")
    finally:
        for reader in readers.values():
            reader.close()
    return "partitions with an open transaction: " + ("; ".join(lines) or "none")


def request_id_of(value: bytes | None) -> str | None:
    """The request a record is about, when it decodes as a start (or None)."""
    try:
        message = codec.decode_one_of((StartRequest, PendingStart), value)
    except codec.DecodeError:
        return None
    return message.request_id  # type: ignore[no-any-return]


def run_with_faults(settings: Settings, workers: list[WorkerProcess],
                    faults: Iterable[Callable[[random.Random], None]], seed: int,
                    limit_s: float = 300,
                    stuck: Callable[[], str | None] | None = None) -> None:
    """Mixed traffic through `workers` (started here), each of `faults` striking at a
    random point of the work in flight; then every request must be decided, and the
    invariants hold. `limit_s`: the test's time limit (its timeout mark's, before
    `SCALE`), which the waits end before, to say what is missing; `stuck`: as
    `Outcomes.wait_until_decided`'s."""
    by = time.monotonic() + limit_s * max(1.0, SCALE) - 30
    create_topics(settings)
    rng = random.Random(seed)
    traffic = Traffic()
    outcomes = Outcomes(settings)
    for worker in workers:
        worker.start()
    try:
        with Client(app=app, settings=settings, replies=False) as client, \
                CountingEngine(settings) as engine:

            def explain() -> str:
                return "\n".join([
                    f"the engine has started {len(engine.seen)} runs; "
                    f"{engine.undelivered()} of its reports failed to be delivered",
                    open_transactions(settings),
                    *(f"-- worker {i}'s log:\n{w.log_tail(25)}" for i, w in enumerate(workers))])

            for fault in faults:
                traffic.produce(client, scaled(400), rng)
                client.flush()
                outcomes.wait_until_decided(set(traffic.workflows), timeout_s=180,
                                            progress=rng.uniform(0.2, 0.9), by=by,
                                            explain=explain, stuck=stuck)
                fault(rng)
            traffic.produce(client, scaled(400), rng)
            client.flush()
            outcomes.wait_until_decided(set(traffic.workflows), timeout_s=max(240, limit_s / 2),
                                        by=by, explain=explain, stuck=stuck)
            outcomes.settle()
    finally:
        for worker in workers:
            if worker.alive:
                worker.stop()
        outcomes.close()
    check_invariants(outcomes, traffic, engine)
