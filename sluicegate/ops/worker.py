"""`sluicegate worker`: run every stage for an app's declarations until told to stop."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import io
import logging
import os
import signal
import sys
import threading
from types import FrameType

from sluicegate import tracing
from sluicegate.admission.worker import Worker
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.engine.clock import clock_from_env
from sluicegate.schemas import native

log = logging.getLogger(__name__)

# Collections of the youngest generation once this many more objects are tracked than
# freed (Python's default is 700): see settle_garbage_collector.
GC_YOUNG_THRESHOLD = 10_000


def settle_garbage_collector() -> None:
    """Once the worker's long-lived objects exist (modules, declarations, clients), keep
    Python's cyclic collector from walking them again and again, and let it run less
    often: the admission path makes many short-lived objects and no cycles, which
    reference counting frees (docs/decisions/worker-garbage-collector.md)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


# glibc's mallopt parameter for the size from which an allocation is its own mapping.
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Keep glibc from holding on to the memory RocksDB frees. Its memtables allocate 8 MiB
    blocks; glibc raises its mmap threshold past the first one freed, so the later ones
    come from the heap and stay there once freed: a worker that parked 1,000,000 keys kept
    ~490 MB it no longer used (docs/decisions/worker-memory.md). A fixed threshold maps
    and unmaps every block. Left alone when MALLOC_MMAP_THRESHOLD_ sets it, or off glibc;
    whether it was set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    return mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def warn_without_speedups() -> None:
    """One line when the C extension is not in use: the worker runs, at several times the
    CPU per start, and whoever reads its log should know why
    (docs/decisions/optional-extension.md)."""
    if native.speedups is None:
        log.warning("the C extension is %s: the codec and execution ids run in pure Python,"
                    " about 4x the CPU per start (install the wheel, or install with a C"
                    " compiler)", native.missing_because)


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set `stop` (in the main thread; a worker run in another thread
    is stopped through `stop` itself), and SIGUSR1 prints every thread's stack."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current cycle", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # `kill -USR1 <pid>`: every thread's stack on stderr, for a worker that seems stuck
    # (the process's own stderr: one replaced by a caller may have no file behind it).
    if sys.__stderr__ is not None:
        with contextlib.suppress(ValueError, io.UnsupportedOperation):
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def run_worker(app_spec: str, settings: Settings, stop: threading.Event | None = None,
               metrics_port: int | None = None,
               metrics_host: str = "127.0.0.1", leave_on_stop: bool = False) -> Worker | None:
    """Run until SIGTERM/SIGINT (or `stop`): commit what is done, then give the partitions
    back (at once with `leave_on_stop`, else when the session times out unless this worker
    is back by then). None: told to stop before it started (nothing was read or written)."""
    stop = stop or threading.Event()
    stop_on_signals(stop)
    warn_without_speedups()
    fix_mmap_threshold()
    app = load_app(app_spec, settings)
    if stop.is_set():
        log.info("stopped before it started")
        return None
    # A span per decision when an OTLP endpoint is configured (docs/decisions/traces.md).
    traced = tracing.configure(settings)
    if traced:
        log.info("a span per decision, exported to %s", tracing.otlp_endpoint(settings))
    worker = Worker.for_app(app, settings, clock=clock_from_env(), leave_on_stop=leave_on_stop)
    settle_garbage_collector()
    if metrics_port is not None:
        from sluicegate.ops.services.metrics import serve_worker_metrics

        worker.metrics = serve_worker_metrics(metrics_port, metrics_host)
        log.info("metrics on %s:%d/metrics", metrics_host, metrics_port)

    log.info("worker %s: %d workflows, state in %s", worker.worker_id, len(app.workflows),
             settings.state_dir)
    try:
        worker.run(stop.is_set)
    finally:
        if traced:
            tracing.shutdown()
    return worker
