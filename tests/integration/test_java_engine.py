"""The Java engine of examples/java-engine (the Kafka Java client and Apache Avro, nothing
from the Python package) against a worker on the real broker: its reports free the slots of
a concurrency-limited workflow, it honours a cancel, and Avro for Java reads and writes the
golden examples of docs/wire-format.md."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.ops.services import bulk
from sluicegate.schemas import codec
from sluicegate.schemas.codec import RECORD_TYPES
from sluicegate.schemas.records import LIVE, AdmittedStart, RunEvent, RunEventKind, RunStatus
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import ROOT, TopicReader, WorkerProcess, settings_env
from tests.integration.test_concurrency import most_in_flight

pytestmark = pytest.mark.broker

APP = "tests.apps.java_engine"
ENGINE = ROOT / "examples" / "java-engine"


def _sources() -> list[Path]:
    """What the jar is built from: the pom, the Java sources and the schemas it packs."""
    return sorted([ENGINE / "pom.xml", *(ENGINE / "src").rglob("*.java"),
                   *(ROOT / "sluicegate" / "schemas" / "avro").glob("*.avsc")])


@pytest.fixture(scope="session")
def java_engine_jar() -> Path:
    """The engine's jar, built with Maven once per state of its sources: into the user cache,
    under a hash of them, so a session (and CI's next run on the same machine) with nothing
    changed starts no Maven at all."""
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    out = Path(platformdirs.user_cache_dir("sluicegate")) / f"java-engine-{digest.hexdigest()[:16]}"
    jar = out / "sluicegate-java-engine.jar"
    if not (out / ".complete").exists():
        build = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(ENGINE / "pom.xml"), "package", f"-DbuildDir={out}"],
            capture_output=True, text=True, timeout=600, check=False)
        assert build.returncode == 0, f"mvn package failed:\n{build.stdout}\n{build.stderr}"
        (out / ".complete").write_text("")
    assert jar.exists()
    return jar


class JavaEngineProcess:
    """`java -jar` the engine, on the test's namespace, logging to a file."""

    def __init__(self, settings: Settings, jar: Path, log: Path, *args: str,
                 group: str | None = None, **env: str) -> None:
        """`args`: more options of the engine's."""
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                ["java", "-jar", str(jar), "--group",
                 group or f"java-engine-{uuid.uuid4().hex[:6]}", "--heartbeat-ms", "1000",
                 *args],
                cwd=ROOT, env=settings_env(settings, log.parent / "unused-state", **env),
                stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def started(self) -> list[str]:
        """The execution ids it logged as started."""
        return [line.split()[1] for line in self.log.read_text(errors="replace").splitlines()
                if line.startswith("started ")]


@pytest.fixture
def java_engine(settings: Settings, tmp_path: Path, java_engine_jar: Path
                ) -> Iterator[JavaEngineProcess]:
    create_topics(settings)
    worker = WorkerProcess(settings, APP, tmp_path / "worker").start()
    engine = JavaEngineProcess(settings, java_engine_jar, tmp_path / "java-engine.log")
    try:
        yield engine
    finally:
        engine.stop()
        worker.stop()


def test_apache_avro_for_java_reads_and_writes_every_golden_example(
        java_engine_jar: Path) -> None:
    check = subprocess.run(
        ["java", "-jar", str(java_engine_jar), "check-golden",
         str(ROOT / "docs" / "wire-format" / "golden.json")],
        capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    # One record per record type the codec knows (tests/unit/test_wire_golden.py).
    records = len(RECORD_TYPES)
    assert f"{records} records and the sealed payload checked, 0 problems" in check.stdout


def reported(events: list[RunEvent], kind: RunEventKind) -> dict[str, RunEvent]:
    return {e.execution_id: e for e in events if e.kind is kind}


def test_the_java_engines_reports_free_the_slots_of_a_concurrency_limit(
        settings: Settings, java_engine: JavaEngineProcess) -> None:
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    with Client(app=APP, settings=settings, replies=False) as client:
        for n in range(10):
            client.submit("javaJob", {"n": n, "holdMs": 300})
    try:
        admitted.until(lambda rows: len(rows) >= 10, timeout=60, what="10 admitted")
        events.until(lambda rows: len(reported(rows, RunEventKind.completed)) >= 10,
                     timeout=30, what="10 completed by the Java engine")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\njava engine:\n{java_engine.tail()}") from None
    runs = {a.execution_id for a in admitted.records}
    assert len(runs) == 10
    started = reported(events.records, RunEventKind.started)
    completed = reported(events.records, RunEventKind.completed)
    assert set(started) == set(completed) == runs
    assert all(e.run_id is not None and e.run_id.startswith("java-") for e in completed.values())
    # Only the engine's completions let the 3rd to 10th in: 2 at a time, never more.
    assert most_in_flight(admitted.records, events.records, lambda a: a.workflow) == {
        "javaJob": 2}


def test_the_java_engine_honours_a_cancel_and_the_slot_goes_to_the_next_start(
        settings: Settings, java_engine: JavaEngineProcess) -> None:
    topics = Topics(settings)
    events = TopicReader(settings, topics.run_events, RunEvent)
    with Client(app=APP, settings=settings) as client:
        # Two runs that would hold both slots for ten minutes.
        long = [client.start("javaJob", {"n": n, "holdMs": 600_000}, wait_decision=True)
                for n in range(2)]
        assert [h.status for h in long] == ["admitted", "admitted"]
        ids = [h.execution_id for h in long]
        events.until(lambda rows: set(ids) <= set(reported(rows, RunEventKind.started)),
                     timeout=30, what="both long runs started by the Java engine")
        waiting = client.start("javaJob", {"n": 2, "holdMs": 100}, wait_decision=True)
        assert waiting.status == "queued"
        # The runs table has both long runs live before a bulk cancel can pick one.
        deadline = time.monotonic() + 30
        while {r.execution_id for r in bulk.read_runs(settings)
               if r.status is RunStatus.running} < set(ids):
            assert time.monotonic() < deadline, "the long runs never showed as running"
        result = bulk.apply_cancel(settings, "javaJob", "test: stop the first long run", 1,
                                   only=[ids[0]])
        assert [r.execution_id for r in result.succeeded] == [ids[0]]
        try:
            events.until(lambda rows: ids[0] in reported(rows, RunEventKind.cancelled),
                         timeout=30, what="the Java engine's cancelled report")
            # The cancelled run's slot admits the waiting start, which then runs to its end.
            events.until(lambda rows: len(reported(rows, RunEventKind.completed)) >= 1,
                         timeout=30, what="the waiting start admitted and completed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\njava engine:\n{java_engine.tail()}") from None
    cancelled = reported(events.records, RunEventKind.cancelled)[ids[0]]
    assert cancelled.reason == "test: stop the first long run"
    assert set(reported(events.records, RunEventKind.completed)) == {
        e.execution_id for e in events.records
        if e.kind is RunEventKind.started and e.execution_id not in ids}
    assert ids[1] not in reported(events.records, RunEventKind.cancelled)
    # Heartbeats keep the remaining long run's lease (every second here).
    events.until(lambda rows: any(e.kind is RunEventKind.heartbeat and e.execution_id == ids[1]
                                  for e in rows), timeout=10, what="a heartbeat of the other")
    deadline = time.monotonic() + 30
    while (row := next(r for r in bulk.read_runs(settings) if r.execution_id == ids[0])
           ).status is not RunStatus.cancelled:
        assert time.monotonic() < deadline, f"run {ids[0]} is {row.status}, not cancelled"
    assert row.last_reason == "test: stop the first long run"


def test_with_a_schema_registry_the_java_engine_reads_and_writes_registry_frames(
        settings: Settings, schema_registry_url: str, tmp_path: Path, java_engine_jar: Path,
        restore_codec: None) -> None:
    framed = settings.with_(schema_registry_url=schema_registry_url)
    create_topics(framed)  # also registers the schemas
    topics = Topics(framed)
    admitted = TopicReader(framed, topics.admitted, bytes)
    events = TopicReader(framed, topics.run_events, bytes)
    registry = {"SLUICEGATE_SCHEMA_REGISTRY_URL": schema_registry_url}
    worker = WorkerProcess(settings, APP, tmp_path / "worker", **registry).start()
    engine = JavaEngineProcess(settings, java_engine_jar, tmp_path / "java-engine.log", **registry)
    try:
        with Client(app=APP, settings=framed, replies=False) as client:  # framed for the registry
            for n in range(4):
                client.submit("javaJob", {"n": n, "holdMs": 50})
        done = events.until(lambda rows: sum(codec.decode(RunEvent, v).kind
                                             is RunEventKind.completed for v in rows) >= 4,
                            timeout=60, what="4 runs completed by the Java engine")
        admitted.until(lambda rows: len(rows) >= 4, timeout=10, what="4 admitted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\njava engine:\n{engine.tail()}") from None
    finally:
        engine.stop()
        worker.stop()
    # Both sides framed 00 + schema id: the worker's admitted starts, the engine's reports.
    assert {v[:1] for v in admitted.records} == {v[:1] for v in done} == {b"\x00"}
    # 4 starts through a limit of 2: the last two ran only because the reports freed slots.
    assert most_in_flight([codec.decode(AdmittedStart, v) for v in admitted.records],
                          [codec.decode(RunEvent, v) for v in done],
                          lambda a: a.workflow) == {"javaJob": 2}


def test_java_engines_on_a_share_group_share_one_partition_and_a_cancel_finds_its_run(
        settings: Settings, tmp_path: Path, java_engine_jar: Path) -> None:
    one = settings.with_(partitions=1)
    create_topics(one)
    topics = Topics(one)
    events = TopicReader(one, topics.run_events, RunEvent)
    worker = WorkerProcess(one, APP, tmp_path / "worker").start()
    group = f"java-share-{uuid.uuid4().hex[:6]}"
    engines = [JavaEngineProcess(one, java_engine_jar, tmp_path / f"java-{i}.log",
                                 "--share-group", "--instance", f"j{i}", group=group)
               for i in range(2)]
    submitted = 0
    try:
        with Client(app=APP, settings=one) as client:
            # Starts until both instances have run one: one partition, two instances.
            deadline = time.monotonic() + 120
            while not all(engine.started() for engine in engines):
                assert time.monotonic() < deadline and submitted < 500, "\n".join(
                    engine.tail() for engine in engines)
                client.submit("javaJob", {"n": submitted, "holdMs": 200})
                submitted += 1
                events.poll(0.1)
            events.until(lambda rows: len(reported(rows, RunEventKind.completed)) >= submitted,
                         timeout=60, what=f"{submitted} runs completed")
            # The engines' reports are read here before the worker has freed the slots of
            # those runs; the runs table says they ended in the transaction that frees them.
            deadline = time.monotonic() + 30
            while any(r.status in LIVE for r in bulk.read_runs(one)):
                assert time.monotonic() < deadline, "runs reported completed still running"
            # A long run, on whichever instance: every instance reads every command, the
            # one holding the run stops it.
            long = client.start("javaJob", {"n": submitted, "holdMs": 600_000},
                                wait_decision=True)
            assert long.status == "admitted"
            events.until(lambda rows: long.execution_id in reported(rows, RunEventKind.started),
                         timeout=60, what="the long run started")
            deadline = time.monotonic() + 30
            while long.execution_id not in {r.execution_id for r in bulk.read_runs(one)
                                            if r.status is RunStatus.running}:
                assert time.monotonic() < deadline, "the long run never showed as running"
            result = bulk.apply_cancel(one, "javaJob", "test: stop the long run", 1,
                                       only=[long.execution_id])
            assert [r.execution_id for r in result.succeeded] == [long.execution_id]
            events.until(lambda rows: long.execution_id in reported(rows, RunEventKind.cancelled),
                         timeout=30, what="the long run cancelled")
        events.settle(1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n" + "\n".join(e.tail() for e in engines)) from None
    finally:
        for engine in engines:
            engine.stop()
        worker.stop()
    started = [e.execution_id for e in events.records if e.kind is RunEventKind.started]
    assert len(started) == len(set(started)) == submitted + 1
    assert sorted(started) == sorted(engines[0].started() + engines[1].started())
    assert reported(events.records, RunEventKind.cancelled)[long.execution_id].reason == (
        "test: stop the long run")
    assert len(reported(events.records, RunEventKind.completed)) == submitted
    # The limit of 2 holds by the engines' clocks: started to completed.
    moments = sorted([(e.at_ms, 1) for e in events.records if e.kind is RunEventKind.started]
                     + [(e.at_ms, -1) for e in events.records
                        if e.kind in (RunEventKind.completed, RunEventKind.cancelled)])
    running = [sum(step for _, step in moments[:i + 1]) for i in range(len(moments))]
    assert max(running) <= 2
