"""The cost of every control, on one real broker, against the raw 3-record pipe (issue 15).

    .venv/bin/python -m bench.gate --starts 100000 --repeats 3 --pin
    .venv/bin/python -m bench.gate --starts 20000 --repeats 1 --scenarios passthrough,conc50
    .venv/bin/python -m bench.gate --starts 20000 --repeats 1 --scenarios conc50 --processes 1,2

In one run, on the same broker, one system at a time (the machine has 2 cores):

  raw-io     `bench.rawpipe` writing, per start, the three records an admission writes
             (admitted, ledger, runs table; the sizes the passthrough writes): the
             baseline every scenario is compared with (`bench.passthrough`'s (a')).
  worker     `python -m sluicegate worker --app bench.gate_apps:<scenario>`, one workflow
             declaring the scenario's control (bench/gate_apps.py);
  worker-base  the same from `--baseline-tree` (say, the commit before a change).

`--processes 1,2`: each worker system also as 2 processes of the app in one consumer group
(`worker x2`: each its own state dir, so its own worker id; the state moves with the
partitions), measured in turn with one. Its CPU per start is the sum over its processes;
every check below holds as for one (the same set admitted). The phases begin once every
process has its partitions, each restored (their INFO log lines), and a rebalance after
that fails the measurement. On 2 CPUs two processes do not double a rate: they share the
CPUs with the broker, the engine and this process (the CPU split printed with each run).

The scenarios (`--scenarios`, default all):

  passthrough  no control;
  idem         idempotency hit: every start's key was spent in the warm-up (`existing`);
  rl-admit     rateLimit 1,000/h per key over starts/20 keys: every start admitted;
  rl-drop      rateLimit 1/h per key over 10 keys spent in the warm-up: all `dropped`;
  throttle     1,000/s per key over starts/20 keys (what a fetch brings of one key waits
               a millisecond or so): all admitted;
  debounce     park -> fire: one start per key, period 1s (the real clock: each key
               fires a second after its start arrived), all admitted;
  batch        max_size 10, one key: per ten starts one admitted, nine collapsed (the
               timeout, 10 minutes, never binds: see bench/gate_apps.py; --starts and
               --warmup must be multiples of 10, the latency phase is made one);
  singleton    skip mode, one key per start: each takes a hold, the engine's report of
               its end gives it back;
  conc50       concurrency 50 per key over starts/500 keys (200 keys at 100,000 starts:
               90% of the input queued when it arrives at once), engine completing each
               run at once;
  conc1        concurrency 1 per key over starts/100 keys (1,000 keys at 100,000);
               (a key admits its next run only after a round trip through the engine,
               two commits or so: with few keys, below ~20,000 starts, the conc*
               scenarios measure that round trip, not the worker's CPU; their key
               counts follow --starts in every phase, latency included)
  steps        conc50 in steps mode: the engine reports each run started, suspended (its
               slot goes back) and resumed (it is re-admitted when a slot frees), then
               completed: two admitted records per start;
  pause        the passthrough paused through the control table (`sluicegate.ops.
               services.control.write_control`, what `sluicegate workflows pause` writes),
               `--starts` produced and parked, then unpaused: starts/s is the drain's
               (the span of the admitted records), CPU per start is park + drain;
  priority     conc50 with an age-mode priority (-600..600 s) ordering the queue;
  depth        the gate's CPU per start with 1,000, 10,000 and 100,000 starts queued
               (`--depths`, default those <= --starts): see below.

The engine (`bench.gate_engine`, for singleton, conc50, conc1, steps, priority) is a raw
confluent-kafka consumer/producer in its own process writing the SDK's RunEvent records
(its docstring says why not the SDK); its CPU is reported apart from the worker's.

Each measurement is a fresh worker (and engine) on fresh topics (a namespace of its own):

  1. warm-up: `--warmup` starts of the scenario, committed, and waited for until every one
     has its final decision (idem: this spends the keys the measured starts repeat;
     rl-drop: it spends the keys' one admission);
  2. throughput: `--starts` starts produced inside one open transaction and committed at
     once, so the warmed worker finds them all waiting; the phase ends when every start
     has its final decision on the ledger (admitted, existing, dropped, collapsed) and
     the admitted records the scenario must write are there (steps: the re-admissions
     too). starts/s = starts / (the last of those records' CreateTime - the first
     ledger or admitted record's of the phase); CPU µs/start = the worker's user + system
     CPU from the commit until it has done everything the phase gave it (its group
     committed to the end of every topic it reads: the last runs' reports and releases
     come after the last decision), librdkafka's threads included (the engine's apart).
     The outcome is checked: the count of each final decision and of admitted records
     must be what the scenario produces, no start decided twice, else the table shows the
     error, not a figure. Who had the CPUs from the commit to the last decision is shown
     too (`CPU % in the phase`: each worker process, the engine, this process, the rest
     (the broker and whatever else runs), idle; 100 is one CPU);
     out/start counts every record the worker wrote in the phase, on every topic (stage
     topics, changelogs, ledger, admitted, runs), against raw-io's three;
  3. latency: `--latency-seconds` of starts (5 s; at most `--latency-starts` of them)
     produced at half the rate phase 2 measured, by an SDK-like producer; decision
     latency = the admitted record's CreateTime (for a start decided without an
     admission: its final ledger record's) - the start record's CreateTime; visible
     latency = when this process's read_committed reader got that record - the same;
     and the worker's CPU per start during it (steady arrivals, against the backlog's).
     A debounced start's latency holds its 1s period; pause and depth have none.

With an engine, when the phases are over, the most runs one key had in flight (the
engine's lower bound from the records' times: bench/gate_engine.py) must be within the
key's limit (concurrency, singleton), else the measurement fails.

depth: no engine; the warm-up admits 1,000 starts that hold the key's 1,000 slots. For each
depth D, starts are added until D are queued, then a window of 1,000: 1,000 more starts
arrive (queued behind the D) while this process reports 1,000 of the held runs
`started` and `completed`, so 1,000 queued starts are admitted in their place; the queue
stays between D and D + 1,000. CPU per start = the worker's CPU over the window / 1,000:
each start's arrival and queueing, a run's end, its slot's release and the next start's
admission ("queueing alone": the CPU per start of the starts added to reach D). A cost
that grows with D is a scan proportional to the queue (SPEC.md section 5).

Every worker's idle CPU (a second with nothing arriving, after the warm-up, and again
after the throughput phase) is reported too (`idle worker N% CPU (M% after the phase)`): a
slow phase's CPU per start holds that much per second, and a loop whose cost grows with
the state the phase left shows as M > N.

Every measurement is repeated `--repeats` times (interleaved: raw-io, then each scenario's
worker and worker-base) and the median reported, after one discarded raw-io round that
warms a fresh broker's JVM. The broker is `SLUICEGATE_BOOTSTRAP` if set, else a local
Kafka started on free ports with a temporary data dir and stopped at the end. `--pin`:
a worker of one process on the last CPU; the broker, the engine and this process on the
others; a worker of several processes runs on every CPU (`--pin`'s help says why).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from bench import gate_apps
from bench.apps import WORKFLOW as RAW_WORKFLOW
from bench.apps import app as raw_app
from bench.controls_micro import ENGINE_MODE, RL_DROP_KEYS, payload
from bench.passthrough import (
    CLK_TCK,
    OutputReader,
    SystemProcess,
    broker,
    default_faust_python,
    delete_topics,
    median_of,
    process_cpu_s,
    produce_all,
    produce_committed,
    sdk_producer_config,
    wait_committed,
    wait_reached,
)
from bench.records import StartMaker, admission_sizes
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.ops.localkafka.processes import free_ports
from sluicegate.ops.services.control import write_control
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    ControlRow,
    LedgerRecord,
    Outcome,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import ROUTED_STAGES, Topics

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("passthrough", "idem", "rl-admit", "rl-drop", "throttle", "throttles", "debounce",
             "batch", "singleton", "conc50", "conc1", "steps", "pause", "priority", "depth")
DEPTHS = (1_000, 10_000, 100_000)
DEPTH_SLOTS = 1_000  # bench.gate_apps' `depth` limit: the runs held, and the window
BATCH_SIZE = 10
# The module name bench/gate_apps.py is copied to beside every worker (a baseline tree's
# own `bench` package, first on its path, has no gate_apps).
APPS_MODULE = "sg_bench_gate_apps"
# A worker's log lines (INFO) saying which partitions it holds and when each is restored.
ASSIGNED = re.compile(r"assigned partitions \[([\d, ]*)\]")
LET_GO = re.compile(r"partitions \[[\d, ]*\] (revoked|lost)")
READY = re.compile(r"partition (\d+) ready")


# -- the input -----------------------------------------------------------------------------


class Start(NamedTuple):
    request_id: str
    key: bytes
    value: bytes


class Inputs:
    """Starts built as the SDK builds them (`StartBuilder`: validated, keyed, encoded)."""

    def __init__(self, scenario: str, scale: int, warm: int) -> None:
        self.scenario = scenario
        self.scale = scale
        self.warm = warm
        self.builder = StartBuilder(gate_apps.app_for(scenario), Settings())

    def build(self, phase: str, n: int) -> list[Start]:
        out = []
        for i in range(n):
            start, key = self.builder.build(
                self.scenario, payload(self.scenario, phase, i, self.scale, self.warm))
            out.append(Start(start.request_id, key, codec.encode(start)))
        return out


def expected(scenario: str, phase: str, n: int) -> tuple[Counter[str], int]:
    """The final decisions `n` starts of `phase` must get, and the admitted records."""
    if scenario == "idem":
        return (Counter(admitted=n), n) if phase == "w" else (Counter(existing=n), 0)
    if scenario == "rl-drop":
        if phase == "w":
            first = min(RL_DROP_KEYS, n)
            return Counter(admitted=first, dropped=n - first), first
        return Counter(dropped=n), 0
    if scenario == "batch":
        runs = math.ceil(n / BATCH_SIZE)
        return Counter(admitted=runs, collapsed=n - runs), runs
    if scenario == "steps":
        return Counter(admitted=n), 2 * n
    return Counter(admitted=n), n


# -- what the worker decided ------------------------------------------------------------------


class Process(Protocol):
    def check_alive(self) -> None: ...


class DecisionReader:
    """Reads the ledger and the admitted topic read_committed from their ends when made,
    in a thread: the final decision of each wanted request (outcome, CreateTime, receive
    time), its admitted record's times, `queued` rows, and the admitted records."""

    def __init__(self, settings: Settings, wanted: set[str]) -> None:
        topics = Topics(settings)
        self.ledger, self.admitted = topics.ledger, topics.admitted
        self.consumer = Consumer(settings.client_config(**{
            "group.id": f"bench-decisions-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
            # Said once per partition reached: `wait_live` knows the reader fetches.
            "enable.partition.eof": True,
        }))
        assigned = [TopicPartition(topic, p, o) for topic in (self.ledger, self.admitted)
                    for p, o in high_watermarks(settings, topic).items()]
        self.consumer.assign(assigned)
        self.partitions = len(assigned)
        self.reached: set[tuple[str | None, int | None]] = set()
        self.wanted = wanted
        self.final: dict[str, tuple[str, int, float]] = {}
        self.admitted_at: dict[str, tuple[int, float]] = {}
        self.queued: dict[str, int] = {}
        self.outcomes: Counter[str] = Counter()
        self.admitted_records = 0  # of wanted requests, and every re-admission (resume)
        self.admitted_ids: list[tuple[str, int]] = []  # every admitted record's (id, time)
        self.duplicates = 0
        self.first_ms = math.inf  # the phase's first ledger or admitted record
        self.last_ms = 0  # its last final decision or admitted record
        self.first_admitted_ms = math.inf
        self.last_admitted_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self.consumer.poll(0.1)
            if first is None:
                continue
            now = time.time() * 1000
            for msg in [first, *self.consumer.consume(10_000, timeout=0)]:
                value = msg.value()
                error = msg.error()
                if error is None and value is not None:
                    self._take(msg.topic(), value, msg.timestamp()[1], now)
                elif error is not None and error.code() == KafkaError._PARTITION_EOF:
                    self.reached.add((msg.topic(), msg.partition()))

    def wait_live(self, timeout: float) -> None:
        """Until the reader has fetched to the end of every partition once (see
        `OutputReader.wait_live`): a latency phase starts only then."""
        wait_reached(self.reached, self.partitions, timeout)

    def _take(self, topic: str | None, value: bytes, ts: int, now: float) -> None:
        if topic == self.ledger:
            row = codec.decode(LedgerRecord, value)
            rid = row.request_id
            if rid not in self.wanted:
                return
            self.first_ms = min(self.first_ms, ts)
            if row.outcome is Outcome.queued:
                self.queued.setdefault(rid, ts)
            elif rid in self.final:
                self.duplicates += 1
            else:
                self.final[rid] = (row.outcome.value, ts, now)
                self.outcomes[row.outcome.value] += 1
                self.last_ms = max(self.last_ms, ts)
            return
        admitted = codec.decode(AdmittedStart, value)
        self.admitted_ids.append((admitted.execution_id, ts))
        mine = [r for r in admitted.request_ids if r in self.wanted]
        if not mine and admitted.kind is not AdmittedKind.resume:
            return
        self.admitted_records += 1
        for rid in mine:
            self.admitted_at.setdefault(rid, (ts, now))
        self.first_ms, self.last_ms = min(self.first_ms, ts), max(self.last_ms, ts)
        self.first_admitted_ms = min(self.first_admitted_ms, ts)
        self.last_admitted_ms = max(self.last_admitted_ms, ts)

    def wait(self, done: Callable[[], bool], timeout: float, procs: Sequence[Process],
             what: str) -> float:
        """Until `done()`; returns when (monotonic)."""
        deadline = time.monotonic() + timeout
        while not done():
            for proc in procs:
                proc.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not done after {timeout:.0f}s: {self.status()}")
            time.sleep(0.02)
        return time.monotonic()

    def wait_decided(self, n: int, records: int, timeout: float, procs: Sequence[Process],
                     what: str) -> float:
        return self.wait(lambda: len(self.final) >= n and self.admitted_records >= records,
                         timeout, procs, what)

    def wait_seen(self, timeout: float, procs: Sequence[Process], what: str, *,
                  parked: int = 0, queued: int = 0, admitted: int = 0) -> float:
        """Until `parked` requests are queued or decided, `queued` are queued, and
        `admitted` admitted records (any request's) have been read."""
        return self.wait(lambda: len(self.queued) + len(self.final) >= parked
                         and len(self.queued) >= queued and len(self.admitted_ids) >= admitted,
                         timeout, procs, what)

    def status(self) -> str:
        return (f"{len(self.final)} decided {dict(self.outcomes)}, {len(self.queued)} queued,"
                f" {self.admitted_records} admitted records, {self.duplicates} duplicates")

    def check(self, want: Counter[str], records: int) -> str | None:
        """None when the outcome is what the scenario must produce, else what is wrong."""
        if self.outcomes != want or self.admitted_records != records or self.duplicates:
            return (f"outcome {dict(self.outcomes)} with {self.admitted_records} admitted "
                    f"records and {self.duplicates} duplicate decisions; want {dict(want)} "
                    f"with {records} admitted records")
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()


# -- the processes ----------------------------------------------------------------------------


# Each worker process's partitions: (how many assignments its log shows, the last one).
Assignment = tuple[tuple[int, tuple[int, ...]], ...]


class GateProcess(SystemProcess):
    """bench.passthrough's system under test, running a scenario's declarations: one
    process, or `processes` workers in one group (each its own state dir, so its own
    worker id), as bench.passthrough runs them."""

    def __init__(self, system: str, settings: Settings, workdir: Path, apps_dir: Path,
                 scenario: str, baseline_tree: Path | None = None,
                 sizes: dict[str, int] | None = None, cpus: set[int] | None = None,
                 processes: int = 1) -> None:
        super().__init__(system, settings, workdir, default_faust_python(), None,
                         baseline_tree, sizes, processes, cpus)
        self.apps_dir = apps_dir
        self.scenario = scenario
        # A worker serves its metrics: its commit-time histogram is read around each phase.
        self.metrics_ports = free_ports(processes) if system.startswith("worker") else []

    def process_args(self, i: int) -> list[str]:
        return ["--metrics-port", str(self.metrics_ports[i])] if self.metrics_ports else []

    def commit_times(self) -> CommitTimes:
        """Every process's commits so far, and how long they took (the worker's own
        `sluicegate_worker_commit_seconds`: changelog records, flush, offsets, commit, store
        write)."""
        total = CommitTimes()
        for port in self.metrics_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as rsp:
                total = total + CommitTimes.parse(rsp.read().decode())
        return total

    def command(self) -> tuple[list[str], dict[str, str]]:
        cmd, env = super().command()
        if self.system.startswith("worker"):
            cmd[cmd.index("bench.apps")] = f"{APPS_MODULE}:{self.scenario}"
            # INFO: a worker's few lines on its partitions (`assignment`), none per record.
            cmd[cmd.index("WARNING")] = "INFO"
            env["PYTHONPATH"] = f"{self.apps_dir}{os.pathsep}{env['PYTHONPATH']}"
        return cmd, env

    def assignment(self) -> Assignment | None:
        """Each process's assignments so far and its partitions, once every process holds
        its share (every partition once among them) with each restored; else None."""
        held = []
        for log in self.logs:
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            moves = [i for i, line in enumerate(lines)
                     if ASSIGNED.search(line) or LET_GO.search(line)]
            found = ASSIGNED.search(lines[moves[-1]]) if moves else None
            if found is None:
                return None  # not in the group yet, or between a revoke and its assignment
            mine = tuple(int(p) for p in found.group(1).split(",") if p.strip())
            ready = {int(m.group(1)) for line in lines[moves[-1] + 1:]
                     if (m := READY.search(line))}
            if not mine or not ready.issuperset(mine):
                return None
            held.append((sum(bool(ASSIGNED.search(lines[i])) for i in moves), mine))
        if sorted(p for _, mine in held for p in mine) != list(range(self.settings.partitions)):
            return None  # some process's line is from before the last rebalance
        return tuple(held)

    def wait_assigned(self, timeout: float, settle: float = 0.5) -> Assignment:
        """Until every process has its partitions, restored, and that for `settle` s."""
        deadline = time.monotonic() + timeout
        seen: Assignment | None = None
        while True:
            now = self.assignment()
            if now is not None and now == seen:
                return now
            seen = now
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.system}: its {self.processes} processes did not all "
                                   f"have their partitions restored in {timeout:.0f}s")
            time.sleep(settle)


class EngineProcess:
    """`bench.gate_engine` in its own process (this tree's, whichever worker it serves)."""

    def __init__(self, settings: Settings, mode: str, workdir: Path) -> None:
        self.settings = settings
        self.mode = mode
        self.log = workdir / "engine.log"
        self.report = workdir / "engine-in-flight.json"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        s = self.settings
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.gate_engine", "--bootstrap", s.bootstrap,
                 "--namespace", s.namespace, "--group", f"{s.namespace}engine",
                 "--mode", self.mode, "--report", str(self.report)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def in_flight(self) -> dict[str, dict[str, Any]]:
        """Stopped, the most runs one key of each stage had in flight (bench.gate_engine)."""
        self.stop()
        if not self.report.exists():
            raise RuntimeError("the engine wrote no in-flight report:\n"
                               + self.log.read_text(errors="replace")[-3000:])
        found: dict[str, dict[str, Any]] = json.loads(self.report.read_text())
        return found

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid) if self.proc is not None else 0.0

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"engine exited with {self.proc.returncode}:\n"
                               + self.log.read_text(errors="replace")[-3000:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# -- measurements ---------------------------------------------------------------------------


@dataclass
class Measurement:
    scenario: str
    system: str  # raw-io | worker | worker-base
    repeat: int
    processes: int = 1  # the system's processes, in one group
    starts: int = 0
    starts_per_s: float = 0.0  # starts / the span of the phase's records' CreateTimes
    wall_starts_per_s: float = 0.0  # starts / (input committed -> last decision seen)
    cpu_us_per_start: float = 0.0  # the worker's (raw-io's) user + system CPU, all processes
    engine_cpu_us_per_start: float | None = None
    outputs_per_start: float = 0.0  # records written per start, on every topic
    outputs_by_topic: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    admitted_records: int = 0
    latency_rate: float = 0.0  # starts/s during the latency phase
    # CPU per start during the latency phase (steady arrivals at latency_rate, against
    # a backlog's in cpu_us_per_start; it holds the idle loop's CPU too)
    steady_cpu_us_per_start: float | None = None
    latency_n: int = 0
    decision_ms: dict[str, float] = field(default_factory=dict)
    visible_ms: dict[str, float] = field(default_factory=dict)
    loadavg: float = 0.0  # the machine's 1-minute load before the throughput phase
    # pause: park/drain; depth: per D; steady: CPU shares in the phase, most in flight
    extra: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Options:
    starts: int
    warmup: int
    latency_starts: int
    latency_seconds: float
    depths: tuple[int, ...]
    timeout: float
    baseline_tree: Path | None
    sizes: dict[str, int]
    apps_dir: Path
    keep_topics: bool = False
    logs: Path | None = None
    system_cpus: set[int] | None = None
    latency_rate: float | None = None  # starts/s of the latency phase; None: half the max


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": ordered[-1]}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def machine_cpu_s() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the machine, every CPU summed (/proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return ((user + nice + system + irq + softirq + steal) / CLK_TCK,
            (idle + iowait) / CLK_TCK)


def open_producer(settings: Settings) -> Producer:
    producer = Producer(sdk_producer_config(settings, **{
        "transactional.id": f"bench-input-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": 600_000}))
    producer.init_transactions(30.0)
    producer.begin_transaction()
    return producer


def pairs(starts: Sequence[Start]) -> list[tuple[bytes, bytes]]:
    return [(s.key, s.value) for s in starts]


def produce_paced(producer: Producer, topic: str, starts: Sequence[Start],
                  rate: float) -> tuple[dict[str, int], float]:
    """Produce at `rate`/s (or as fast as this process can, if slower); returns request id
    -> the start record's CreateTime, and the rate reached."""
    produced: dict[str, int] = {}

    def delivered(rid: str, err: KafkaError | None, msg: Any) -> None:
        if err is None:
            produced[rid] = msg.timestamp()[1]

    t0 = time.monotonic()
    for i, start in enumerate(starts):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        while True:
            try:
                producer.produce(topic, start.value, start.key,
                                 on_delivery=functools.partial(delivered, start.request_id))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    reached = len(starts) / max(1e-6, time.monotonic() - t0)
    producer.flush(60.0)
    return produced, min(rate, reached)


def high_watermarks(settings: Settings, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """`OutputReader.high_watermarks`, asked again while the topic's partitions have no
    leader yet (just after the topics are made)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return OutputReader.high_watermarks(settings, topic)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def topic_ends(settings: Settings, timeout: float = 60.0) -> dict[tuple[str, int], int]:
    """(topic, partition) -> high watermark, for every topic of the namespace (asked again
    while some partition has no leader yet)."""
    names = [spec.name for spec in Topics(settings).specs()]
    consumer = Consumer(settings.client_config(**{
        "group.id": "bench-watermarks", "isolation.level": "read_uncommitted"}))
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                found = consumer.list_topics(timeout=10).topics
                if all(t in found for t in names):
                    return {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p),
                                                                   timeout=10)[1]
                            for t in names for p in found[t].partitions}
            except KafkaException:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the topics of {settings.namespace} are not ready")
            time.sleep(0.2)
    finally:
        consumer.close()


def count_records(settings: Settings, before: dict[tuple[str, int], int],
                  after: dict[tuple[str, int], int], timeout: float = 120.0) -> dict[str, int]:
    """The data records written between two `topic_ends` (transaction markers take offsets
    but are no records: read, read_uncommitted, and counted)."""
    ranges = {tp: (before.get(tp, 0), end) for tp, end in after.items()
              if end > before.get(tp, 0)}
    counts: Counter[str] = Counter()
    if not ranges:
        return {}
    consumer = Consumer(settings.client_config(**{
        "group.id": f"bench-count-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_uncommitted", "enable.partition.eof": True}))
    try:
        consumer.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in ranges.items()])
        pending = set(ranges)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"counting records: {len(pending)} partitions unread")
            for msg in consumer.consume(10_000, timeout=0.2):
                tp = (msg.topic() or "", msg.partition() or 0)
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(tp)
                    continue
                hi = ranges[tp][1]
                offset = msg.offset() or 0
                if offset < hi:
                    counts[tp[0]] += 1
                else:
                    pending.discard(tp)
        return dict(counts)
    finally:
        consumer.close()


def worker_outputs(counts: dict[str, int], topics: Topics) -> int:
    """What the worker wrote: everything but the input and the engine's reports."""
    return sum(n for t, n in counts.items() if t not in (topics.starts, topics.run_events))


@dataclass(frozen=True)
class CommitTimes:
    """A commit-time histogram (`sluicegate_worker_commit_seconds`) as of one moment:
    commits, their total seconds, and the commits within each bucket's bound (cumulative,
    as Prometheus keeps them). Two of them subtract to the commits between."""

    count: float = 0.0
    seconds: float = 0.0
    within: tuple[tuple[float, float], ...] = ()

    _LINE = re.compile(r'^sluicegate_worker_commit_seconds_(bucket\{le="([^"]+)"\}|count|sum)'
                       r" (\S+)$")

    @classmethod
    def parse(cls, text: str) -> CommitTimes:
        count = seconds = 0.0
        within: list[tuple[float, float]] = []
        for line in text.splitlines():
            found = cls._LINE.match(line)
            if found is None:
                continue
            kind, bound, value = found.groups()
            if kind == "count":
                count = float(value)
            elif kind == "sum":
                seconds = float(value)
            else:
                within.append((float(bound), float(value)))
        return cls(count, seconds, tuple(within))

    def __add__(self, other: CommitTimes) -> CommitTimes:
        return self._combined(other, 1)

    def since(self, before: CommitTimes) -> CommitTimes:
        return self._combined(before, -1)

    def _combined(self, other: CommitTimes, sign: int) -> CommitTimes:
        """This histogram with `other`'s counts added (`sign` 1) or taken away (-1); an
        empty one (no metrics read yet) changes nothing."""
        if not other.within:
            return self
        if not self.within:
            return CommitTimes(sign * other.count, sign * other.seconds,
                               tuple((b, sign * n) for b, n in other.within))
        return CommitTimes(self.count + sign * other.count,
                           self.seconds + sign * other.seconds,
                           tuple((b, n + sign * m) for (b, n), (_, m)
                                 in zip(self.within, other.within, strict=True)))

    def summary(self) -> dict[str, float]:
        """Commits, their mean in ms, how many took over 250 ms, and the bucket bound the
        99th percentile is within (ms; inf past the last bound)."""
        if self.count <= 0:
            return {}
        over = self.count - dict(self.within).get(0.25, self.count)
        p99 = next((b for b, n in self.within if n >= 0.99 * self.count), math.inf)
        return {"commits": self.count, "commit_mean_ms": self.seconds / self.count * 1000,
                "commits_over_250ms": over, "commit_p99_within_ms": p99 * 1000}


class Usage(NamedTuple):
    """CPU seconds so far: `shares` of a phase from two of them."""

    at: float  # monotonic
    workers: list[float]  # each worker process's
    engine: float
    bench: float  # this process's: the producer, the readers
    busy: float  # the machine's, every CPU summed
    idle: float


def shares(before: Usage, after: Usage) -> dict[str, float]:
    """Who had the CPUs between two `Usage`s, in % of one CPU: each worker process, the
    engine, this process, the rest (the broker, anything else running), and idle."""
    wall = max(1e-6, after.at - before.at)
    out = {f"cpu_pct_worker{i}": (b - a) / wall * 100
           for i, (a, b) in enumerate(zip(before.workers, after.workers, strict=True))}
    out["cpu_pct_engine"] = (after.engine - before.engine) / wall * 100
    out["cpu_pct_bench"] = (after.bench - before.bench) / wall * 100
    out["cpu_pct_rest"] = (after.busy - before.busy) / wall * 100 - sum(out.values())
    out["cpu_pct_idle"] = (after.idle - before.idle) / wall * 100
    return out


class Run:
    """One measurement's namespace, processes and clean-up."""

    def __init__(self, scenario: str, system: str, repeat: int, base: Settings,
                 opts: Options, workdir: Path, processes: int = 1) -> None:
        self.settings = base.with_(namespace=f"gate{uuid.uuid4().hex[:6]}.")
        self.topics = Topics(self.settings)
        self.opts = opts
        self.result = Measurement(scenario, system, repeat, processes)
        self.rundir = workdir / self.settings.namespace.rstrip(".")
        self.rundir.mkdir(parents=True)
        create_topics(self.settings)
        topic_ends(self.settings)  # until every partition has a leader
        # --pin gives one process the last CPU; several may run on every CPU (see --pin's
        # help). Said explicitly: a child inherits this process's affinity, which --pin
        # set to the other CPUs.
        cpus = opts.system_cpus
        if cpus is not None and processes > 1:
            cpus = set(range(os.cpu_count() or 1))
        self.system = GateProcess(system, self.settings, self.rundir, opts.apps_dir, scenario,
                                  opts.baseline_tree, opts.sizes, cpus, processes)
        mode = ENGINE_MODE.get(scenario) if system != "raw-io" else None
        self.engine = EngineProcess(self.settings, mode, self.rundir) if mode else None
        self.procs: list[Process] = [self.system, *([self.engine] if self.engine else [])]
        self.assigned: Assignment | None = None

    def start(self) -> None:
        """The system and the engine; a worker's phases begin once each of its processes
        has its partitions, restored."""
        self.system.start()
        if self.engine is not None:
            self.engine.start()
        if self.system.system.startswith("worker"):
            self.assigned = self.system.wait_assigned(self.opts.timeout)

    def cpu(self) -> tuple[float, float]:
        return self.system.cpu_s(), self.engine.cpu_s() if self.engine else 0.0

    def usage(self) -> Usage:
        return Usage(time.monotonic(), [process_cpu_s(pid) for pid in self.system.pids],
                     self.engine.cpu_s() if self.engine else 0.0, process_cpu_s(os.getpid()),
                     *machine_cpu_s())

    def quiet(self, window: float = 0.3) -> tuple[float, float]:
        """Wait until the worker has done everything it was given (a phase's last decision
        can come before its trailing work: the last runs' reports, their releases), and
        return (worker, engine) CPU as of then: every partition its group consumes
        committed to its end (past it, transaction markers only: one, or one per worker
        process writing to it, read to tell), and nothing moving for `window` seconds.
        Partitions the group never committed are not its (a worker of today does not
        read the admitted topic back)."""
        t = self.topics
        names = [t.starts, t.run_events, t.admitted, *(t.stage(s) for s in ROUTED_STAGES)]
        consumer = Consumer(self.settings.client_config(**{
            "group.id": self.system.group, "enable.auto.commit": False}))
        deadline = time.monotonic() + self.opts.timeout
        try:
            found = consumer.list_topics(timeout=10).topics
            tps = [TopicPartition(n, p) for n in names if n in found
                   for p in found[n].partitions]
            seen: tuple[Any, ...] | None = None
            cpu = self.cpu()
            while True:
                committed = [tp.offset for tp in consumer.committed(tps, timeout=10)]
                highs = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
                state = (committed, highs)
                if state == seen:
                    # More than one offset past the committed one: several processes'
                    # markers, or records still to read (counted: none, or not done).
                    gaps = [((tp.topic, tp.partition), c, h)
                            for tp, c, h in zip(tps, committed, highs, strict=True)
                            if c >= 0 and h - c > 1]
                    if not gaps or not count_records(self.settings,
                                                     {tp: c for tp, c, _ in gaps},
                                                     {tp: h for tp, _, h in gaps}):
                        self.check_assignment()
                        return cpu
                else:
                    seen, cpu = state, self.cpu()
                for proc in self.procs:
                    proc.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the worker did not go quiet in {self.opts.timeout}s")
                time.sleep(window)
        finally:
            consumer.close()

    def check_assignment(self) -> None:
        """No rebalance since `start`: a phase measured across one is not the gate's."""
        if self.assigned is not None and self.system.assignment() != self.assigned:
            raise RuntimeError(f"the worker group rebalanced during the run: "
                               f"{self.assigned} -> {self.system.assignment()}")

    def finish(self) -> Measurement:
        self.system.stop()
        if self.engine is not None:
            self.engine.stop()
        if self.opts.logs is not None:
            self.opts.logs.mkdir(parents=True, exist_ok=True)
            for log in (*self.system.logs, self.engine.log if self.engine else None):
                if log is not None and log.exists():
                    shutil.copy(log, self.opts.logs / f"{self.rundir.name}.{log.name}")
        if not self.opts.keep_topics:
            delete_topics(self.settings)
        return self.result

    def fail(self, exc: BaseException) -> None:
        self.result.error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            self.result.error += "\n" + self.system.log_tail(15)


def measure(scenario: str, system: str, repeat: int, base: Settings, opts: Options,
            workdir: Path, processes: int = 1) -> Measurement:
    try:
        run = Run(scenario, system, repeat, base, opts, workdir, processes)
    except Exception as exc:  # the topics could not be made, or the like
        return Measurement(scenario, system, repeat, processes,
                           error=f"{type(exc).__name__}: {exc}")
    try:
        if system == "raw-io":
            raw_io(run)
        elif scenario == "pause":
            paused(run)
        elif scenario == "depth":
            depth(run)
        else:
            steady(run)
    except Exception as exc:
        run.fail(exc)
    return run.finish()


# -- raw-io ---------------------------------------------------------------------------------


def raw_io(run: Run) -> None:
    opts, settings, system, r = run.opts, run.settings, run.system, run.result
    maker = StartMaker(raw_app)
    counter = iter(range(10**12))

    def batch(n: int) -> list[Start]:
        made = [maker.make(RAW_WORKFLOW, next(counter)) for _ in range(n)]
        return [Start(key.decode(), key, value) for key, value in made]

    measured = batch(opts.starts)
    run.start()
    latency_producer = Producer(sdk_producer_config(settings))
    warm = batch(opts.warmup)
    ends = produce_committed(settings, run.topics.starts, pairs(warm[100:]))
    for p, end in produce_all(latency_producer, run.topics.starts, pairs(warm[:100])).items():
        ends[p] = max(ends.get(p, 0), end)
    wait_committed(settings, system.group, run.topics.starts, ends, system, opts.timeout)

    before = topic_ends(settings)
    producer = open_producer(settings)
    ends = produce_all(producer, run.topics.starts, pairs(measured))
    r.loadavg = loadavg()
    cpu0 = system.cpu_s()
    t_commit = time.monotonic()
    producer.commit_transaction(60.0)
    readable_ms = time.time() * 1000
    t_done = wait_committed(settings, system.group, run.topics.starts, ends, system,
                            opts.timeout, step=0.02)
    cpu1 = system.cpu_s()
    last = 0.0
    for topic in system.outputs:
        reader = OutputReader(settings, topic)
        reader.wanted = {s.key for s in measured}
        reader.until_complete(opts.timeout, system)
        times = [reader.seen[k][0] for k in reader.wanted]
        last = max(last, max(times))
        reader.close()
    after = topic_ends(settings)
    r.starts = opts.starts
    r.starts_per_s = opts.starts / max(1e-3, (last - readable_ms) / 1000)
    r.wall_starts_per_s = opts.starts / (t_done - t_commit)
    r.cpu_us_per_start = (cpu1 - cpu0) / opts.starts * 1e6
    r.outcomes = {"piped": opts.starts}

    rate, n = latency_plan(opts, r.starts_per_s)
    lat = batch(n)
    out = OutputReader(settings, system.output, high_watermarks(settings, system.output))
    out.wanted = {s.key for s in lat}
    out.start()
    out.wait_live(opts.timeout)
    cpu0 = system.cpu_s()
    produced, rate = produce_paced(latency_producer, run.topics.starts, lat, rate)
    out.until_complete(opts.timeout, system)
    r.steady_cpu_us_per_start = (system.cpu_s() - cpu0) / n * 1e6
    out.close()
    keyed = {s.key: s.request_id for s in lat}
    seen = {keyed[k]: v for k, v in out.seen.items() if k in keyed}
    set_latency(r, rate, produced, {rid: t for rid, t in seen.items()})
    r.outputs_by_topic = count_records(settings, before, after)
    r.outputs_per_start = worker_outputs(r.outputs_by_topic, run.topics) / opts.starts


def latency_plan(opts: Options, max_rate: float) -> tuple[float, int]:
    """Half the measured rate (or `--latency-rate`); `--latency-starts`, or fewer to stay
    within `--latency-seconds`."""
    rate = opts.latency_rate or max(1.0, max_rate / 2)
    return rate, max(1, min(opts.latency_starts, int(rate * opts.latency_seconds)))


def set_latency(r: Measurement, rate: float, produced: dict[str, int],
                seen: dict[str, tuple[int, float]]) -> None:
    matched = [rid for rid in produced if rid in seen]
    r.latency_rate = rate
    r.latency_n = len(matched)
    r.decision_ms = percentiles([float(seen[rid][0] - produced[rid]) for rid in matched])
    r.visible_ms = percentiles([seen[rid][1] - produced[rid] for rid in matched])


# -- the worker's scenarios --------------------------------------------------------------------


def commit_summary(r: Measurement, phase: str, commits: CommitTimes) -> None:
    r.extra.update({f"{phase}_{k}": v for k, v in commits.summary().items()})


def warm_up(run: Run, inputs: Inputs, producer: Producer) -> None:
    """`--warmup` starts, committed, and some from the latency phase's producer (its first
    records would otherwise wait for its producer id), all decided."""
    n = run.opts.warmup
    warm = inputs.build("w", n)
    reader = DecisionReader(run.settings, {s.request_id for s in warm})
    try:
        produce_committed(run.settings, run.topics.starts, pairs(warm[100:]))
        produce_all(producer, run.topics.starts, pairs(warm[:100]))
        want, records = expected(inputs.scenario, "w", n)
        reader.wait_decided(n, records, run.opts.timeout, run.procs, "warm-up")
        problem = reader.check(want, records)
        if problem is not None:
            raise RuntimeError(f"warm-up: {problem}")
    finally:
        reader.close()
    run.quiet()


def idle_cpu(run: Run, name: str = "idle_cpu_pct", seconds: float = 1.0) -> None:
    """The worker's CPU while nothing arrives (its loop, timers, the control table), as a
    share of one CPU: what a slow phase's CPU per start holds besides the starts."""
    cpu0, _ = run.cpu()
    time.sleep(seconds)
    cpu1, _ = run.cpu()
    run.result.extra[name] = (cpu1 - cpu0) / seconds * 100


def steady(run: Run) -> None:
    opts, settings, r, scenario = run.opts, run.settings, run.result, run.result.scenario
    inputs = Inputs(scenario, opts.starts, opts.warmup)
    measured = inputs.build("m", opts.starts)  # built first: it costs this process CPU
    run.start()
    latency_producer = Producer(sdk_producer_config(settings))
    warm_up(run, inputs, latency_producer)
    idle_cpu(run)

    # Throughput: the whole input waits in one open transaction, then appears at once.
    want, records = expected(scenario, "m", opts.starts)
    reader = DecisionReader(settings, {s.request_id for s in measured})
    before = topic_ends(settings)
    producer = open_producer(settings)
    produce_all(producer, run.topics.starts, pairs(measured))
    r.loadavg = loadavg()
    cpu0, engine0 = run.cpu()
    usage0 = run.usage()
    commits0 = run.system.commit_times()
    t_commit = time.monotonic()
    producer.commit_transaction(60.0)
    readable_ms = time.time() * 1000
    try:
        t_done = reader.wait_decided(opts.starts, records, opts.timeout, run.procs,
                                     "throughput")
        r.extra.update(shares(usage0, run.usage()))
        cpu1, engine1 = run.quiet()
        commit_summary(r, "throughput", run.system.commit_times().since(commits0))
        after = topic_ends(settings)
    finally:
        reader.close()
    # Idle again, with the phase's state behind it: a loop whose cost grows with the
    # state shows here.
    idle_cpu(run, "idle_after_cpu_pct")
    r.starts = opts.starts
    # From the moment the starts could be read to the last decision written: a gate's
    # first decisions come only after its identity stage has read them, which a window
    # from the first decision would leave out (and did, for a start that crossed a second
    # topic to its control: bench/NOTES.md, 2026-12-05).
    r.starts_per_s = opts.starts / max(1e-3, (reader.last_ms - readable_ms) / 1000)
    r.wall_starts_per_s = opts.starts / (t_done - t_commit)
    r.cpu_us_per_start = (cpu1 - cpu0) / opts.starts * 1e6
    if run.engine is not None:
        r.engine_cpu_us_per_start = (engine1 - engine0) / opts.starts * 1e6
    r.outcomes = dict(reader.outcomes)
    r.admitted_records = reader.admitted_records
    r.extra["queued_on_arrival"] = len(reader.queued)
    problem = reader.check(want, records)
    if problem is not None:
        raise RuntimeError(problem)

    # Latency at half the rate just measured.
    rate, n = latency_plan(opts, r.starts_per_s)
    if scenario == "batch":
        n = max(BATCH_SIZE, n - n % BATCH_SIZE)  # full batches only
    lat = inputs.build("l", n)
    want, records = expected(scenario, "l", n)
    reader = DecisionReader(settings, {s.request_id for s in lat})
    try:
        reader.wait_live(opts.timeout)
        cpu0, _ = run.cpu()
        commits0 = run.system.commit_times()
        t0 = time.monotonic()
        produced, rate = produce_paced(latency_producer, run.topics.starts, lat, rate)
        r.extra["latency_decided_s"] = reader.wait_decided(n, records, opts.timeout,
                                                           run.procs, "latency") - t0
        cpu1, _ = run.quiet()
        r.extra["latency_quiet_s"] = time.monotonic() - t0
        commit_summary(r, "latency", run.system.commit_times().since(commits0))
    finally:
        reader.close()
    r.steady_cpu_us_per_start = (cpu1 - cpu0) / n * 1e6
    seen = {rid: reader.admitted_at.get(rid, (ts, now))
            for rid, (_, ts, now) in reader.final.items()}
    set_latency(r, rate, produced, seen)
    problem = reader.check(want, records)
    if problem is not None:
        raise RuntimeError(f"latency phase: {problem}")
    r.outputs_by_topic = count_records(settings, before, after)
    r.outputs_per_start = worker_outputs(r.outputs_by_topic, run.topics) / opts.starts
    if run.engine is not None:
        check_in_flight(run.engine, r)


def slot_limits(scenario: str) -> dict[str, int]:
    """stage -> the most runs one of its keys may have in flight (bench/gate_apps.py)."""
    wf = gate_apps.app_for(scenario).workflows[scenario]
    limits = {"concurrency": wf.concurrency[0].limit} if wf.concurrency else {}
    if wf.singleton is not None:
        limits["singleton"] = 1
    return limits


def check_in_flight(engine: EngineProcess, r: Measurement) -> None:
    """The engine stopped, no key had more runs in flight than its limit, over the whole
    run (a lower bound of what the worker had: bench/gate_engine.py)."""
    limits = slot_limits(r.scenario)
    for stage, most in engine.in_flight().items():
        if stage not in limits:
            continue
        r.extra[f"in_flight_max_{stage}"] = most["max"]
        r.extra[f"in_flight_limit_{stage}"] = limits[stage]
        if most["max"] > limits[stage]:
            raise RuntimeError(f"{most['max']} runs of {stage} key {most['key']!r} in flight "
                               f"at once; its limit is {limits[stage]}")


def paused(run: Run) -> None:
    opts, settings, r, scenario = run.opts, run.settings, run.result, run.result.scenario
    inputs = Inputs(scenario, opts.starts, opts.warmup)
    measured = inputs.build("m", opts.starts)
    run.start()
    producer = Producer(sdk_producer_config(settings))
    warm_up(run, inputs, producer)
    idle_cpu(run)

    def control(paused: bool) -> None:
        write_control(settings, ControlRow(workflow=scenario, paused=paused,
                                           at_ms=int(time.time() * 1000),
                                           reason="bench.gate", by="bench.gate"))

    control(True)
    # Probes until one is parked on every partition of the input: every worker process
    # has read the pause row (a probe admitted before that does not count; a parked one
    # drains with the rest and is not counted).
    n = settings.partitions
    parked: set[int] = set()
    for attempt in range(300):
        probes: dict[int, Start] = {}
        for probe in inputs.build(f"p{attempt}-", 8 * n):
            probes.setdefault(partition_for(probe.key, n), probe)
        for p in parked:
            probes.pop(p, None)
        reader = DecisionReader(settings, {s.request_id for s in probes.values()})
        try:
            produce_all(producer, run.topics.starts, pairs(list(probes.values())))
            reader.wait_seen(opts.timeout, run.procs, "pause probes", parked=len(probes))
        finally:
            reader.close()
        parked |= {p for p, s in probes.items() if s.request_id in reader.queued}
        if len(parked) == n:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"the pause applied on partitions {sorted(parked)} only")

    want, records = expected(scenario, "m", opts.starts)
    reader = DecisionReader(settings, {s.request_id for s in measured})
    try:
        before = topic_ends(settings)
        tx = open_producer(settings)
        produce_all(tx, run.topics.starts, pairs(measured))
        r.loadavg = loadavg()
        cpu0, _ = run.cpu()
        tx.commit_transaction(60.0)
        reader.wait_seen(opts.timeout, run.procs, "parking", parked=opts.starts)
        cpu1, _ = run.quiet()
        if reader.final:
            raise RuntimeError(f"decided while paused: {reader.status()}")
        parked_first, parked_last = reader.first_ms, max(reader.queued.values())
        cpu2, _ = run.cpu()
        t_unpause = time.time() * 1000
        control(False)
        reader.wait_decided(opts.starts, records, opts.timeout, run.procs, "drain")
        cpu3, _ = run.quiet()
        after = topic_ends(settings)
    finally:
        reader.close()
    r.starts = opts.starts
    drain_s = max(1e-3, (reader.last_admitted_ms - reader.first_admitted_ms) / 1000)
    r.starts_per_s = opts.starts / drain_s
    r.wall_starts_per_s = opts.starts / max(1e-3, (reader.last_ms - t_unpause) / 1000)
    r.cpu_us_per_start = ((cpu1 - cpu0) + (cpu3 - cpu2)) / opts.starts * 1e6
    r.outcomes = dict(reader.outcomes)
    r.admitted_records = reader.admitted_records
    r.extra = {
        "park_starts_per_s": opts.starts / max(1e-3, (parked_last - parked_first) / 1000),
        "park_cpu_us_per_start": (cpu1 - cpu0) / opts.starts * 1e6,
        "drain_cpu_us_per_start": (cpu3 - cpu2) / opts.starts * 1e6,
        "unpause_to_first_admission_ms": reader.first_admitted_ms - t_unpause,
    }
    problem = reader.check(want, records)
    if problem is not None:
        raise RuntimeError(problem)
    r.outputs_by_topic = count_records(settings, before, after)
    r.outputs_per_start = worker_outputs(r.outputs_by_topic, run.topics) / opts.starts


def depth(run: Run) -> None:
    opts, settings, r, scenario = run.opts, run.settings, run.result, run.result.scenario
    inputs = Inputs(scenario, opts.starts, opts.warmup)
    run.start()
    # The warm-up: DEPTH_SLOTS starts admitted, holding every slot (no engine ends them).
    held_starts = inputs.build("h", DEPTH_SLOTS)
    reader = DecisionReader(settings, {s.request_id for s in held_starts})
    try:
        produce_committed(settings, run.topics.starts, pairs(held_starts))
        reader.wait_decided(DEPTH_SLOTS, DEPTH_SLOTS, opts.timeout, run.procs, "slots")
    finally:
        reader.close()
    run.quiet()
    held = [eid for eid, _ in reader.admitted_ids]
    idle_cpu(run)
    events = Producer(sdk_producer_config(settings))
    r.loadavg = loadavg()
    queued = 0
    for d in opts.depths:
        fill = inputs.build(f"f{d}-", d - queued)
        reader = DecisionReader(settings, {s.request_id for s in fill})
        try:
            tx = open_producer(settings)
            produce_all(tx, run.topics.starts, pairs(fill))
            cpu0, _ = run.cpu()
            tx.commit_transaction(60.0)
            reader.wait_seen(opts.timeout, run.procs, f"filling the queue to {d}",
                             queued=len(fill))
            cpu1, _ = run.quiet()
        finally:
            reader.close()
        # A start's arrival and queueing alone (the window adds its admission).
        r.extra[f"queue_cpu_us_per_start@{d}"] = (cpu1 - cpu0) / len(fill) * 1e6
        if reader.final:
            raise RuntimeError(f"filling to {d}: {reader.status()}")
        queued = d
        window = inputs.build(f"x{d}-", DEPTH_SLOTS)
        ending, held = held[:DEPTH_SLOTS], held[DEPTH_SLOTS:]
        reader = DecisionReader(settings, {s.request_id for s in window})
        try:
            tx = open_producer(settings)
            produce_all(tx, run.topics.starts, pairs(window))
            cpu0, _ = run.cpu()
            tx.commit_transaction(60.0)
            now = int(time.time() * 1000)
            produce_all(events, run.topics.run_events, [
                (eid.encode(), codec.encode(RunEvent(execution_id=eid, workflow=scenario,
                                                     kind=kind, at_ms=now)))
                for eid in ending for kind in (RunEventKind.started, RunEventKind.completed)])
            reader.wait_seen(opts.timeout, run.procs, f"the window at depth {d}",
                             queued=DEPTH_SLOTS, admitted=DEPTH_SLOTS)
            cpu1, _ = run.quiet()
        finally:
            reader.close()
        if reader.final or len(reader.admitted_ids) != DEPTH_SLOTS:
            raise RuntimeError(f"window at depth {d}: {len(reader.admitted_ids)} admitted "
                               f"records, want {DEPTH_SLOTS}; {reader.status()}")
        held += [eid for eid, _ in reader.admitted_ids]
        times = [ts for _, ts in reader.admitted_ids] + list(reader.queued.values())
        r.extra[f"cpu_us_per_start@{d}"] = (cpu1 - cpu0) / DEPTH_SLOTS * 1e6
        r.extra[f"starts_per_s@{d}"] = DEPTH_SLOTS / max(1e-3,
                                                         (max(times) - min(times)) / 1000)
    r.starts = DEPTH_SLOTS * len(opts.depths)
    r.outcomes = {"admitted": DEPTH_SLOTS * len(opts.depths)}
    deepest = opts.depths[-1]
    r.cpu_us_per_start = r.extra[f"cpu_us_per_start@{deepest}"]
    r.starts_per_s = r.extra[f"starts_per_s@{deepest}"]


# -- the report -----------------------------------------------------------------------------


def _median(ok: list[Measurement], get: Callable[[Measurement], float | None]) -> float:
    return median_of([v for v in map(get, ok) if v is not None])


def label(system: str, processes: int) -> str:
    """A system's name in the report: `worker x2` for two processes in one group."""
    return system if processes == 1 else f"{system} x{processes}"


def summarise(results: list[Measurement]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((m.scenario, m.system, m.processes) for m in results))
    raw_rate = median_of([m.starts_per_s for m in results
                          if m.system == "raw-io" and m.error is None])
    for scenario, system, processes in keys:
        runs = [m for m in results
                if (m.scenario, m.system, m.processes) == (scenario, system, processes)]
        ok = [m for m in runs if m.error is None]
        row: dict[str, Any] = {"scenario": scenario, "system": system,
                               "processes": processes, "label": label(system, processes),
                               "runs": len(ok), "errors": [m.error for m in runs if m.error]}
        rows.append(row)
        if not ok:
            continue
        rate = _median(ok, lambda m: m.starts_per_s)
        row.update({
            "starts_per_s": rate,
            "all_starts_per_s": [round(m.starts_per_s) for m in ok],
            "vs_raw_io": rate / raw_rate if raw_rate else None,
            "wall_starts_per_s": _median(ok, lambda m: m.wall_starts_per_s),
            "cpu_us_per_start": _median(ok, lambda m: m.cpu_us_per_start),
            "engine_cpu_us_per_start": (_median(ok, lambda m: m.engine_cpu_us_per_start)
                                        if ok[0].engine_cpu_us_per_start is not None
                                        else None),
            "outputs_per_start": _median(ok, lambda m: m.outputs_per_start),
            "latency_rate": (_median([m for m in ok if m.latency_n], lambda m: m.latency_rate)
                             if ok[0].latency_n else None),
            "steady_cpu_us_per_start": (_median(ok, lambda m: m.steady_cpu_us_per_start)
                                        if ok[0].steady_cpu_us_per_start is not None
                                        else None),
            "outcomes": ok[0].outcomes,
            "admitted_records": ok[0].admitted_records,
            "decision_ms": {}, "visible_ms": {}, "extra": {},
        })
        for kind in ("decision_ms", "visible_ms"):
            for p in ("p50", "p95", "p99"):
                values = [getattr(m, kind)[p] for m in ok if p in getattr(m, kind)]
                if values:
                    row[kind][p] = median_of(values)
        for name in ok[0].extra:
            row["extra"][name] = median_of([m.extra[name] for m in ok if name in m.extra])
    return rows


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def triple(d: dict[str, float]) -> str:
    if not d:
        return "-"
    return " / ".join(fmt(d.get(p), 0 if d.get(p, 0) >= 10 else 1) for p in ("p50", "p95", "p99"))


def outcome_text(row: dict[str, Any]) -> str:
    if not row["runs"]:
        return "**ERROR** " + row["errors"][0].splitlines()[0][:160]
    text = ", ".join(f"{n:,} {o}" for o, n in sorted(row["outcomes"].items()))
    extra = row.get("extra", {})
    if row["scenario"] == "pause":
        text += (f"; park {fmt(extra.get('park_starts_per_s'))}/s, unpause -> first "
                 f"admission {fmt(extra.get('unpause_to_first_admission_ms'))} ms")
    elif extra.get("queued_on_arrival"):
        text += f" ({fmt(extra['queued_on_arrival'])} queued first)"
    for stage in ("concurrency", "singleton"):
        if f"in_flight_max_{stage}" in extra:
            text += (f"; most in flight per {stage} key {fmt(extra[f'in_flight_max_{stage}'])}"
                     f" (limit {fmt(extra[f'in_flight_limit_{stage}'])})")
    if "idle_cpu_pct" in extra:
        text += f"; idle worker {fmt(extra['idle_cpu_pct'])}% CPU"
        if "idle_after_cpu_pct" in extra:
            text += f" ({fmt(extra['idle_after_cpu_pct'])}% after the phase)"
    commits = [f"{phase} {fmt(extra[f'{phase}_commits'])} at "
               f"{fmt(extra[f'{phase}_commit_mean_ms'])} ms mean, "
               f"{fmt(extra[f'{phase}_commits_over_250ms'])} over 250 ms"
               for phase in ("throughput", "latency") if f"{phase}_commits" in extra]
    if commits:
        text += "; commits: " + ", ".join(commits)
    workers = [extra[f"cpu_pct_worker{i}"] for i in range(row["processes"])
               if f"cpu_pct_worker{i}" in extra]
    if workers:
        text += (f"; CPU % in the phase: worker {' + '.join(fmt(w) for w in workers)}, "
                 f"engine {fmt(extra['cpu_pct_engine'])}, bench {fmt(extra['cpu_pct_bench'])}"
                 f", rest (broker) {fmt(extra['cpu_pct_rest'])}, idle "
                 f"{fmt(extra['cpu_pct_idle'])} of {100 * (os.cpu_count() or 1)}")
    if row["errors"]:
        text += f"; {len(row['errors'])} run(s) FAILED: {row['errors'][0].splitlines()[0][:120]}"
    return text


def report(rows: list[dict[str, Any]], opts: Options, loads: list[float]) -> str:
    lines = [
        "| scenario | system | starts/s (runs) | vs raw-io | CPU µs/start | engine CPU "
        "µs/start | out/start | latency at /s | CPU µs/start at that rate | decision p50 / "
        "p95 / p99 ms | visible p50 / p95 / p99 ms | outcome per run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        if row["scenario"] == "depth":
            continue
        if not row["runs"]:
            lines.append(f"| {row['scenario']} | {row['label']} | - | - | - | - | - | - | - "
                         f"| - | - | {outcome_text(row)} |")
            continue
        runs = "; ".join(f"{v:,}" for v in row["all_starts_per_s"])
        ratio = row.get("vs_raw_io")
        vs = "-" if not ratio else f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"
        lines.append(
            f"| {row['scenario']} | {row['label']} | **{fmt(row['starts_per_s'])}** ({runs}) "
            f"| {vs} | {fmt(row['cpu_us_per_start'], 1)} "
            f"| {fmt(row['engine_cpu_us_per_start'], 1)} | {fmt(row['outputs_per_start'], 2)} "
            f"| {fmt(row['latency_rate'])} | {fmt(row['steady_cpu_us_per_start'], 1)} "
            f"| {triple(row['decision_ms'])} "
            f"| {triple(row['visible_ms'])} | {outcome_text(row)} |")
    deep = [row for row in rows if row["scenario"] == "depth"]
    if deep:
        lines += ["", f"The gate's CPU per start with starts queued (depth: one key, "
                      f"{DEPTH_SLOTS:,} slots held, windows of {DEPTH_SLOTS:,}):", "",
                  "| system | " + " | ".join(f"{d:,} queued" for d in opts.depths) + " |",
                  "| --- |" + " --- |" * len(opts.depths)]
        for row in deep:
            if not row["runs"]:
                lines.append(f"| {row['label']} | {outcome_text(row)} |"
                             + " |" * (len(opts.depths) - 1))
                continue
            extra = row.get("extra", {})
            lines.append(f"| {row['label']} | " + " | ".join(
                f"**{fmt(extra.get(f'cpu_us_per_start@{d}'), 1)}** µs/start "
                f"({fmt(extra.get(f'queue_cpu_us_per_start@{d}'), 1)} queueing alone), "
                f"{fmt(extra.get(f'starts_per_s@{d}'))}/s" for d in opts.depths) + " |")
    if loads:
        lines.append(f"\nmachine load (1 min) before the throughput phases: "
                     f"{min(loads):.1f} .. {max(loads):.1f}; {os.cpu_count()} CPUs")
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated subset of " + ",".join(SCENARIOS))
    parser.add_argument("--starts", type=int, default=100_000,
                        help="starts in each throughput measurement")
    parser.add_argument("--warmup", type=int, default=2_000)
    # A phase of a fixed time, not count: at half the passthrough's rate 5,000 starts took
    # a third of a second, three or four commits, and its p99 was the first cycle's.
    parser.add_argument("--latency-starts", type=int, default=100_000,
                        help="at most this many starts in a latency phase")
    parser.add_argument("--latency-seconds", type=float, default=5.0,
                        help="at most this long a latency phase (fewer starts if slower)")
    parser.add_argument("--latency-rate", type=float, default=None, metavar="PER_S",
                        help="starts/s of the latency phase (default: half the measured rate)")
    parser.add_argument("--depths", default=None,
                        help="queue depths of the depth scenario (default: 1000,10000,100000"
                             " up to --starts)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                        help="a source tree (e.g. `git archive` of an older commit, its "
                             "_speedups*.so copied in) whose worker runs as worker-base")
    parser.add_argument("--partitions", type=int, default=Settings().partitions)
    parser.add_argument("--timeout", type=float, default=600.0, help="per phase, seconds")
    parser.add_argument("--keep-topics", action="store_true")
    parser.add_argument("--logs", type=Path, default=None, metavar="DIR",
                        help="keep each worker's and engine's log in DIR")
    parser.add_argument("--no-warmup-round", dest="warmup_round", action="store_false",
                        help="skip the discarded raw-io round that warms the broker up")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the table here")
    parser.add_argument("--processes", default="1", metavar="N[,N...]",
                        help="worker processes in the worker's (and worker-base's) group, "
                             "each count measured in turn: 1,2 shows both side by side "
                             "(`worker x2`); raw-io stays one process")
    parser.add_argument("--pin", action="store_true",
                        help="one worker process on the last CPU; the broker, the engine and"
                             " this process on the others. Several worker processes are not "
                             "pinned (they may use every CPU, the last one theirs alone): "
                             "all on the last CPU could not run at once, and on a 2-CPU "
                             "machine one per CPU would put one beside the broker and the "
                             "other alone, an uneven split that would be read as the group's")
    args = parser.parse_args()

    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    if args.warmup < 100:
        parser.error("--warmup must be at least 100")
    if "batch" in scenarios and (args.starts % BATCH_SIZE or args.warmup % BATCH_SIZE):
        parser.error(f"batch: --starts and --warmup must be multiples of {BATCH_SIZE}")
    depths = (tuple(int(d) for d in args.depths.split(",")) if args.depths
              else tuple(d for d in DEPTHS if d <= args.starts) or DEPTHS[:1])
    if list(depths) != sorted(set(depths)):
        parser.error("--depths must increase")
    try:
        counts = [int(n) for n in args.processes.split(",") if n]
    except ValueError:
        parser.error("--processes: comma-separated counts, say 1,2")
    if not counts or not all(1 <= n <= args.partitions for n in counts):
        parser.error(f"--processes: counts from 1 to --partitions ({args.partitions}): a "
                     f"process beyond that would have no partition")
    systems = ["worker"] + (["worker-base"] if args.baseline_tree is not None else [])
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-gate-")))
        apps_dir = tmp / "apps"
        apps_dir.mkdir()
        # A copy, so an edit to bench/gate_apps.py during the run changes nothing.
        shutil.copy(ROOT / "bench" / "gate_apps.py", apps_dir / f"{APPS_MODULE}.py")
        opts = Options(args.starts, args.warmup, args.latency_starts, args.latency_seconds,
                       depths, args.timeout, args.baseline_tree,
                       admission_sizes(raw_app, RAW_WORKFLOW), apps_dir, args.keep_topics,
                       args.logs, latency_rate=args.latency_rate)
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                parser.error("--pin needs at least 2 CPUs")
            os.sched_setaffinity(0, cpus[:-1])  # before the broker starts: it inherits it
            opts = dataclasses.replace(opts, system_cpus={cpus[-1]})
        print(f"bench.gate: {args.starts:,} starts x {args.repeats} repeats; scenarios "
              f"{scenarios}; systems raw-io + {systems} with {counts} processes; "
              f"{os.cpu_count()} CPUs"
              + (f", a lone worker pinned to CPU {sorted(opts.system_cpus)}"
                 if opts.system_cpus else ""), flush=True)
        bootstrap = stack.enter_context(broker())
        print(f"broker: {bootstrap}", flush=True)
        base = Settings(bootstrap=bootstrap, partitions=args.partitions,
                        state_dir=tmp / "state")
        results: list[Measurement] = []
        if args.warmup_round:
            warm = dataclasses.replace(opts, starts=min(opts.starts, 20_000))
            m = measure("raw-io", "raw-io", -1, base, warm, tmp)
            print(f"  raw-io warm-up round (discarded): "
                  f"{m.error.splitlines()[0] if m.error else f'{m.starts_per_s:,.0f}/s'}",
                  flush=True)
        for repeat in range(args.repeats):
            plan = [("raw-io", "raw-io", 1)] + [(s, sys_, n) for s in scenarios
                                                for sys_ in systems for n in counts]
            for scenario, system, processes in plan:
                t0 = time.monotonic()
                m = measure(scenario, system, repeat, base, opts, tmp, processes)
                results.append(m)
                status = m.error.splitlines()[0] if m.error else (
                    f"{m.starts_per_s:,.0f} starts/s, {m.cpu_us_per_start:.1f} CPU µs/start"
                    + (f" (engine {m.engine_cpu_us_per_start:.1f})"
                       if m.engine_cpu_us_per_start is not None else "")
                    + (f", decision p50/p99 {m.decision_ms.get('p50', 0):.0f}/"
                       f"{m.decision_ms.get('p99', 0):.0f} ms at {m.latency_rate:,.0f}/s"
                       if m.latency_n else "")
                    + (f", {json.dumps({k: round(v, 1) for k, v in m.extra.items()})}"
                       if m.extra else ""))
                print(f"  {scenario:11s} {label(system, processes):14s} run {repeat}: {status} "
                      f"[{time.monotonic() - t0:.0f}s]", flush=True)
    rows = summarise(results)
    loads = [m.loadavg for m in results if m.error is None and m.loadavg]
    table = report(rows, opts, loads)
    print()
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({
            "starts": args.starts, "repeats": args.repeats, "scenarios": scenarios,
            "systems": ["raw-io", *systems], "processes": counts, "depths": list(depths),
            "baseline_tree": str(args.baseline_tree) if args.baseline_tree else None,
            "loadavg": {"min": min(loads, default=0.0), "max": max(loads, default=0.0),
                        "at_end": loadavg()},
            "summary": rows, "runs": [asdict(m) for m in results]}, indent=2))


if __name__ == "__main__":
    main()
