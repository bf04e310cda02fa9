"""A reference engine: runs plain Python functions as workflows.

It shows the engine side of the contract: take each admitted start, report `started`,
run it, report `completed` or `failed`. Run it on its own with
`python -m examples.engine --app examples.demo`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from sluicegate.client import Delivery, Engine

log = logging.getLogger(__name__)

Function = Callable[[dict[str, Any]], None]


class FunctionEngine:
    def __init__(self, engine: Engine, functions: dict[str, Function]) -> None:
        self.engine = engine
        self.functions = functions
        self.completed = 0
        self.failed = 0

    def run(self, should_stop: Callable[[], bool]) -> None:
        while not should_stop():
            delivery = self.engine.poll(0.2)
            if delivery is not None:
                self.handle(delivery)
        self.engine.flush()

    def handle(self, delivery: Delivery) -> None:
        if delivery.command is not None:
            # Runs here are synchronous, so a cancel always finds its run already over.
            log.info("command %s for %s", delivery.command.kind.value,
                     delivery.command.execution_id)
            return
        start = delivery.admitted
        assert start is not None
        self.engine.started(delivery)
        function = self.functions.get(start.workflow)
        try:
            if function is None:
                raise LookupError(f"this engine has no function for {start.workflow}")
            function(json.loads(start.payload))
        except Exception as exc:
            self.failed += 1
            self.engine.failed(start.execution_id, start.workflow, retries_spent=0,
                               error_tag=type(exc).__name__, error_message=str(exc))
        else:
            self.completed += 1
            self.engine.completed(start.execution_id, start.workflow)


def main() -> None:
    import importlib

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--app", default="examples.demo", help="module with FUNCTIONS")
    parser.add_argument("--group", default="sg.example-engine")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    functions = importlib.import_module(args.app).FUNCTIONS
    runner = FunctionEngine(Engine(group=args.group), functions)
    with contextlib.suppress(KeyboardInterrupt):
        runner.run(lambda: False)


if __name__ == "__main__":
    main()
