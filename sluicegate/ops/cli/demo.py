"""`sluicegate demo`: the whole loop on one machine, with every decision printed.

A local broker, the topics, a worker (its own process, as in production), the reference
engine, and demo traffic; the ledger is tailed and each decision printed as it happens.
Ctrl-C stops the traffic, the engine and the worker; the broker keeps running.
"""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from rich.console import Console

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.ops.cli.output import print_decision
from sluicegate.ops.localkafka.broker import ensure_broker
from sluicegate.ops.services.readers import Tail
from sluicegate.ops.signals import ctrl_c_stops
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord
from sluicegate.topology.admin import create_topics
from sluicegate.topology.route import routes
from sluicegate.topology.topics import Topics


def run_demo(port: int, app_module: str, per_second: float) -> None:
    ctrl_c_stops()
    console = Console(soft_wrap=True)
    console.print(f"[bold]starting a local Kafka broker on 127.0.0.1:{port}[/] "
                  "(the first start fetches its jars with Maven)")
    broker = ensure_broker(port=port, controller_port=port + 1)
    settings = Settings().with_(bootstrap=broker.bootstrap,
                                state_dir=Path.cwd() / ".sluicegate" / "demo-worker")
    module = importlib.import_module(app_module)
    report = create_topics(settings, module.app)
    console.print(f"topics: {len(report.created)} created, {len(report.existing)} already there")
    for route in routes(module.app):
        console.print(f"  route {route.describe()}", markup=False, highlight=False)

    env = dict(os.environ, SLUICEGATE_BOOTSTRAP=settings.bootstrap,
               SLUICEGATE_STATE_DIR=str(settings.state_dir))
    worker = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "worker", "--app", app_module,
         "--log-level", "WARNING"], env=env)
    stop = threading.Event()
    from examples.engine import FunctionEngine, widths

    engine = FunctionEngine(Engine(group=f"{settings.namespace}demo-engine", settings=settings),
                            module.FUNCTIONS, widths(module.app))
    client = Client(app=module.app, settings=settings, replies=False)
    threads = [
        threading.Thread(target=engine.run, args=(stop.is_set,), daemon=True),
        threading.Thread(target=module.traffic, args=(client, stop, per_second), daemon=True),
    ]
    tail = Tail(settings, Topics(settings).ledger, f"{settings.namespace}demo-tail")
    for thread in threads:
        thread.start()
    console.print("[bold]worker, engine and traffic running; each decision prints below. "
                  "Ctrl-C stops.[/]")
    try:
        while worker.poll() is None:
            for msg in tail.records(0.2):
                value = msg.value()
                if value is not None:
                    print_decision(console, codec.decode(LedgerRecord, value))
        console.print(f"[bold red]the worker exited with code {worker.returncode}[/]")
    except KeyboardInterrupt:
        console.print("\nstopping: traffic, engine, worker")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        client.close()
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
        tail.close()
        console.print(f"engine: {engine.completed} completed, {engine.failed} failed. "
                      f"The broker keeps running; `{kafka_down_command(port)}` stops it.",
                      markup=False, highlight=False)


def kafka_down_command(port: int, *, executable: str = sys.executable,
                       cwd: Path | None = None, path: str | None = None) -> str:
    """The command that stops the demo's broker, as typed where the demo ran: `make demo`
    runs `.venv/bin/sluicegate` without putting it on PATH, so the command names the
    script beside this Python (relative to `cwd` when it is under it) unless PATH finds
    that same script as `sluicegate`."""
    script = Path(executable).parent / "sluicegate"
    found = shutil.which("sluicegate", path=path)
    if found is not None and Path(found) == script:
        name = "sluicegate"
    else:
        try:
            name = str(script.relative_to(cwd or Path.cwd()))
        except ValueError:
            name = str(script)
    return f"{name} kafka down --port {port}"
