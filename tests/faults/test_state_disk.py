"""The state directory's disk misbehaves: a store's files are corrupted, or the disk is
full. The worker says so in one line, rebuilds from the changelogs what it cannot trust,
and loses nothing, admits nothing twice, and never exits (docs/decisions/runtime-faults.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.schemas.records import Outcome
from sluicegate.topology.admin import create_topics
from tests.apps.faults import app
from tests.faults.harness import APP, MARKS, Outcomes
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS


def _corrupt_a_table_file(store: Path) -> str:
    sst = min(store.glob("*.sst"))
    sst.write_bytes(sst.read_bytes()[: sst.stat().st_size // 2])
    return sst.name


def _corrupt_current(store: Path) -> str:
    (store / "CURRENT").write_bytes(b"\x00garbage")
    return "CURRENT"


def _corrupt_manifest(store: Path) -> str:
    manifest = min(store.glob("MANIFEST-*"))
    data = bytearray(manifest.read_bytes())
    for i in range(8, min(len(data), 64)):
        data[i] ^= 0xFF
    manifest.write_bytes(bytes(data))
    return manifest.name


def _decide(client: Client, outcomes: Outcomes, workflow: str, payload: dict[str, object],
            ) -> Outcome:
    request = client.submit(workflow, payload).request_id
    client.flush()
    outcomes.wait_until_decided({request}, timeout_s=60)
    (row,) = outcomes.final()[request]
    return row.outcome


@pytest.mark.parametrize("corrupt", [_corrupt_a_table_file, _corrupt_current,
                                     _corrupt_manifest],
                         ids=["truncated-sst", "garbage-current", "garbage-manifest"])
def test_a_store_that_cannot_be_opened_is_moved_aside_and_rebuilt(
        settings: Settings, tmp_path: Path, corrupt: object) -> None:
    # A RocksDB store's files, corrupted: the in-memory backend has none.
    settings = dataclasses.replace(settings, partitions=1, state_backend="rocksdb")
    create_topics(settings)
    worker = WorkerProcess(settings, APP, tmp_path / "w")
    outcomes = Outcomes(settings)
    try:
        with Client(app=app, settings=settings, replies=False) as client:
            worker.start()
            assert _decide(client, outcomes, "sendReceipt",
                           {"orderId": "o1", "amount": 1}) is Outcome.admitted
            assert worker.stop() == 0, worker.log_tail()
            store = tmp_path / "w" / "identity" / "0"
            assert list(store.glob("*.sst")), "the identity store wrote no table file"
            broken = corrupt(store)  # type: ignore[operator]
            worker.start()
            # The spent key is still spent: the store was rebuilt from its changelog.
            assert _decide(client, outcomes, "sendReceipt",
                           {"orderId": "o1", "amount": 1}) is Outcome.existing
            assert _decide(client, outcomes, "sendReceipt",
                           {"orderId": "o2", "amount": 2}) is Outcome.admitted
            assert worker.alive, worker.log_tail()
    finally:
        if worker.alive:
            worker.stop()
        outcomes.close()
    log = worker.log.read_text()
    (line,) = [ln for ln in log.splitlines() if "cannot be opened" in ln]
    assert "WARNING" in line and str(store) in line, line
    assert broken in line or "CURRENT" in line or "MANIFEST" in line, line
    assert "Traceback" not in log
    (aside,) = store.parent.glob("0.unreadable-*")
    assert (aside / broken).exists() or broken == "CURRENT"


@contextlib.contextmanager
def small_disk(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB at `path` (root only)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                           str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(disk: Path) -> Path:
    """Fill the disk to its last byte."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_is_said_once_commits_nothing_and_resumes_when_there_is_room(
        settings: Settings, tmp_path: Path) -> None:
    # The RocksDB stores' disk fills: the in-memory backend writes none.
    settings = dataclasses.replace(settings, partitions=2, state_backend="rocksdb")
    create_topics(settings)
    with small_disk(tmp_path / "disk", 64) as disk:
        worker = WorkerProcess(settings, APP, disk / "state")
        worker.log = tmp_path / "worker.log"  # off the disk that fills
        joiner = WorkerProcess(settings, APP, tmp_path / "joiner")
        outcomes = Outcomes(settings)
        try:
            with Client(app=app, settings=settings, replies=False) as client:
                worker.start()
                before = [client.submit("sendReceipt", {"orderId": f"o{i}", "amount": i})
                          .request_id for i in range(50)]
                client.flush()
                outcomes.wait_until_decided(set(before), timeout_s=60)
                filler = _fill(disk)
                during = [client.submit("sendReceipt", {"orderId": f"p{i}", "amount": i})
                          .request_id for i in range(50)]
                client.flush()
                worker.until_logged("has no room")
                outcomes.settle(3.0)
                assert not set(during) & set(outcomes.final()), (
                    "a start was decided while the state directory had no room")
                # A rebalance while the disk is full: the worker gives up a partition (its
                # stores cannot flush as they close) and goes on.
                joiner.start()
                outcomes.settle(10.0)
                assert worker.alive, worker.log_tail()
                # Stopped and started again on the full disk: it stops cleanly, then waits.
                assert worker.stop() == 0, worker.log_tail()
                restarted_at = len(worker.log.read_text())
                worker.start()
                worker.until_logged("has no room", since=restarted_at)
                filler.unlink()
                outcomes.wait_until_decided(set(during), timeout_s=90)
                repeats = [client.submit("sendReceipt", {"orderId": f"o{i}", "amount": i})
                           .request_id for i in range(5)]
                client.flush()
                outcomes.wait_until_decided(set(repeats), timeout_s=60)
                outcomes.settle(3.0)
                assert worker.alive, worker.log_tail()
        finally:
            for w in (worker, joiner):
                if w.alive:
                    assert w.stop() == 0, w.log_tail()
            outcomes.close()
        log = worker.log.read_text()
    final = outcomes.final()
    assert all(len(final[r]) == 1 for r in before + during + repeats)
    assert {final[r][0].outcome for r in repeats} == {Outcome.existing}
    executions = Counter(a.execution_id for a in outcomes.admitted.records)
    assert not [e for e, n in executions.items() if n > 1], "an execution admitted twice"
    for run in (log[:restarted_at], log[restarted_at:]):
        errors = [ln for ln in run.splitlines() if "ERROR" in ln]
        assert len(errors) == 1, errors
        assert str(disk / "state") in errors[0] and "free" in errors[0], errors[0]
    assert "Traceback" not in log
    assert "has room again" in log[restarted_at:]
