"""The injectable clocks of the processing loop: the wall clock and a monotonic one.

Timers fire on wall-clock time, so tests need to move time without sleeping:
`ManualClock` inside one process, `FileClock` across processes (an integration
test writes the time, the worker it spawned reads it). The monotonic clock is the time
the worker itself has spent: a step of the wall clock (an NTP step, a VM resumed) does
not move it, so what must not fire early on a step (a run's lease) asks it too
(docs/decisions/clock-steps.md). Both move together when a test advances time; `step`
moves the wall clock alone.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

CLOCK_FILE_ENV = "SLUICEGATE_CLOCK_FILE"

# 2023-11-14T22:13:20Z: a realistic epoch-ms default, so code that formats or
# buckets timestamps behaves as it would on the wall clock.
DEFAULT_START_MS = 1_700_000_000_000


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to, and never backwards (but for `step`)."""

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self._now = start_ms
        self._mono = 0
        # Readers need no lock (an int attribute read is atomic under the GIL);
        # the lock only keeps concurrent advance() calls from losing updates.
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        return self._now

    def monotonic_ms(self) -> int:
        return self._mono

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError(f"ManualClock.advance({ms}): time cannot go backwards")
        with self._lock:
            self._now += ms
            self._mono += ms
            return self._now

    def step(self, ms: int) -> None:
        """The wall clock alone jumps by `ms` (either way), as an NTP step or a resumed
        VM moves it; no time passes for the monotonic clock."""
        with self._lock:
            self._now += ms

    def set(self, ms: int) -> None:
        with self._lock:
            if ms < self._now:
                raise ValueError(
                    f"ManualClock.set({ms}) is before the current time {self._now}: "
                    "time cannot go backwards"
                )
            self._mono += ms - self._now
            self._now = ms


class FileClock:
    """A clock whose time is the integer (epoch ms) in a file another process writes. The
    monotonic clock follows the written time, less every `step` written since."""

    # How long a read is trusted before the file is looked at again: cheap
    # enough for a hot loop, fine-grained enough for tests stepping time.
    RECHECK_NS = 5_000_000

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._now = -1
        self._stepped = 0
        self._checked_ns = 0
        self._file_id: tuple[int, int, int] | None = None

    def monotonic_ms(self) -> int:
        return self.now_ms() - self._stepped

    def now_ms(self) -> int:
        mono = time.monotonic_ns()
        if mono - self._checked_ns < self.RECHECK_NS and self._now >= 0:
            return self._now
        self._checked_ns = mono
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"clock file {self._path} does not exist: the test driving this worker's "
                f"time must call FileClock.write() before starting it (or unset {CLOCK_FILE_ENV})"
            ) from None
        # write() replaces the file by rename, so the inode changes on every
        # write; mtime alone can be too coarse to tell two quick writes apart.
        file_id = (st.st_ino, st.st_mtime_ns, st.st_size)
        if file_id != self._file_id:
            now, _, stepped = self._path.read_text().partition(" ")
            self._now, self._stepped = int(now), int(stepped or 0)
            self._file_id = file_id
        return self._now

    @staticmethod
    def write(path: str | os.PathLike[str], ms: int) -> None:
        """Set the time seen by every FileClock on `path` (atomically, never backwards)."""
        target = Path(path)
        current, stepped = FileClock._read(target)
        if current is not None and ms < current:
            raise ValueError(
                f"FileClock.write({target}, {ms}) is before the current time {current}: "
                "time cannot go backwards"
            )
        FileClock._replace(target, ms, stepped)

    @staticmethod
    def step(path: str | os.PathLike[str], ms: int) -> None:
        """The wall clock alone jumps by `ms` (either way), as `ManualClock.step`."""
        target = Path(path)
        current, stepped = FileClock._read(target)
        if current is None:
            raise FileNotFoundError(f"clock file {target} does not exist: write it first")
        FileClock._replace(target, current + ms, stepped + ms)

    @staticmethod
    def _read(target: Path) -> tuple[int | None, int]:
        try:
            now, _, stepped = target.read_text().partition(" ")
        except FileNotFoundError:
            return None, 0
        return int(now), int(stepped or 0)

    @staticmethod
    def _replace(target: Path, ms: int, stepped: int) -> None:
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{ms} {stepped}" if stepped else str(ms))
        os.replace(tmp, target)


def clock_from_env() -> Clock:
    path = os.environ.get(CLOCK_FILE_ENV)
    return FileClock(path) if path else SystemClock()
