"""Recovery after a crash: how soon a worker killed with kill -9 and started again at once
admits again.

    .venv/bin/python -m bench.recovery --rounds 10

One worker (`bench.apps`, the passthrough) admits a steady stream of starts (`--rate` a
second) on a broker of its own. Each round kills it (SIGKILL) once it is admitting, starts
it again at once with the same state directory, and times the new process: from its
spawn to the first admission a read_committed reader sees from it (the first ledger row it
decided), and the phases its log shows (spawn to its partitions assigned, to every task
restored). The median over the rounds is what docs/benchmarks.md reports.

The broker is `SLUICEGATE_BOOTSTRAP` if set; otherwise a local Kafka is started on free
ports with a temporary data dir and stopped at the end.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.apps import WORKFLOW, app
from bench.passthrough import broker
from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _spawn(settings: Settings, state_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {
        "SLUICEGATE_BOOTSTRAP": settings.bootstrap,
        "SLUICEGATE_NAMESPACE": settings.namespace,
        "SLUICEGATE_STATE_DIR": str(state_dir),
        "PATH": "/usr/bin:/bin",
    }
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sluicegate", "worker", "--app",
                                 "bench.apps"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _logged_at(log: Path, text: str, after: float, last: bool = False) -> float | None:
    """The wall-clock time of the first (or last) log line containing `text` after `after`."""
    found = None
    for line in log.read_text(errors="replace").splitlines():
        match = _STAMP.match(line)
        if not match or text not in line:
            continue
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at >= after:
            found = at
            if not last:
                return found
    return found


class FirstAdmission:
    """Reads the ledger from its end and notes when it sees a decision made after a time."""

    def __init__(self, settings: Settings) -> None:
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"bench-recovery-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "fetch.wait.max.ms": 10}))
        topic = Topics(settings).ledger
        partitions = self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        self._consumer.assign([TopicPartition(topic, p, -1) for p in partitions])

    def after(self, since_ms: int, timeout_s: float = 60.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(1000, timeout=0.05):
                if msg.error() is not None or msg.value() is None:
                    continue
                row = codec.decode(LedgerRecord, msg.value())
                if row.decided_at_ms >= since_ms:
                    return time.time()
        raise TimeoutError(f"no admission decided after {since_ms} within {timeout_s}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rate", type=float, default=200.0, help="starts per second")
    parser.add_argument("--partitions", type=int, default=Settings().partitions)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sg-recovery-"))
    with broker() as bootstrap:
        settings = Settings(bootstrap=bootstrap, namespace=f"rec{uuid.uuid4().hex[:6]}.",
                            partitions=args.partitions, state_dir=work / "state")
        create_topics(settings)
        stop = threading.Event()

        def produce() -> None:
            with Client(app=app, settings=settings, replies=False) as client:
                n = 0
                while not stop.is_set():
                    client.submit(WORKFLOW, {"orderId": f"o{n}", "customer": "c", "amount": n})
                    n += 1
                    time.sleep(1 / args.rate)

        traffic = threading.Thread(target=produce, daemon=True)
        traffic.start()
        log = work / "worker.log"
        reader = FirstAdmission(settings)
        worker = _spawn(settings, settings.state_dir, log)
        reader.after(int(time.time() * 1000), timeout_s=120)  # admitting: ready to kill
        rows = []
        try:
            for i in range(args.rounds):
                time.sleep(1.0)
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                spawned = time.time()
                worker = _spawn(settings, settings.state_dir, log)
                admitted = reader.after(int(spawned * 1000))
                assigned = _logged_at(log, "assigned partitions", spawned)
                ready = _logged_at(log, " ready,", spawned, last=True)
                rows.append((admitted - spawned,
                             None if assigned is None else assigned - spawned,
                             None if ready is None else ready - spawned))
                print(f"round {i + 1}: first admission {rows[-1][0]:.2f}s after the restart"
                      f" (assigned {rows[-1][1] or float('nan'):.2f}s, restored "
                      f"{rows[-1][2] or float('nan'):.2f}s)", flush=True)
        finally:
            stop.set()
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
    first = [r[0] for r in rows]
    print(f"\nfirst admission after kill -9 + restart: median {statistics.median(first):.2f}s,"
          f" min {min(first):.2f}s, max {max(first):.2f}s over {len(first)} rounds")
    for name, col in (("partitions assigned", 1), ("every task restored", 2)):
        values = [r[col] for r in rows if r[col] is not None]
        if values:
            print(f"  {name}: median {statistics.median(values):.2f}s after the restart")


if __name__ == "__main__":
    main()
