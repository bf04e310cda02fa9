"""A reference engine: runs plain Python functions as workflows.

It shows the engine side of the contract: take each admitted start, report `started`,
run it, report `completed` or `failed`, and while it runs, send a heartbeat as often as
its admitted start asks (`heartbeat_every_ms`, a quarter of its lease), or a run longer
than its lease is taken for lost. Run it on its own with
`python -m examples.engine --app examples.demo`.

Each workflow's runs go to a thread pool of their own, as wide as the workflow's
concurrency limit (one thread for a workflow without one), so that the limit, not this
engine, is what bounds how many run at once: a single-threaded engine would run two
reports of a `limit=2` workflow one after the other and its queue would grow.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sluicegate.client import Delivery, Engine
from sluicegate.declare import App

log = logging.getLogger(__name__)

Function = Callable[[dict[str, Any]], None]


def widths(app: App) -> dict[str, int]:
    """How many runs of each workflow may run at once: its narrowest concurrency limit."""
    return {name: min(c.limit for c in wf.concurrency)
            for name, wf in app.workflows.items() if wf.concurrency}


class FunctionEngine:
    def __init__(self, engine: Engine, functions: dict[str, Function],
                 widths: Mapping[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.functions = functions
        self.widths = dict(widths or {})
        self.completed = 0
        self.failed = 0
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._counted = threading.Lock()
        self._clock = clock
        # The runs that asked for heartbeats: execution id -> (workflow, every s, next due).
        self._beating: dict[str, tuple[str, float, float]] = {}

    def run(self, should_stop: Callable[[], bool]) -> None:
        try:
            while not should_stop():
                delivery = self.engine.poll(0.2)
                if delivery is not None:
                    self.handle(delivery)
                self.beat()
        finally:
            for pool in self._pools.values():
                pool.shutdown(wait=True)
            self.engine.flush()

    def handle(self, delivery: Delivery) -> None:
        if delivery.command is not None:
            # Runs here cannot be interrupted: a cancel finds its run over or lets it end.
            log.info("command %s for %s", delivery.command.kind.value,
                     delivery.command.execution_id)
            return
        start = delivery.admitted
        assert start is not None
        # Reported (and its start acknowledged) from the polling thread, before it runs;
        # a start of a run begun before (delivered twice) is not run again.
        if not self.engine.started(delivery):
            log.info("start of %s delivered again: already begun here", start.execution_id)
            return
        if delivery.heartbeat_every_ms is not None:
            every = delivery.heartbeat_every_ms / 1000
            with self._counted:
                self._beating[start.execution_id] = (start.workflow, every,
                                                     self._clock() + every)
        pool = self._pools.get(start.workflow)
        if pool is None:
            width = self.widths.get(start.workflow, 1)
            pool = self._pools[start.workflow] = ThreadPoolExecutor(
                max_workers=width, thread_name_prefix=f"engine-{start.workflow}")
        pool.submit(self._execute, start.execution_id, start.workflow, start.payload)

    def beat(self) -> None:
        """A heartbeat for each run still running whose time for one has come."""
        now = self._clock()
        with self._counted:
            due = [(eid, wf, every) for eid, (wf, every, at) in self._beating.items()
                   if at <= now]
            for eid, wf, every in due:
                self._beating[eid] = (wf, every, now + every)
        for eid, wf, _ in due:
            self.engine.heartbeat(eid, wf)

    def _execute(self, execution_id: str, workflow: str, payload: bytes) -> None:
        try:
            self._call(execution_id, workflow, payload)
        finally:
            with self._counted:
                self._beating.pop(execution_id, None)

    def _call(self, execution_id: str, workflow: str, payload: bytes) -> None:
        function = self.functions.get(workflow)
        try:
            if function is None:
                raise LookupError(f"this engine has no function for {workflow}")
            function(json.loads(payload))
        except Exception as exc:
            with self._counted:
                self.failed += 1
            self.engine.failed(execution_id, workflow, retries_spent=0,
                               error_tag=type(exc).__name__, error_message=str(exc))
        else:
            with self._counted:
                self.completed += 1
            self.engine.completed(execution_id, workflow)


def main() -> None:
    import importlib

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", default="examples.demo", help="module with FUNCTIONS")
    parser.add_argument("--group", default="sg.example-engine")
    parser.add_argument("--share-group", action="store_true",
                        help="take admitted starts in a share group (Kafka 4.2 or later)")
    parser.add_argument("--instance", help="with --share-group: this instance's name, kept "
                        "across restarts (its commands resume where they stopped)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    module = importlib.import_module(args.app)
    engine = Engine(group=args.group, share_group=args.share_group, instance=args.instance)
    runner = FunctionEngine(engine, module.FUNCTIONS, widths(module.app))
    with contextlib.suppress(KeyboardInterrupt):
        runner.run(lambda: False)


if __name__ == "__main__":
    main()
