"""SIGTERM and SIGINT from the process's first moment (docs/decisions/stop-from-the-start.md).

A worker stops gracefully on SIGTERM or SIGINT, but its handlers could only be installed
once its command ran: after the command line's imports, the broker probe and the app's
load, a second or more. A supervisor's SIGTERM in that window killed it (exit -15, 143 in
a shell) and a Ctrl-C showed a traceback of whatever was importing. So the command line's
entry point (`sluicegate.ops.cli.entry`: the `sluicegate` script and `python -m
sluicegate`) first *keeps* both signals, before importing anything else; then the command
decides what a stop means: the worker takes the kept stop as its own (`STOP`), every
other command gets the default behaviour back (`release`), with a signal kept meanwhile
acted on there and then. `ctrl_c_stops` is for the commands that run until Ctrl-C.

Light on purpose: nothing but the standard library is imported before the handlers are.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

# Set by a kept signal, and by the worker's own handlers once it has them.
STOP = threading.Event()
_kept: int | None = None  # the first signal kept
_holding = False


def _keep(signum: int, _frame: FrameType | None) -> None:
    global _kept
    if _kept is None:
        _kept = signum
    STOP.set()


def hold() -> None:
    """Keep SIGTERM and SIGINT, until a command takes them (`release`, or the worker's
    handlers): each sets `STOP` and is remembered, nothing more."""
    global _holding
    _holding = True
    # SIGINT first: Python catches it from its own start (KeyboardInterrupt), SIGTERM only
    # from here, so a caught SIGTERM says both are kept (the tests wait for that).
    signal.signal(signal.SIGINT, _keep)
    signal.signal(signal.SIGTERM, _keep)


def holding() -> bool:
    """Whether the signals are kept: the command line was started through `main`, and no
    command has given them back yet."""
    return _holding


def release() -> None:
    """The default behaviour again (SIGTERM ends the process, SIGINT raises
    KeyboardInterrupt), for a command with no graceful stop of its own; a signal kept
    until now is acted on now. Nothing to do unless `hold` ran (the command line was
    started through `main`, not called in-process)."""
    global _holding
    if not _holding:
        return
    _holding = False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if _kept == signal.SIGINT:
        raise KeyboardInterrupt
    if _kept is not None:
        signal.raise_signal(signal.SIGTERM)


def ctrl_c_stops() -> None:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt in this process even when it was started
    with SIGINT ignored (a background job of a non-interactive shell, nohup), where
    Python leaves an inherited SIG_IGN in place. Only the main thread can set it."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
