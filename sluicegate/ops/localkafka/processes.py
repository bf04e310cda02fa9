"""What the local services (the Kafka broker, the schema registry) share as processes:
finding Java, free ports, and starting, recognising and stopping a detached JVM."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

HOST = "127.0.0.1"
LOG_TAIL_LINES = 30

# Services started by this process. Holding their Popen objects keeps subprocess from
# warning that a (deliberately detached) child is "still running" when it is collected.
children: dict[int, subprocess.Popen[bytes]] = {}


def find_java(min_major: int, needed_by: str, error: type[Exception]) -> str:
    """The `java` on PATH, if it is at least Java `min_major`; else `error` saying why."""
    java = shutil.which("java")
    if java is None:
        raise error(f"`java` not found on PATH: {needed_by} needs Java {min_major}+")
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    # `java -version` prints to stderr: 'openjdk version "17.0.15"' or 'java version "1.8.0_x"'.
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if match is None:
        raise error(f"could not read the Java version from `{java} -version`")
    major = int(match.group(1))
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < min_major:
        raise error(f"{java} is Java {major}; {needed_by} needs Java {min_major}+")
    return java


def find_maven(needed_for: str, error: type[Exception]) -> str:
    """The `mvn` on PATH; else `error` saying what it is needed for (once, then cached)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"`mvn` not found on PATH: Maven is needed once to {needed_for}")
    return mvn


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something holds `port` on `host` (a listener, or a socket bound without reuse)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR so a stopped service's TIME_WAIT connections don't count as "in use";
        # a live listener still makes bind fail.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(count: int = 1) -> list[int]:
    """`count` distinct ports the OS considers free right now (for throwaway test services)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind((HOST, 0))  # all held open at once, so the OS hands out distinct ports
        return [s.getsockname()[1] for s in socks]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return ""  # Linux, and the process is gone
    except OSError:
        return ""
    # No /proc (macOS): ask ps.
    result = subprocess.run(
        ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, check=False
    )
    return result.stdout.strip()


def reap(pid: int) -> None:
    # If the service is our own child (tests start and stop it in one process) and has
    # exited, collect it; otherwise it lingers as a zombie that still "exists" for kill(pid, 0).
    child = children.get(pid)
    if child is not None:
        if child.poll() is not None:
            del children[pid]
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still passes kill(pid, 0); it has no cmdline left.
    return bool(cmdline(pid))


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM (a controlled shutdown), then SIGKILL if it has not exited after `timeout` s."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 5.0
            while alive(pid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)
            return
        time.sleep(0.1)


def start_detached(cmd: list[str], data_dir: Path, log: Path, pid_file: Path,
                   wait_until_ready: Callable[[subprocess.Popen[bytes]], None]) -> int:
    """Start a service in its own session (Ctrl-C in the terminal that started it must not
    reach it), logging to `log` (the previous run's log kept as `.log.1`) and its pid in
    `pid_file`; `wait_until_ready(proc)` raises if it never comes up, and the service is
    then stopped again. Returns its pid."""
    if log.exists():
        log.replace(log.with_suffix(".log.1"))
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=data_dir, start_new_session=True)
    children[proc.pid] = proc
    pid_file.write_text(f"{proc.pid}\n")
    try:
        wait_until_ready(proc)
    except Exception:
        terminate(proc.pid, 10.0)
        pid_file.unlink(missing_ok=True)
        raise
    return proc.pid


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
