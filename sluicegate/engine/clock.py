"""The injectable wall clock of the processing loop.

Timers fire on wall-clock time, so tests need to move time without sleeping:
`ManualClock` inside one process, `FileClock` across processes (an integration
test writes the time, the worker it spawned reads it).
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


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to, and never backwards."""

    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self._now = start_ms
        # Readers need no lock (an int attribute read is atomic under the GIL);
        # the lock only keeps concurrent advance() calls from losing updates.
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError(f"ManualClock.advance({ms}): time cannot go backwards")
        with self._lock:
            self._now += ms
            return self._now

    def set(self, ms: int) -> None:
        with self._lock:
            if ms < self._now:
                raise ValueError(
                    f"ManualClock.set({ms}) is before the current time {self._now}: "
                    "time cannot go backwards"
                )
            self._now = ms


class FileClock:
    """A clock whose time is the integer (epoch ms) in a file another process writes."""

    # How long a read is trusted before the file is looked at again: cheap
    # enough for a hot loop, fine-grained enough for tests stepping time.
    RECHECK_NS = 5_000_000

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._now = -1
        self._checked_ns = 0
        self._file_id: tuple[int, int, int] | None = None

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
            self._now = int(self._path.read_text())
            self._file_id = file_id
        return self._now

    @staticmethod
    def write(path: str | os.PathLike[str], ms: int) -> None:
        """Set the time seen by every FileClock on `path` (atomically, never backwards)."""
        target = Path(path)
        try:
            current = int(target.read_text())
        except FileNotFoundError:
            current = None
        if current is not None and ms < current:
            raise ValueError(
                f"FileClock.write({target}, {ms}) is before the current time {current}: "
                "time cannot go backwards"
            )
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(str(ms))
        os.replace(tmp, target)


def clock_from_env() -> Clock:
    path = os.environ.get(CLOCK_FILE_ENV)
    return FileClock(path) if path else SystemClock()
