"""Memory and restore time with many keys of state: a worker holding N parked debounce
groups, or N starts queued behind a concurrency limit (issue 15).

    .venv/bin/python -m bench.memory --keys 20000
    .venv/bin/python -m bench.memory --keys 1000000 --wipe-state --json /tmp/memory.json

Per scenario (`--scenarios`), on fresh topics (a namespace of its own) and a fresh state
directory, one worker (`bench.memory_worker`: `sluicegate worker --app bench.memory_apps`,
plus a memory report on SIGUSR2):

  debounce  every start has a debounce key of its own and a quiet time of a day: N keys,
            each holding one parked group, none firing during the run;
  queued    at most one run per customer (977 customers) and no engine completes any, so
            all but 977 of the N starts wait in the concurrency queues.

  1. the worker starts and decides one probe start (its partitions assigned and restored,
     its code paths run): its RSS then is the baseline;
  2. N starts (StartRequests as the SDK encodes them, `bench.records`) are produced in
     committed transactions of `--chunk` while the worker works through them; once the
     group has committed every start, and every record the route sent through a stage's
     topic, its RSS (VmRSS), peak (VmHWM), RSS per key ((RSS - baseline) / N), the state
     directory's size on disk, and where the memory is (`bench.memory_worker`'s report:
     RocksDB memtables, block cache, table readers; pymalloc; malloc) are read;
  3. kill -9, and the same worker started again on the same state directory at once: the
     time from its spawn until every partition is restored (its log's `partition P ready`
     lines, with the changelog records each replayed) and until a probe start produced
     right after the spawn is decided (its ledger row);
  4. with `--wipe-state`, kill -9 again, every store deleted (the state directory keeps
     only the worker's id, so the restart is not held up by its static group membership
     expiring), and started again: the whole state comes back from the changelogs.

A table (markdown) at the end, and `--json PATH`. The broker is `SLUICEGATE_BOOTSTRAP` if
set; otherwise a local Kafka is started on free ports with a temporary data dir and
stopped at the end (bench.passthrough's `broker()`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from bench.memory_apps import DEBOUNCE, QUEUED, app
from bench.memory_worker import REPORT_ENV
from bench.passthrough import (
    OutputReader,
    SystemProcess,
    broker,
    data_ends,
    delete_topics,
    process_cpu_s,
    produce_all,
    produce_committed,
    sdk_producer_config,
    start_py_spy,
    stop_py_spy,
    wait_committed,
)
from bench.records import StartMaker
from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import StartRequest
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import ROUTED_STAGES, Topics

ROOT = Path(__file__).resolve().parents[1]
APPS = "bench.memory_apps"
SCENARIOS = {"debounce": DEBOUNCE, "queued": QUEUED}
# Probe starts are numbered from here: their keys (orderId) are none of the N starts'.
PROBE_BASE = 10**9
PROGRESS_EVERY_S = 10.0
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_READY = re.compile(r"partition (\d+) ready, (\d+) changelog records replayed in ([\d.]+)s")
MB = 1024 * 1024
T = TypeVar("T")


# -- measurements ------------------------------------------------------------------------


@dataclass
class Restore:
    """One restart of the worker after kill -9."""

    state: str  # "kept" or "wiped"
    ready_s: float = 0.0  # spawn -> the last partition's "ready" log line
    probe_s: float = 0.0  # spawn -> the ledger row of a start produced at the spawn
    assigned_s: float = 0.0  # spawn -> "assigned partitions"
    replayed: int = 0  # changelog records replayed, over every partition
    slowest_partition_s: float = 0.0  # the longest of the partitions' restores
    replay_s: float = 0.0  # the partitions' restores (their replays), added up
    disk_before_mb: float = 0.0  # the state directory as the restarted worker found it
    rss_mb: float = 0.0  # once restored (and settled)
    peak_mb: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    scenario: str
    keys: int
    baseline_rss_mb: float = 0.0
    baseline_memory: dict[str, Any] = field(default_factory=dict)
    rss_mb: float = 0.0
    peak_mb: float = 0.0
    rss_anon_mb: float = 0.0
    rss_per_key_b: float = 0.0  # (RSS - baseline) / keys
    disk_mb: float = 0.0
    peak_memtables_mb: float = 0.0  # the most seen in the ~10 s samples while ingesting
    ingest_s: float = 0.0  # first chunk committed -> the group committed everything
    starts_per_s: float = 0.0
    cpu_us_per_start: float = 0.0
    memory: dict[str, Any] = field(default_factory=dict)
    restores: list[Restore] = field(default_factory=list)
    error: str | None = None


def status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, ... of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name] = int(parts[0]) * 1024
    return out


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk to the files under `path`."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def logged(log: Path, after: float) -> list[tuple[float, str]]:
    """(wall-clock time, text) of the log lines written at or after `after`."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        match = _STAMP.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if at >= after - 0.001:
                out.append((at, line))
    return out


def retrying(call: Callable[[], T], timeout: float = 60.0) -> T:
    """`call()`, again while the broker says it is not ready (topics just created have
    no leader for a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


# -- the worker ----------------------------------------------------------------------------


class MemoryWorker(SystemProcess):
    """The worker under test (bench.passthrough's SystemProcess, running bench.memory_apps
    through bench.memory_worker, one process, a state directory given)."""

    def __init__(self, settings: Settings, workdir: Path, state_dir: Path,
                 extra_env: dict[str, str]) -> None:
        super().__init__("worker", settings, workdir, Path(), None)
        self.state_dir = state_dir
        self.extra_env = extra_env
        self.report_path = workdir / "memory-report.json"

    def command(self) -> tuple[list[str], dict[str, str]]:
        _cmd, env = super().command()
        env["SLUICEGATE_STATE_DIR"] = str(self.state_dir)
        env[REPORT_ENV] = str(self.report_path)
        env.update(self.extra_env)
        return [sys.executable, "-m", "bench.memory_worker", "worker", "--app", APPS,
                "--log-level", "INFO"], env

    def start(self) -> None:
        cmd, env = self.command()
        with open(self.log, "ab") as log:
            self.procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log,
                                           stderr=subprocess.STDOUT)]

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def kill9(self) -> None:
        proc = self.procs[0]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)

    def memory_report(self, trim: bool = True, timeout: float = 120.0) -> dict[str, Any]:
        """The worker's own account of its memory (bench.memory_worker); with `trim`, and
        its RSS after malloc_trim(0) (only where nothing is measured after it)."""
        self.report_path.unlink(missing_ok=True)
        if trim:
            self.report_path.with_suffix(".trim").touch()
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not self.report_path.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                return {"error": "no memory report"}
            time.sleep(0.1)
        report: dict[str, Any] = json.loads(self.report_path.read_text())
        return report


# -- input ---------------------------------------------------------------------------------


class Probe:
    """One start produced now, decided when its ledger row appears."""

    def __init__(self, settings: Settings, maker: StartMaker, workflow: str, n: int) -> None:
        self.settings = settings
        self.topics = Topics(settings)
        self.key, self.value = maker.make(workflow, PROBE_BASE + n)
        self.request_id = codec.decode(StartRequest, self.value).request_id

    def run(self, worker: MemoryWorker, timeout: float) -> float:
        """Produce it and wait for its decision; returns when this process saw the row."""
        ledger = self.topics.ledger
        reader = OutputReader(self.settings, ledger, retrying(
            lambda: OutputReader.high_watermarks(self.settings, ledger)))
        reader.wanted = {self.request_id.encode()}
        producer = Producer(sdk_producer_config(self.settings))
        produce_all(producer, self.topics.starts, [(self.key, self.value)])
        try:
            reader.until_complete(timeout, worker)
        finally:
            reader.close()
        return reader.seen[self.request_id.encode()][1] / 1000.0


class Committed:
    """The group's committed offsets, for progress lines."""

    def __init__(self, settings: Settings, group: str) -> None:
        self.consumer = Consumer(settings.client_config(**{"group.id": group,
                                                           "enable.auto.commit": False}))

    def total(self, topic: str, partitions: int) -> int:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return sum(max(0, tp.offset) for tp in self.consumer.committed(tps, timeout=10))

    def close(self) -> None:
        self.consumer.close()


# -- one scenario --------------------------------------------------------------------------


@dataclass
class Options:
    keys: int
    chunk: int
    timeout: float
    restore_timeout: float
    settle: float
    wipe_state: bool
    keep: bool
    worker_env: dict[str, str] = field(default_factory=dict)
    py_spy: Path | None = None


def measure(scenario: str, base: Settings, opts: Options, workdir: Path,
            maker: StartMaker) -> Result:
    workflow = SCENARIOS[scenario]
    settings = base.with_(namespace=f"mem{uuid.uuid4().hex[:6]}.")
    rundir = workdir / f"{scenario}-{settings.namespace.rstrip('.')}"
    rundir.mkdir(parents=True)
    state_dir = rundir / "state"
    create_topics(settings)
    topics = Topics(settings)
    worker = MemoryWorker(settings, rundir, state_dir, opts.worker_env)
    result = Result(scenario, opts.keys)
    probes = iter(range(10**6))

    def say(text: str) -> None:
        print(f"  [{scenario}] {text}", flush=True)

    try:
        # 1. Started, assigned, restored (nothing), and deciding: the baseline.
        worker.start()
        Probe(settings, maker, workflow, next(probes)).run(worker, opts.restore_timeout)
        time.sleep(opts.settle)
        result.baseline_rss_mb = status(worker.pid)["VmRSS"] / MB
        result.baseline_memory = worker.memory_report(trim=False)
        say(f"worker {worker.pid} deciding; baseline RSS {result.baseline_rss_mb:.0f} MB")

        # 2. N starts, committed chunk by chunk while the worker works through them.
        ingest(settings, topics, worker, maker, workflow, opts, result, say)
        time.sleep(opts.settle)
        st = status(worker.pid)
        result.rss_mb, result.peak_mb = st["VmRSS"] / MB, st["VmHWM"] / MB
        result.rss_anon_mb = st.get("RssAnon", 0) / MB
        result.rss_per_key_b = (st["VmRSS"] - result.baseline_rss_mb * MB) / opts.keys
        result.memory = worker.memory_report()
        result.peak_memtables_mb = max(result.peak_memtables_mb,
                                       result.memory.get("rocksdb", {}).get("memtables", 0) / MB)
        result.disk_mb = disk_bytes(state_dir) / MB
        say(f"{opts.keys} keys: RSS {result.rss_mb:.0f} MB (peak {result.peak_mb:.0f} MB; "
            f"memtables at most {result.peak_memtables_mb:.0f} MB in the samples), "
            f"{result.rss_per_key_b:.0f} B/key over the baseline; state dir "
            f"{result.disk_mb:.0f} MB; {describe_memory(result.memory)}")

        # 3. kill -9, restarted on the state it left.
        worker.kill9()
        result.restores.append(restart(settings, worker, maker, workflow, "kept", probes,
                                       opts, say))
        # 4. kill -9, restarted with no stores at all.
        if opts.wipe_state:
            worker.kill9()
            for entry in state_dir.iterdir():
                if entry.name == "worker.id":
                    continue  # its identity: no wait for the old static member to expire
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            result.restores.append(restart(settings, worker, maker, workflow, "wiped",
                                           probes, opts, say))
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            result.error += "\n" + worker.log_tail()
        say(f"FAILED: {result.error}")
    finally:
        worker.stop()
        if not opts.keep:
            delete_topics(settings)
            shutil.rmtree(rundir, ignore_errors=True)
        else:
            say(f"kept {rundir} and the topics of namespace {settings.namespace}")
    return result


def ingest(settings: Settings, topics: Topics, worker: MemoryWorker, maker: StartMaker,
           workflow: str, opts: Options, result: Result, say: Any) -> None:
    """Produce the N starts and wait until the group has committed them, and every record
    they sent through a stage's topic."""
    group = worker.group
    n = settings.partitions
    committed = Committed(settings, group)
    ends: dict[int, int] = {}
    fed = 0
    started = last_said = time.monotonic()
    first_commit: float | None = None
    cpu0 = process_cpu_s(worker.pid)

    def progress(final: bool = False) -> None:
        nonlocal last_said
        now = time.monotonic()
        if not final and now - last_said < PROGRESS_EVERY_S:
            return
        last_said = now
        done = committed.total(topics.starts, n)
        st = status(worker.pid)
        memtables = worker.memory_report(trim=False).get("rocksdb", {}).get("memtables", 0)
        result.peak_memtables_mb = max(result.peak_memtables_mb, memtables / MB)
        say(f"{now - started:6.0f}s fed {fed:>9}, starts committed to offset sum "
            f"{done:>9}; worker RSS {st['VmRSS'] / MB:.0f} MB (memtables "
            f"{memtables / MB:.0f} MB), CPU {process_cpu_s(worker.pid) - cpu0:.0f}s")

    try:
        i = 0
        while i < opts.keys:
            size = min(opts.chunk, opts.keys - i)
            chunk = [maker.make(workflow, k) for k in range(i, i + size)]
            for p, end in produce_committed(settings, topics.starts, chunk).items():
                ends[p] = max(ends.get(p, 0), end)
            if first_commit is None:
                first_commit = time.monotonic()
            i += size
            fed = i
            del chunk
            worker.check_alive()
            progress()
        # The starts, then each stage topic's records (all written by transactions that
        # committed with the starts' offsets, so their ends are final once those are in).
        waits: list[tuple[str, dict[int, int]]] = [(topics.starts, ends)]
        for stage in ROUTED_STAGES:
            waits.append((topics.stage(stage), {}))
        for topic, want in waits:
            if topic != topics.starts:
                want = {p: e for p, e in data_ends(settings, topic).items() if e > 0}
                if not want:
                    continue
            deadline = time.monotonic() + opts.timeout
            while True:
                try:
                    wait_committed(settings, group, topic, want, worker,
                                   min(PROGRESS_EVERY_S, max(0.0, deadline - time.monotonic())),
                                   step=0.2)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
                    progress(final=True)
        assert first_commit is not None
        result.ingest_s = time.monotonic() - first_commit
        result.starts_per_s = opts.keys / result.ingest_s
        result.cpu_us_per_start = (process_cpu_s(worker.pid) - cpu0) / opts.keys * 1e6
        progress(final=True)
        say(f"all {opts.keys} committed {result.ingest_s:.0f}s after the first chunk: "
            f"{result.starts_per_s:.0f} starts/s, {result.cpu_us_per_start:.0f} CPU µs/start")
    finally:
        committed.close()


def restart(settings: Settings, worker: MemoryWorker, maker: StartMaker, workflow: str,
            state: str, probes: Any, opts: Options, say: Any) -> Restore:
    """Start the worker again (just killed) and time it until restored and deciding."""
    restore = Restore(state, disk_before_mb=disk_bytes(worker.state_dir) / MB)
    probe = Probe(settings, maker, workflow, next(probes))
    spawned = time.time()
    worker.start()
    # py-spy attaches in about a second, while the worker joins the group.
    spy = start_py_spy(opts.py_spy, worker, Path(f"{worker.workdir.name}.restart-{state}"))
    try:
        decided = probe.run(worker, opts.restore_timeout)
        restore = _restored(settings, worker, restore, spawned, decided, opts)
    finally:
        if spy is not None:
            stop_py_spy(spy)
    time.sleep(opts.settle)
    st = status(worker.pid)
    restore.rss_mb, restore.peak_mb = st["VmRSS"] / MB, st["VmHWM"] / MB
    restore.memory = worker.memory_report()
    say(f"kill -9, restart with state {state} ({restore.disk_before_mb:.0f} MB on disk): "
        f"assigned {restore.assigned_s:.1f}s, every partition restored {restore.ready_s:.1f}s "
        f"({restore.replayed} changelog records replayed in {restore.replay_s:.1f}s all "
        f"told, slowest partition {restore.slowest_partition_s:.1f}s), probe decided "
        f"{restore.probe_s:.1f}s; RSS "
        f"{restore.rss_mb:.0f} MB (peak {restore.peak_mb:.0f} MB); "
        f"{describe_memory(restore.memory)}")
    return restore


def _restored(settings: Settings, worker: MemoryWorker, restore: Restore, spawned: float,
              decided: float, opts: Options) -> Restore:
    """The restart's figures, once every partition says it is ready."""
    restore.probe_s = decided - spawned
    # Every partition restored: its "ready" line (the probe needs only its own).
    deadline = time.monotonic() + opts.restore_timeout
    while True:
        lines = logged(worker.log, spawned)
        ready = [(at, m) for at, line in lines if (m := _READY.search(line))]
        if len({m.group(1) for _, m in ready}) >= settings.partitions:
            break
        worker.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ready)} partitions restored after "
                               f"{opts.restore_timeout:.0f}s")
        time.sleep(0.2)
    restore.ready_s = max(at for at, _ in ready) - spawned
    restore.replayed = sum(int(m.group(2)) for _, m in ready)
    restore.slowest_partition_s = max(float(m.group(3)) for _, m in ready)
    restore.replay_s = sum(float(m.group(3)) for _, m in ready)
    assigned = [at for at, line in lines if "assigned partitions" in line]
    restore.assigned_s = (assigned[0] - spawned) if assigned else float("nan")
    return restore


# -- the report ----------------------------------------------------------------------------


def describe_memory(report: dict[str, Any]) -> str:
    if "rocksdb" not in report:
        return f"memory report: {report.get('error', 'none')}"
    db, py, mal = report["rocksdb"], report.get("pymalloc", {}), report.get("malloc", {})
    return (f"RocksDB memtables {db['memtables'] / MB:.0f} MB in {len(db['stores'])} stores "
            f"(~{db['keys_estimate']} keys), block cache {db['block_cache'] / MB:.0f} MB, "
            f"table readers {db['table_readers'] / MB:.1f} MB, SST {db['sst_bytes'] / MB:.0f} MB;"
            f" pymalloc arenas {py.get('arenas_bytes', 0) / MB:.0f} MB "
            f"({py.get('allocated_blocks_bytes', 0) / MB:.0f} MB in use); malloc in use "
            f"{(mal.get('in_use', 0) + mal.get('mmapped', 0)) / MB:.0f} MB, freed but kept "
            f"{mal.get('free_kept', 0) / MB:.0f} MB"
            + ("" if report.get("rss_after_trim") is None else
               f"; after malloc_trim(0) RSS {report['rss_after_trim'] / MB:.0f} MB"))


def _restore_cell(r: Restore | None) -> str:
    if r is None:
        return "-"
    return (f"{r.ready_s:.1f} s ({r.replayed:,} records replayed in {r.replay_s:.1f} s; "
            f"probe {r.probe_s:.1f} s)")


def table(results: list[Result]) -> str:
    lines = [
        "| scenario | keys | RSS | RSS/key | peak | disk | restore after kill -9, state kept "
        "| restore from the changelog, state wiped | ingest |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
    ]
    for r in results:
        if r.error and not r.rss_mb:
            lines.append(f"| {r.scenario} | {r.keys:,} | FAILED: {r.error.splitlines()[0]} "
                         "| | | | | | |")
            continue
        kept = next((x for x in r.restores if x.state == "kept"), None)
        wiped = next((x for x in r.restores if x.state == "wiped"), None)
        lines.append(
            f"| {r.scenario} | {r.keys:,} | {r.rss_mb:.0f} MB | {r.rss_per_key_b:.0f} B "
            f"| {r.peak_mb:.0f} MB | {r.disk_mb:.0f} MB | {_restore_cell(kept)} "
            f"| {_restore_cell(wiped)} | {r.starts_per_s:.0f}/s |")
    lines.append("")
    lines.append("RSS/key: (RSS - the worker's RSS before any key) / keys; baseline "
                 + ", ".join(f"{r.scenario} {r.baseline_rss_mb:.0f} MB" for r in results)
                 + ". Restore: spawn -> every partition's stores restored (the records "
                 "replayed, and the partitions' replays added up: the rest is the group join "
                 "and what the loop does between one partition's restore and the next), "
                 "and spawn -> the ledger row of a start produced at the spawn.")
    lines += ["", "Where the memory is (bench.memory_worker's report):", "",
              "| scenario | when | RSS | RocksDB memtables | block cache | table readers "
              "| pymalloc in use | malloc in use | malloc freed, kept | RSS after malloc_trim |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        rows = [("before any key", r.baseline_rss_mb, r.baseline_memory),
                (f"{r.keys:,} keys", r.rss_mb, r.memory)]
        rows += [(f"restored, state {x.state}", x.rss_mb, x.memory) for x in r.restores]
        for when, rss, report in rows:
            if "rocksdb" in report:
                lines.append(f"| {r.scenario} | {when} | {rss:.0f} MB | {memory_cells(report)} |")
    for r in results:
        if r.error:
            lines.append(f"\n{r.scenario} FAILED: {r.error}")
    return "\n".join(lines)


def memory_cells(report: dict[str, Any]) -> str:
    db, py, mal = report["rocksdb"], report.get("pymalloc", {}), report.get("malloc", {})
    cells = [db["memtables"], db["block_cache"], db["table_readers"],
             py.get("allocated_blocks_bytes", 0), mal.get("in_use", 0) + mal.get("mmapped", 0),
             mal.get("free_kept", 0), report.get("rss_after_trim")]
    return " | ".join("-" if c is None else f"{c / MB:.0f} MB" for c in cells)


def source_tree() -> str:
    """The commit the worker runs, and whether sluicegate/ differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "sluicegate"],
                                 cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return head + (f" with {len(changed)} files of sluicegate/ changed" if changed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1_000_000,
                        help="starts fed per scenario: parked keys, or queued starts")
    parser.add_argument("--scenarios", default="debounce,queued",
                        help="comma-separated subset of " + ",".join(SCENARIOS))
    parser.add_argument("--chunk", type=int, default=50_000,
                        help="starts per committed input transaction")
    parser.add_argument("--wipe-state", action="store_true",
                        help="also restart with no stores: everything from the changelogs")
    parser.add_argument("--partitions", type=int, default=Settings().partitions)
    parser.add_argument("--timeout", type=float, default=6 * 3600.0,
                        help="seconds the worker may take over the N starts")
    parser.add_argument("--restore-timeout", type=float, default=3600.0,
                        help="seconds a restart may take to restore and decide")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds waited before reading memory")
    parser.add_argument("--keep", action="store_true",
                        help="keep each scenario's topics, state directory and log")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the worker's environment only (say, glibc's "
                             "MALLOC_ARENA_MAX=2 or MALLOC_MMAP_THRESHOLD_=131072); repeatable")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="record each restart with py-spy (raw stacks) into DIR")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()
    if any("=" not in item for item in args.worker_env):
        parser.error("--worker-env takes NAME=VALUE")
    worker_env = dict(item.split("=", 1) for item in args.worker_env)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}: pick from {sorted(SCENARIOS)}")
    opts = Options(args.keys, args.chunk, args.timeout, args.restore_timeout, args.settle,
                   args.wipe_state, args.keep, worker_env, args.py_spy)
    maker = StartMaker(app)
    print(f"{args.keys} keys per scenario {scenarios}, {args.partitions} partitions, "
          f"{os.cpu_count()} CPUs, load {Path('/proc/loadavg').read_text().split()[0]}; "
          f"sluicegate at {source_tree()}"
          + (f"; worker environment {worker_env}" if worker_env else ""), flush=True)
    results: list[Result] = []
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    try:
        with broker() as bootstrap:
            print(f"broker: {bootstrap}; work dir {work}", flush=True)
            base = Settings(bootstrap=bootstrap, partitions=args.partitions,
                            state_dir=work / "state")
            for scenario in scenarios:
                results.append(measure(scenario, base, opts, work, maker))
                if args.json:
                    args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
