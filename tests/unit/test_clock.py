from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluicegate.engine.clock import (
    CLOCK_FILE_ENV,
    FileClock,
    ManualClock,
    SystemClock,
    clock_from_env,
)


def test_system_clock_is_the_wall_clock_in_ms() -> None:
    before = time.time_ns() // 1_000_000
    now = SystemClock().now_ms()
    assert before <= now <= time.time_ns() // 1_000_000


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1_000)
    assert clock.now_ms() == 1_000
    assert clock.advance(250) == 1_250
    clock.set(2_000)
    assert clock.now_ms() == 2_000
    clock.set(2_000)


def test_manual_clock_never_goes_backwards() -> None:
    clock = ManualClock(1_000)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(999)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    assert clock.now_ms() == 1_000


def test_manual_clock_loses_no_advance_from_concurrent_threads() -> None:
    clock = ManualClock(0)
    seen: list[int] = []

    def advance() -> None:
        for _ in range(10_000):
            clock.advance(1)

    def read() -> None:
        for _ in range(10_000):
            seen.append(clock.now_ms())

    threads = [threading.Thread(target=advance) for _ in range(4)]
    threads.append(threading.Thread(target=read))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.now_ms() == 40_000
    assert seen == sorted(seen)


def test_file_clock_reads_the_time_another_process_wrote(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    clock = FileClock(path)
    for ms in (1_000, 5_000):
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from sluicegate.engine.clock import FileClock; "
                "FileClock.write(sys.argv[1], int(sys.argv[2]))",
                str(path),
                str(ms),
            ],
            check=True,
        )
        assert _eventually(clock.now_ms, ms)


def test_file_clock_sees_quick_successive_writes(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    clock = FileClock(path)
    for ms in range(100, 110):
        FileClock.write(path, ms)
        assert _eventually(clock.now_ms, ms)


def test_file_clock_caches_between_rechecks(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    FileClock.write(path, 10)
    clock = FileClock(path)
    clock.RECHECK_NS = 10**12
    assert clock.now_ms() == 10
    FileClock.write(path, 20)
    assert clock.now_ms() == 10


def test_file_clock_writes_never_go_backwards(tmp_path: Path) -> None:
    path = tmp_path / "clock"
    FileClock.write(path, 10)
    with pytest.raises(ValueError, match="backwards"):
        FileClock.write(path, 9)
    assert FileClock(path).now_ms() == 10


def test_a_missing_clock_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"FileClock\.write"):
        FileClock(tmp_path / "absent").now_ms()


def test_clock_from_env_uses_the_file_when_the_variable_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "clock"
    FileClock.write(path, 42)
    monkeypatch.setenv(CLOCK_FILE_ENV, str(path))
    clock = clock_from_env()
    assert isinstance(clock, FileClock)
    assert clock.now_ms() == 42
    monkeypatch.delenv(CLOCK_FILE_ENV)
    assert isinstance(clock_from_env(), SystemClock)


def _eventually(read: Callable[[], int], expected: int, timeout_s: float = 1.0) -> bool:
    # FileClock may serve a cached value for up to RECHECK_NS.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if read() == expected:
            return True
        time.sleep(0.001)
    return False
