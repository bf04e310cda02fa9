"""Helpers for tests on the real broker: read topics to a condition, run workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from confluent_kafka import Consumer, ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient

from sluicegate.admission.worker import Worker
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.clock import Clock, ManualClock
from sluicegate.schemas import codec
from sluicegate.topology.topics import Topics

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def clock_at_now() -> ManualClock:
    """A ManualClock starting at the wall clock's time, for a test that produces records
    stamped with it (a cancelOn event's timestamp is the event's time). The broker deletes
    a segment whose newest record is older than the topic's retention (a week for event
    topics) at its next retention check, once a minute on the local broker: an event
    stamped with ManualClock's default start (2023) can vanish before a worker reads it."""
    return ManualClock(time.time_ns() // 1_000_000)


class TopicReader(Generic[T]):
    """Reads every partition of a topic from the start, read_committed, decoding as `cls`
    (`bytes`: the values as written)."""

    def __init__(self, settings: Settings, topic: str, cls: type[T]) -> None:
        self.cls = cls
        self.records: list[T] = []
        self.keys: list[bytes | None] = []
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"test-reader-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20,
        }))
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])

    def poll(self, timeout: float = 0.2) -> int:
        got = 0
        for msg in self._consumer.consume(5000, timeout=timeout):
            if msg.error() is not None or msg.value() is None:
                continue
            value = msg.value()
            self.records.append(value if self.cls is bytes
                                else codec.decode(self.cls, value))  # type: ignore[type-var]
            self.keys.append(msg.key())
            got += 1
        return got

    def until(self, done: Callable[[list[T]], bool], timeout: float = 60.0,
              what: str = "condition") -> list[T]:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                     f"have {len(self.records)} records")
            self.poll()
        return self.records

    def settle(self, quiet_s: float = 1.0) -> list[T]:
        """Read until nothing new arrives for `quiet_s` (to check nothing extra comes)."""
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            if self.poll():
                last = time.monotonic()
        return self.records

    def close(self) -> None:
        self._consumer.close()


def settings_env(settings: Settings, state_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SLUICEGATE_BOOTSTRAP": settings.bootstrap,
        "SLUICEGATE_NAMESPACE": settings.namespace,
        "SLUICEGATE_PARTITIONS": str(settings.partitions),
        "SLUICEGATE_STATE_DIR": str(state_dir),
        "SLUICEGATE_STATE_BACKEND": settings.state_backend,
        "SLUICEGATE_COMMIT_INTERVAL_MS": str(settings.commit_interval_ms),
        "PYTHONPATH": str(ROOT),
    })
    env.update(extra)
    return env


def shared_by_two(settings: Settings, timeout: float = 90.0) -> dict[int, str]:
    """Once the group is stable with two members sharing every partition of sg.starts:
    the member that owns each partition."""
    admin = AdminClient(settings.client_config())
    deadline = time.monotonic() + timeout
    while (owners := partition_owners(settings, admin)) is None:
        assert time.monotonic() < deadline, "the two workers never shared the partitions"
        time.sleep(0.2)
    assert len(set(owners.values())) == 2
    return owners


def partition_owners(settings: Settings, admin: AdminClient | None = None
                     ) -> dict[int, str] | None:
    """Which member owns each partition of sg.starts, once the group is stable with two
    members sharing all of them; None before that."""
    topics = Topics(settings)
    admin = admin or AdminClient(settings.client_config())
    (future,) = admin.describe_consumer_groups([topics.group]).values()
    group = future.result(timeout=10)
    if group.state is not ConsumerGroupState.STABLE or len(group.members) != 2:
        return None
    owners = {tp.partition: member.member_id for member in group.members
              for tp in member.assignment.topic_partitions if tp.topic == topics.starts}
    return owners if len(owners) == settings.partitions else None


class WorkerProcess:
    """`sluicegate worker` in its own process, so a test can kill -9 it."""

    def __init__(self, settings: Settings, app_spec: str, state_dir: Path, *args: str,
                 tree: Path = ROOT, **env: str) -> None:
        """`args`: more options of `sluicegate worker`; `tree`: the source tree it runs
        from (another release's, exported); `env`: more of its environment."""
        self.settings = settings
        self.app_spec = app_spec
        self.state_dir = state_dir
        self.args = args
        self.tree = tree
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state_dir.parent / f"{state_dir.name}.log"

    def start(self) -> WorkerProcess:
        self.state_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluicegate", "worker", "--app", self.app_spec,
                 "--log-level", self.env.get("LOG_LEVEL", "INFO"), *self.args],
                cwd=self.tree, env=settings_env(self.settings, self.state_dir, **{
                    "PYTHONPATH": str(self.tree), **self.env}),
                stdout=log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def until_logged(self, text: str, since: int = 0, timeout: float = 30.0) -> None:
        """Until `text` is in the log after its first `since` characters, the worker alive."""
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text(errors="replace")[since:]:
            assert self.alive and time.monotonic() < deadline, (
                f"no {text!r} in the worker's log:\n{self.log_tail()}")
            time.sleep(0.2)


class WorkerThread:
    """A worker in this process, for tests that drive its clock directly."""

    def __init__(self, app: App, settings: Settings, clock: Clock | None = None) -> None:
        self.worker = Worker.for_app(app, settings, clock=clock)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run(self._stop.is_set)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def __enter__(self) -> Worker:
        self._thread.start()
        return self.worker

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise self.error
