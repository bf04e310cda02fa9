"""An engine instance on a share group, in a process of its own so a test can kill it:
`python -m tests.integration.share_engine --group G --name N --begun FILE [--capacity C]
[--hang]`, settings from the environment (SLUICEGATE_BOOTSTRAP, SLUICEGATE_NAMESPACE).

It runs at most `capacity` runs at once and asks for a start only when it has room, so a
busy instance leaves the next start to another. A run holds its payload's `holdMs`, then
completes; with `--hang` it never ends (an instance that dies mid-run). The runs begun are
kept in a SQLite file every instance shares (an insert under a unique execution id), so a
start redelivered to another instance after this one died is not run twice. Each line of
its output is one event: `up`, `started <execution id> <delivery count>`, `dropped
<execution id> <delivery count>` (begun before, maybe by another instance), `completed
<execution id>`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import threading
from pathlib import Path

from sluicegate.client import Engine


class SharedRuns:
    """The runs begun, in a SQLite file the instances on this machine share (in production
    the engine's own database)."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None,
                                   check_same_thread=False)

    @staticmethod
    def create(path: Path) -> None:
        """Make the file once, before any instance opens it: switching a file to WAL takes
        a lock that SQLite does not wait for, so five instances switching it at once can
        fail with "database is locked". The mode stays with the file."""
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS begun (execution_id TEXT PRIMARY KEY)")
        finally:
            db.close()

    def claim(self, execution_id: str) -> bool:
        cursor = self._db.execute("INSERT OR IGNORE INTO begun VALUES (?)", (execution_id,))
        return cursor.rowcount == 1


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--begun", required=True, type=Path)
    parser.add_argument("--capacity", type=int, default=1)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = Engine(group=args.group, share_group=True, instance=args.name,
                    begun=SharedRuns(args.begun))
    room = threading.Semaphore(args.capacity)

    def finish(execution_id: str, workflow: str) -> None:
        engine.completed(execution_id, workflow)
        say(f"completed {execution_id}")
        room.release()

    say("up")
    runs = 0
    try:
        while not stop.is_set():
            if not room.acquire(timeout=0.1):
                continue
            delivery = engine.poll(0.1)
            start = delivery.admitted if delivery is not None else None
            if delivery is None or start is None:
                room.release()
                continue
            runs += 1
            if not engine.started(delivery, run_id=f"{args.name}:{runs}"):
                say(f"dropped {start.execution_id} {delivery.delivery_count}")
                room.release()
                continue
            say(f"started {start.execution_id} {delivery.delivery_count}")
            if not args.hang:
                hold = json.loads(start.payload)["holdMs"] / 1000
                threading.Timer(hold, finish, (start.execution_id, start.workflow)).start()
    finally:
        engine.close()


if __name__ == "__main__":
    main()
