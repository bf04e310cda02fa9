"""The passthrough benchmark: sluicegate's worker against a raw exactly-once pipe, on one broker.

    .venv/bin/python -m bench.passthrough --starts 100000

In one run, on the same broker and with the same input (StartRequests encoded as the SDK
encodes them), one system at a time (the machine has 2 cores):

  (a) raw     `bench.rawpipe`: confluent-kafka consume -> produce, transactional, the
              worker's client settings and commit interval, one output per input;
  (a') raw-io the same pipe writing, per input, the records an admission writes: one to
              the admitted topic, one to the ledger, one to the runs table, each of the
              size the worker writes (the I/O any passthrough must do);
  floor       the raw-io pipe admitting each start with sluicegate's own pieces and no
              runtime (`bench.floor`): decode, validate, execution id, the three records
              built and encoded, the run looked up and written to RocksDB; the least any
              passthrough in Python does, so the worker's distance from it is its own
              orchestration;
  bound       the floor with the three records' bytes made at no cost (`bench.floor.Bound`):
              the most that building and encoding them in C could reach;
  (b) worker  `python -m sluicegate worker --app bench.apps`: identity -> passthrough,
              exactly once (an admitted record, a ledger record and a runs-table row per
              start; the phase ends when all three exist);
  (c) faust   `bench.faust_pipe`: the same pipe as a faust-streaming agent, exactly once,
              in its own virtualenv (`--faust-python`; skipped when it is missing).

Each measurement runs a fresh process against fresh topics (a namespace of its own):

  1. warm-up: `--warmup` starts, committed, and waited for (the process joins the group,
     initialises its producer, and runs its code paths);
  2. latency: `--latency-starts` starts produced at `--latency-rate`/s by an SDK-like
     producer while this process reads the output; produce-to-output latency is the output
     record's CreateTime (and, separately, the time this reader got it) minus the start
     record's CreateTime, both from the broker's records;
  3. throughput: `--starts` starts are produced inside one open transaction (invisible to
     read_committed consumers) and then committed at once, so the warmed system finds its
     whole input waiting; starts/s = starts / (the last output's CreateTime - the first
     output's), over every output the system writes per start.

Every measurement is repeated `--repeats` times (interleaved a, b, c, a, b, c, ...) and
the median is reported. The broker is `SLUICEGATE_BOOTSTRAP` if set; otherwise a local
Kafka (`sluicegate.ops.localkafka`) is started on free ports with a temporary data dir
and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.apps import WORKFLOW, app
from bench.records import StartMaker, admission_sizes
from sluicegate.config import Settings
from sluicegate.ops.localkafka.broker import ensure_broker, stop_broker
from sluicegate.ops.localkafka.processes import free_ports
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.topology.admin import create_topics
from sluicegate.topology.keys import execution_id_for, plain_execution_id
from sluicegate.topology.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = ("raw", "raw-io", "floor", "bound", "worker", "worker-base", "faust")
# Where a faust-streaming virtualenv is looked for (bench/README.md says how to make one).
FAUST_PYTHONS = (ROOT / "bench" / ".venv-faust" / "bin" / "python",
                 Path("/tmp/venv-faust/bin/python"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- measurements ------------------------------------------------------------------------


@dataclass
class Measurement:
    system: str
    repeat: int
    starts: int = 0
    starts_per_s: float = 0.0  # outputs / (last output CreateTime - first)
    wall_starts_per_s: float = 0.0  # starts / (input committed -> offsets committed)
    cpu_us_per_start: float = 0.0  # the process's user+sys CPU during the throughput phase
    latency_n: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    e2e_latency_ms: dict[str, float] = field(default_factory=dict)
    outputs_per_start: float = 0.0
    unexpected_outputs: int = 0  # outputs of no start of the latency phase, or duplicates
    unexpected_from_warmup: int = 0  # of those, outputs of warm-up starts
    loadavg: float = 0.0  # the machine's 1-minute load before the throughput phase
    error: str | None = None


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": ordered[-1]}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its threads (librdkafka's too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- the systems under test ----------------------------------------------------------------


class SystemProcess:
    """One system under test, in its own process, on its own namespace's topics."""

    def __init__(self, system: str, settings: Settings, workdir: Path, faust_python: Path,
                 py_spy: Path | None, baseline_tree: Path | None = None,
                 sizes: dict[str, int] | None = None, processes: int = 1,
                 cpus: set[int] | None = None) -> None:
        self.system = system
        self.cpus = cpus
        self.processes = processes
        self.settings = settings
        self.topics = Topics(settings)
        self.workdir = workdir
        self.faust_python = faust_python
        self.py_spy = py_spy
        self.baseline_tree = baseline_tree
        # One log per process: several processes' lines in one file could not be told apart.
        self.logs = [workdir / f"{system}.log"] if processes == 1 else [
            workdir / f"{system}-{i}.log" for i in range(processes)]
        self.log = self.logs[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.output = self.topics.admitted
        # Every topic the system writes per start, each with its size for raw-io.
        self.sizes = sizes or {}
        self.outputs = [self.output]
        if system.startswith("worker") or system in ("raw-io", "floor", "bound"):
            self.outputs = [self.topics.admitted, self.topics.ledger, self.topics.runs]
        if system.startswith("worker"):
            self.group = self.topics.group
        elif system.startswith("raw") or system in ("floor", "bound"):
            self.group = f"{settings.namespace}rawpipe"
        else:
            self.group = f"{settings.namespace}faust"

    def command(self) -> tuple[list[str], dict[str, str]]:
        s = self.settings
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        if self.system == "worker-base":
            # The same worker from another source tree (say, the commit before a change),
            # measured in the same run: before/after on the same broker and machine load.
            assert self.baseline_tree is not None
            env["PYTHONPATH"] = f"{self.baseline_tree}{os.pathsep}{ROOT}"
        if self.system.startswith("worker"):
            env.update({
                "SLUICEGATE_BOOTSTRAP": s.bootstrap,
                "SLUICEGATE_NAMESPACE": s.namespace,
                "SLUICEGATE_PARTITIONS": str(s.partitions),
                "SLUICEGATE_STATE_DIR": str(self.workdir / "state"),
                "SLUICEGATE_COMMIT_INTERVAL_MS": str(s.commit_interval_ms),
                "SLUICEGATE_COMMIT_MAX_RECORDS": str(s.commit_max_records),
            })
            return [sys.executable, "-m", "sluicegate", "worker", "--app", "bench.apps",
                    "--log-level", "WARNING"], env
        if self.system in ("floor", "bound"):
            return [sys.executable, "-m", "bench.rawpipe", "--bootstrap", s.bootstrap,
                    "--input", self.topics.starts, "--group", self.group,
                    "--floor", s.namespace, "--state-dir", str(self.workdir / self.system),
                    *(["--bound"] if self.system == "bound" else [])], env
        if self.system.startswith("raw"):
            outputs = [self.output] if self.system == "raw" else [
                f"{topic}:{self.sizes[kind]}" for topic, kind in zip(
                    self.outputs, ("admitted", "ledger", "runs"), strict=True)]
            return [sys.executable, "-m", "bench.rawpipe", "--bootstrap", s.bootstrap,
                    "--input", self.topics.starts, "--group", self.group,
                    *(arg for out in outputs for arg in ("--output", out))], env
        env.update({
            "BENCH_BOOTSTRAP": s.bootstrap,
            "BENCH_INPUT": self.topics.starts,
            "BENCH_OUTPUT": self.output,
            "BENCH_APP_ID": self.group,
            "BENCH_DATADIR": str(self.workdir / "faust-data"),
            "BENCH_PARTITIONS": str(s.partitions),
            "BENCH_COMMIT_INTERVAL_MS": str(s.commit_interval_ms),
            "BENCH_COMPRESSION": "lz4",
        })
        return [str(self.faust_python), "-m", "bench.faust_pipe"], env

    def start(self) -> None:
        cmd, env = self.command()
        if self.cpus is not None:
            # Every thread of the process (librdkafka's too) stays on these CPUs.
            cmd = ["taskset", "-c", ",".join(map(str, sorted(self.cpus))), *cmd]
        # `python -m` puts the working directory first on sys.path: it picks the tree.
        cwd = self.baseline_tree if self.system == "worker-base" else ROOT
        for i in range(self.processes):
            # Several processes of one system share its consumer group (workers: each with
            # a state dir of its own, as separate machines would have).
            if self.system.startswith("worker"):
                env = {**env, "SLUICEGATE_STATE_DIR": str(self.workdir / f"state-{i}")}
            with open(self.logs[i], "ab") as log:
                self.procs.append(subprocess.Popen([*cmd, *self.process_args(i)], cwd=cwd,
                                                   env=env, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def process_args(self, i: int) -> list[str]:
        """Arguments of the system's process `i` beside the command's."""
        return []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids)

    def check_alive(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.system} exited with {proc.returncode}:\n"
                                   + self.log_tail())

    def stop(self) -> None:
        running = [proc for proc in self.procs if proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        tails = ["\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                 if log.exists() else "" for log in self.logs]
        if len(tails) == 1:
            return tails[0]
        return "\n".join(f"-- process {i}:\n{tail}" for i, tail in enumerate(tails))

    def output_key(self, request_id: bytes, topic: str | None = None) -> bytes:
        """The key the system writes a start's output under (on `topic`, else the first)."""
        if (self.system.startswith("worker") or self.system in ("floor", "bound")) \
                and topic != self.topics.ledger:
            if not self.placed_ids:
                return plain_execution_id(WORKFLOW, request_id.decode()).encode()
            # The bench's starts are keyed by request id: identity decides on its partition.
            n = self.settings.partitions
            return execution_id_for(WORKFLOW, request_id.decode(),
                                    partition_for(request_id, n), n).encode()
        return request_id

    @functools.cached_property
    def placed_ids(self) -> bool:
        """Whether this worker's execution ids are placed on their partition
        (docs/decisions/placed-execution-ids.md); a baseline tree from before is not."""
        if self.system != "worker-base":
            return True
        assert self.baseline_tree is not None
        # Wherever that tree keeps it: the module moved with the layout.
        probe = ("import importlib, inspect\n"
                 "for name in ('sluicegate.topology.keys', 'sluicegate.admission.decisions',"
                 " 'sluicegate.streams.decisions'):\n"
                 "    try:\n"
                 "        f = importlib.import_module(name).execution_id_for\n"
                 "    except (ImportError, AttributeError):\n"
                 "        continue\n"
                 "    print(len(inspect.signature(f).parameters))\n"
                 "    break\n")
        found = subprocess.run([sys.executable, "-c", probe], cwd=self.baseline_tree,
                               capture_output=True, text=True, check=True)
        return int(found.stdout) == 4


# -- producing input -----------------------------------------------------------------------


def sdk_producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    # The SDK client's own producer settings (sluicegate.client.producer.Client).
    return settings.client_config(**{"partitioner": "murmur2_random",
                                     "enable.idempotence": True, "linger.ms": 2, **extra})


def produce_all(producer: Producer, topic: str,
                records: list[tuple[bytes, bytes]]) -> dict[int, int]:
    """Produce and flush; returns partition -> the offset after its last record."""
    ends: dict[int, int] = {}
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            p = msg.partition()
            ends[p] = max(ends.get(p, 0), msg.offset() + 1)

    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120.0) or errors:
        raise RuntimeError(f"producing the input failed: {errors[:3]}")
    return ends


def produce_committed(settings: Settings, topic: str,
                      records: list[tuple[bytes, bytes]]) -> dict[int, int]:
    producer = Producer(sdk_producer_config(settings, **{
        "transactional.id": f"bench-input-{uuid.uuid4().hex[:8]}",
        "transaction.timeout.ms": 600_000}))
    producer.init_transactions(30.0)
    producer.begin_transaction()
    ends = produce_all(producer, topic, records)
    producer.commit_transaction(60.0)
    return ends


def wait_committed(settings: Settings, group: str, topic: str, ends: dict[int, int],
                   system: SystemProcess, timeout: float, step: float = 0.05) -> float:
    """Wait until `group` has committed at least `ends` on `topic`; returns when it saw it."""
    consumer = Consumer(settings.client_config(**{"group.id": group,
                                                  "enable.auto.commit": False}))
    tps = [TopicPartition(topic, p) for p in sorted(ends)]
    deadline = time.monotonic() + timeout
    try:
        while True:
            committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
            if all(committed.get(p, -1) >= end for p, end in ends.items()):
                return time.monotonic()
            system.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.system}: committed {committed}, want {ends}")
            time.sleep(step)
    finally:
        consumer.close()


def reads_back(settings: Settings, group: str, topic: str) -> bool:
    """Whether `group` has committed offsets on `topic` (the warm-up made it, if it reads
    the topic at all)."""
    consumer = Consumer(settings.client_config(**{"group.id": group,
                                                  "enable.auto.commit": False}))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        return any(tp.offset >= 0 for tp in consumer.committed(tps, timeout=10))
    finally:
        consumer.close()


def data_ends(settings: Settings, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Partition -> the offset after its last committed data record (transaction markers
    take offsets too, one per transaction, so the high watermark overshoots)."""
    consumer = Consumer(settings.client_config(**{
        "group.id": f"bench-ends-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed"}))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                 for p in meta.partitions}
        ends = {p: 0 for p in highs}
        # The last few offsets hold the last data record of each transaction writer.
        consumer.assign([TopicPartition(topic, p, max(0, high - 20))
                         for p, high in highs.items() if high])
        deadline = time.monotonic() + timeout
        while any(consumer.position([TopicPartition(topic, p)])[0].offset < high
                  for p, high in highs.items() if high):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the end of {topic}")
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    ends[msg.partition()] = max(ends[msg.partition()], (msg.offset() or 0) + 1)
        return ends
    finally:
        consumer.close()


def wait_reached(reached: set[tuple[str | None, int | None]], partitions: int,
                 timeout: float) -> None:
    """Until `reached` (filled by a reader's thread with each partition whose end it
    reached) holds `partitions` partitions."""
    deadline = time.monotonic() + timeout
    while len(reached) < partitions:
        if time.monotonic() > deadline:
            raise TimeoutError(f"a reader reached the end of {len(reached)} of {partitions} "
                               f"partitions in {timeout:.0f}s")
        time.sleep(0.01)


class OutputReader:
    """Reads a topic read_committed from given offsets, keeping (CreateTime, receive time)
    of the records whose key is wanted. Runs in a thread when `start()`ed."""

    def __init__(self, settings: Settings, topic: str, offsets: dict[int, int] | None = None
                 ) -> None:
        self.consumer = Consumer(settings.client_config(**{
            "group.id": f"bench-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
            # Said once per partition reached: `wait_live` knows the reader fetches.
            "enable.partition.eof": True,
        }))
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        if offsets is None:
            offsets = {p: 0 for p in meta.partitions}
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        self.partitions = len(offsets)
        self.reached: set[tuple[str | None, int | None]] = set()
        self.seen: dict[bytes, tuple[int, float]] = {}
        self.duplicates = 0
        # Every record is kept; completion waits for these keys (None: for `expected` records)
        self.wanted: set[bytes] | None = None
        self.expected = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def high_watermarks(settings: Settings, topic: str) -> dict[int, int]:
        # read_uncommitted: a read_committed client is answered the last stable offset,
        # which stays before a committed transaction's records until the broker has
        # written its marker on that partition; the group's offsets can be visible first,
        # and the warm-up's last outputs would then be read as the latency phase's.
        consumer = Consumer(settings.client_config(**{
            "group.id": "bench-watermarks", "isolation.level": "read_uncommitted"}))
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in meta.partitions}
        finally:
            consumer.close()

    def poll(self, timeout: float = 0.1) -> None:
        # consume(n, timeout) waits for n records or the whole timeout: a receive time
        # would be late by up to the timeout. Wait for one, then take what is there.
        first = self.consumer.poll(timeout)
        if first is None:
            return
        now = time.time() * 1000
        messages = [first, *self.consumer.consume(10_000, timeout=0)]
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self.reached.add((msg.topic(), msg.partition()))
                continue
            key = msg.key() or b""
            if key in self.seen:
                self.duplicates += 1
            else:
                self.seen[key] = (msg.timestamp()[1], now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()

    def start(self) -> None:
        self._thread.start()

    def wait_live(self, timeout: float) -> None:
        """Until the reader has fetched to the end of every partition once: a consumer made a
        moment ago is still connecting and fetching its metadata, and a latency phase
        shorter than that would have every record's receive time late by the rest of it."""
        wait_reached(self.reached, self.partitions, timeout)

    def missing(self) -> int:
        if self.wanted is None:
            return max(0, self.expected - len(self.seen))
        return len(self.wanted - self.seen.keys())

    def until_complete(self, timeout: float, system: SystemProcess) -> None:
        deadline = time.monotonic() + timeout
        while self.missing():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.system}: {self.missing()} outputs missing "
                                   f"after {timeout}s")
            system.check_alive()
            if self._thread.is_alive():
                time.sleep(0.05)
            else:
                self.poll()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.consumer.close()


# -- one measurement ----------------------------------------------------------------------


@dataclass
class Options:
    starts: int
    warmup: int
    latency_starts: int
    latency_rate: float
    repeats: int
    note_bytes: int
    timeout: float
    faust_python: Path
    py_spy: Path | None
    keep_topics: bool
    logs: Path | None
    baseline_tree: Path | None
    sizes: dict[str, int]
    processes: int
    # --pin: the CPUs of the system under test (the broker and this process take the rest)
    system_cpus: set[int] | None = None


def measure(system_name: str, repeat: int, base: Settings, opts: Options, workdir: Path,
            maker: StartMaker) -> Measurement:
    settings = base.with_(namespace=f"bench{uuid.uuid4().hex[:6]}.")
    result = Measurement(system_name, repeat)
    rundir = workdir / settings.namespace.rstrip(".")
    rundir.mkdir(parents=True)
    create_topics(settings)
    topics = Topics(settings)
    system = SystemProcess(system_name, settings, rundir, opts.faust_python, opts.py_spy,
                           opts.baseline_tree, opts.sizes,
                           1 if system_name == "faust" else opts.processes, opts.system_cpus)
    counter = iter(range(10**12))

    def batch(n: int) -> list[tuple[bytes, bytes]]:
        return [maker.make(WORKFLOW, next(counter), opts.note_bytes) for _ in range(n)]

    try:
        # The throughput input is built first: building it costs this process CPU.
        measured = batch(opts.starts)
        system.start()
        # 1. warm-up: group join, transactions initialised, code paths run. The latency
        # phase's producer sends some too: its first records would otherwise wait for its
        # producer id and connections, and count as ~0.5 s of latency.
        latency_producer = Producer(sdk_producer_config(settings))
        warm_batch = batch(opts.warmup)
        ends = produce_committed(settings, topics.starts, warm_batch[100:])
        for p, end in produce_all(latency_producer, topics.starts, warm_batch[:100]).items():
            ends[p] = max(ends.get(p, 0), end)
        wait_committed(settings, system.group, topics.starts, ends, system, opts.timeout)
        warm_keys = {system.output_key(k) for k, _ in warm_batch}

        # 2. latency at a steady, moderate rate.
        if opts.latency_starts:
            reader = OutputReader(settings, system.output,
                                  OutputReader.high_watermarks(settings, system.output))
            reader.expected = opts.latency_starts  # everything after the warm-up
            reader.start()
            reader.wait_live(opts.timeout)
            produced: dict[bytes, int] = {}

            def delivered(err: KafkaError | None, msg: Any) -> None:
                if err is None:
                    produced[system.output_key(msg.key())] = msg.timestamp()[1]

            producer = latency_producer
            t0 = time.monotonic()
            for i in range(opts.latency_starts):
                delay = t0 + i / opts.latency_rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                # Built now, so requested_at_ms is when the request is made, as the SDK's.
                key, value = maker.make(WORKFLOW, next(counter), opts.note_bytes)
                producer.produce(topics.starts, value, key, on_delivery=delivered)
                producer.poll(0)
            producer.flush(30.0)
            reader.wanted = set(produced)
            reader.until_complete(opts.timeout, system)
            reader.close()
            matched = [k for k in reader.seen if k in produced]
            result.unexpected_outputs = len(reader.seen) - len(matched) + reader.duplicates
            result.unexpected_from_warmup = sum(k in warm_keys for k in reader.seen)
            decided = [reader.seen[k][0] - produced[k] for k in matched]
            visible = [reader.seen[k][1] - produced[k] for k in matched]
            result.latency_n = len(decided)
            result.latency_ms = percentiles([float(v) for v in decided])
            result.e2e_latency_ms = percentiles(visible)

        # 3. throughput: the whole input waits in one open transaction, then appears.
        producer = Producer(sdk_producer_config(settings, **{
            "transactional.id": f"bench-input-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 600_000}))
        producer.init_transactions(30.0)
        producer.begin_transaction()
        ends = produce_all(producer, topics.starts, measured)
        spy = start_py_spy(opts.py_spy, system, rundir) if system_name == "worker" else None
        result.loadavg = float(Path("/proc/loadavg").read_text().split()[0])
        cpu0 = system.cpu_s()
        t_commit = time.monotonic()
        producer.commit_transaction(60.0)
        t_done = wait_committed(settings, system.group, topics.starts, ends, system,
                                opts.timeout, step=0.02)
        if system_name.startswith("worker") and reads_back(settings, system.group,
                                                           topics.admitted):
            # A worker before the in-process handover (docs/decisions/in-process-handover.md)
            # reads the admitted starts back to write the runs rows: the work ends when
            # that is done. Since, the runs rows commit with the starts' offsets.
            t_done = wait_committed(settings, system.group, topics.admitted,
                                    data_ends(settings, topics.admitted), system,
                                    opts.timeout, step=0.02)
        cpu1 = system.cpu_s()
        if spy is not None:
            stop_py_spy(spy)
        result.starts = opts.starts
        result.wall_starts_per_s = opts.starts / (t_done - t_commit)
        result.cpu_us_per_start = (cpu1 - cpu0) / opts.starts * 1e6

        first, last, outputs = float("inf"), 0.0, 0
        for topic in system.outputs:
            reader = OutputReader(settings, topic)
            reader.wanted = {system.output_key(k, topic) for k, _ in measured}
            reader.until_complete(opts.timeout, system)
            times = [reader.seen[k][0] for k in reader.wanted]
            first, last = min(first, min(times)), max(last, max(times))
            outputs += len(reader.wanted) + reader.duplicates
            reader.close()
        result.starts_per_s = opts.starts / max(1e-3, (last - first) / 1000)
        result.outputs_per_start = outputs / opts.starts
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            result.error += "\n" + system.log_tail()
    finally:
        system.stop()
        if opts.logs is not None:
            opts.logs.mkdir(parents=True, exist_ok=True)
            for log in system.logs:
                if log.exists():
                    shutil.copy(log, opts.logs / f"{rundir.name}.{log.name}")
        if not opts.keep_topics:
            delete_topics(settings)
    return result


def py_spy_binary() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("--py-spy: no py-spy (`.venv/bin/pip install py-spy`)")
    return found


def start_py_spy(py_spy: Path | None, system: SystemProcess, rundir: Path
                 ) -> subprocess.Popen[bytes] | None:
    if py_spy is None:
        return None
    py_spy.mkdir(parents=True, exist_ok=True)
    out = py_spy / f"{rundir.name}.{system.system}.txt"
    spy = subprocess.Popen(
        [py_spy_binary(), "record", "--pid", str(system.pids[0]),
         "--format", "raw", "--rate", "250", "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return spy


def stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout=30)
    except subprocess.TimeoutExpired:
        spy.kill()


def delete_topics(settings: Settings) -> None:
    admin = AdminClient(settings.client_config())
    names = [spec.name for spec in Topics(settings).specs()]
    for future in admin.delete_topics(names, operation_timeout=30).values():
        with contextlib.suppress(Exception):
            future.result(timeout=30)


# -- the run ------------------------------------------------------------------------------


@contextlib.contextmanager
def broker() -> Iterator[str]:
    env = os.environ.get("SLUICEGATE_BOOTSTRAP")
    if env:
        yield env
        return
    data_dir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    port, controller_port = free_ports(2)
    local = ensure_broker(port=port, controller_port=controller_port, data_dir=data_dir)
    try:
        yield local.bootstrap
    finally:
        stop_broker(port, data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def default_faust_python() -> Path:
    env = os.environ.get("BENCH_FAUST_PYTHON")
    if env:
        return Path(env)
    return next((p for p in FAUST_PYTHONS if p.exists()), FAUST_PYTHONS[0])


def median_of(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise(results: list[Measurement]) -> dict[str, dict[str, Any]]:
    summary: dict[str, dict[str, Any]] = {}
    for system in SYSTEMS:
        ok = [r for r in results if r.system == system and r.error is None]
        if not ok:
            continue
        summary[system] = {
            "runs": len(ok),
            "starts_per_s": median_of([r.starts_per_s for r in ok]),
            "all_starts_per_s": [round(r.starts_per_s) for r in ok],
            "wall_starts_per_s": median_of([r.wall_starts_per_s for r in ok]),
            "cpu_us_per_start": median_of([r.cpu_us_per_start for r in ok]),
            "latency_p50_ms": median_of([r.latency_ms.get("p50", 0.0) for r in ok]),
            "latency_p99_ms": median_of([r.latency_ms.get("p99", 0.0) for r in ok]),
            "e2e_p50_ms": median_of([r.e2e_latency_ms.get("p50", 0.0) for r in ok]),
            "e2e_p99_ms": median_of([r.e2e_latency_ms.get("p99", 0.0) for r in ok]),
            "outputs_per_start": median_of([r.outputs_per_start for r in ok]),
            "loadavg": median_of([r.loadavg for r in ok]),
        }
    return summary


def report(summary: dict[str, dict[str, Any]], results: list[Measurement]) -> str:
    raw = summary.get("raw", {}).get("starts_per_s")
    raw_io = summary.get("raw-io", {}).get("starts_per_s")
    lines = [
        "system   starts/s (runs)                 vs raw  vs raw-io  wall/s   CPU µs/start"
        "  out/start  latency p50/p99 ms  e2e p50/p99 ms",
    ]
    for system, s in summary.items():
        ratio = f"{s['starts_per_s'] / raw:.2f}x" if raw else "  -  "
        ratio_io = f"{s['starts_per_s'] / raw_io:.2f}x" if raw_io else "  -  "
        runs = ",".join(str(v) for v in s["all_starts_per_s"])
        lines.append(
            f"{system:8s} {s['starts_per_s']:8.0f} ({runs:22s}) {ratio:>6s} {ratio_io:>9s} "
            f"{s['wall_starts_per_s']:7.0f} {s['cpu_us_per_start']:10.1f}"
            f" {s['outputs_per_start']:10.2f}"
            f"  {s['latency_p50_ms']:7.1f}/{s['latency_p99_ms']:<7.1f}"
            f"     {s['e2e_p50_ms']:6.1f}/{s['e2e_p99_ms']:<6.1f}")
    if "worker" in summary and "worker-base" in summary:
        after, before = summary["worker"], summary["worker-base"]
        speedup = after["starts_per_s"] / before["starts_per_s"]
        lines.append(f"\nworker / worker-base: {speedup:.2f}x"
                     f" starts/s, CPU µs/start {before['cpu_us_per_start']:.1f} ->"
                     f" {after['cpu_us_per_start']:.1f}")
    loads = [r.loadavg for r in results if not r.error]
    if loads:
        lines.append(f"machine load (1 min) before the throughput phases: "
                     f"{min(loads):.1f} .. {max(loads):.1f}")
    for r in results:
        if r.error:
            lines.append(f"\n{r.system} run {r.repeat} FAILED: {r.error}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=100_000,
                        help="starts in each throughput measurement")
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--latency-starts", type=int, default=5_000)
    parser.add_argument("--latency-rate", type=float, default=1_000.0,
                        help="starts/s during the latency measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--systems", default="raw,raw-io,floor,worker,faust",
                        help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                        help="a source tree (e.g. `git archive` of an older commit) whose "
                             "sluicegate runs as the system worker-base")
    parser.add_argument("--note-bytes", type=int, default=0,
                        help="pad each payload with this many bytes")
    parser.add_argument("--partitions", type=int, default=Settings().partitions)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--faust-python", type=Path,
                        default=default_faust_python(),
                        help="the python of a virtualenv with faust-streaming installed")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="record the worker's throughput phase with py-spy into DIR")
    parser.add_argument("--keep-topics", action="store_true")
    parser.add_argument("--logs", type=Path, default=None, metavar="DIR",
                        help="keep each system process's log in DIR")
    parser.add_argument("--no-warmup-round", dest="warmup_round", action="store_false",
                        help="skip the discarded first round that warms the broker up")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--processes", type=int, default=1,
                        help="processes per system (raw pipes and workers), in one group")
    parser.add_argument("--pin", action="store_true",
                        help="the system under test on the last CPU, the broker and this "
                             "process on the others: less noise from sharing cores")
    args = parser.parse_args()

    systems = [s for s in args.systems.split(",") if s]
    if args.baseline_tree is not None and "worker-base" not in systems:
        systems.insert(systems.index("worker") + 1 if "worker" in systems else 0,
                       "worker-base")
    if "worker-base" in systems and args.baseline_tree is None:
        parser.error("worker-base needs --baseline-tree")
    if "faust" in systems and not args.faust_python.exists():
        print(f"faust: skipped, no {args.faust_python} (see bench/README.md)")
        systems.remove("faust")
    opts = Options(args.starts, args.warmup, args.latency_starts, args.latency_rate,
                   args.repeats, args.note_bytes, args.timeout, args.faust_python,
                   args.py_spy, args.keep_topics, args.logs, args.baseline_tree,
                   admission_sizes(app, WORKFLOW, args.note_bytes), args.processes)
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("--pin needs at least 2 CPUs")
        # Set before the broker starts, so its JVM inherits the rest.
        os.sched_setaffinity(0, cpus[:-1])
        opts = dataclasses.replace(opts, system_cpus={cpus[-1]})
    maker = StartMaker(app)
    sample_key, sample_value = maker.make(WORKFLOW, 0, args.note_bytes)
    print(f"input: StartRequest {len(sample_value)} B value, {len(sample_key)} B key; "
          f"an admission writes {opts.sizes} B; "
          f"{args.starts} starts x {args.repeats} repeats; systems {systems}; "
          f"{os.cpu_count()} CPUs"
          + (f", system under test pinned to CPU {sorted(opts.system_cpus)}"
             if opts.system_cpus else ""), flush=True)
    results: list[Measurement] = []
    with broker() as bootstrap, tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        print(f"broker: {bootstrap}", flush=True)
        base = Settings(bootstrap=bootstrap, partitions=args.partitions,
                        state_dir=Path(tmp) / "state")
        if args.warmup_round:
            # A freshly started broker's JVM is cold (plain produce -> consume p50 is ~25 ms
            # in its first seconds, ~3 ms later): one discarded round of each system first.
            warm = dataclasses.replace(opts, starts=min(opts.starts, 20_000))
            for system in systems:
                r = measure(system, -1, base, warm, Path(tmp), maker)
                print(f"  {system:6s} warm-up round (discarded): "
                      f"{r.error.splitlines()[0] if r.error else f'{r.starts_per_s:.0f}/s'}",
                      flush=True)
        for repeat in range(args.repeats):
            for system in systems:
                r = measure(system, repeat, base, opts, Path(tmp), maker)
                results.append(r)
                status = r.error.splitlines()[0] if r.error else (
                    f"{r.starts_per_s:.0f} starts/s, {r.cpu_us_per_start:.1f} CPU µs/start,"
                    f" latency p50 {r.latency_ms.get('p50', 0):.0f} ms"
                    f" p99 {r.latency_ms.get('p99', 0):.0f} ms"
                    f" (visible p50 {r.e2e_latency_ms.get('p50', 0):.0f} ms"
                    f" p99 {r.e2e_latency_ms.get('p99', 0):.0f} ms)"
                    + (f", {r.unexpected_outputs} UNEXPECTED outputs"
                       f" ({r.unexpected_from_warmup} of warm-up starts)"
                       if r.unexpected_outputs else ""))
                print(f"  {system:6s} run {repeat}: {status}", flush=True)
    summary = summarise(results)
    print()
    print(report(summary, results))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary,
                                         "runs": [asdict(r) for r in results]}, indent=2))


if __name__ == "__main__":
    main()
