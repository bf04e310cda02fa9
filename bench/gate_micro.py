"""The concurrency gate's CPU per start in memory, without a broker, at several queue depths.

`python -m bench.gate_micro [--depths 1000,10000,100000] [--starts N] [--priority age]
[--through-topics] [--profile]`

The worker's own stages run as the worker runs them in one task, in the test driver
(`sluicegate.testing`) running only these three and keeping only the admitted starts:
identity hands each start over to the concurrency stage, which admits it or queues it
behind its key's limit; an admitted start is handed over to the runs stage, and an engine
completes each run as soon as it sees it (a `completed` run event into the runs stage,
whose release is handed back to the concurrency stage, which admits the next start
waiting). The hops to the concurrency stage are handed over in order, in-process, as a
worker does once it has caught up with its partitions; with `--through-topics` they are
written to the stage's topic and read back, as before a worker has caught up. The stores
are the worker's default backend (in memory). Every `--commit-every` records are one
cycle of the worker's: the timers due fire at its end, then the stores commit. The records
per start count every record written, the ledger's and the changelogs' included.

For each depth D, the keys' slots are filled and D starts are queued first (not timed);
then `--starts` more arrive, each followed by the engine completing one run, so the queue
stays D deep while every measured start is queued, admitted from the queue, run and
released. The figure is CPU per start over that window: what a gated start costs the
worker besides Kafka. Flat across depths is the point (issue 15). With `--priority` each
key's queue is ordered by the starts' priority (strict or age mode), so a newcomer lands
anywhere in it, not behind the last.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import time
from collections import deque

from pydantic import BaseModel

from bench.records import StartMaker
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Priority, Workflow
from sluicegate.ops.worker import settle_garbage_collector
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedStart, RunEventKind
from sluicegate.testing import TestDriver
from sluicegate.topology.topics import Topics


class Job(BaseModel):
    id: str
    grp: str
    prio: int = 0


WORKFLOW = "gate"


def gate_app(limit: int, priority: str = "none") -> App:
    """`priority` none, strict or age: ordered by each start's `prio` (-600..600)."""
    return App([Workflow(name=WORKFLOW, payload=Job,
                         concurrency=[Concurrency(limit=limit, key="grp")],
                         priority=None if priority == "none"
                         else Priority(expr="prio", mode=priority))])


class Gate:
    """identity -> concurrency -> runs in memory, with an engine that completes at once."""

    def __init__(self, app: App, through_topics: bool = False) -> None:
        settings = Settings(partitions=1)
        self.topics = Topics(settings)
        # Its stores in a temporary directory of its own, deleted at close.
        self.driver = TestDriver(app, settings, stages=("identity", "concurrency", "runs"),
                                 keep=(self.topics.admitted,), in_order=not through_topics)
        self.admitted = 0

    def arrive(self, value: bytes) -> None:
        self.driver.pipe(self.topics.starts, value)

    def admitted_since(self) -> list[AdmittedStart]:
        """The admitted starts sent since the last call (the engine's input)."""
        out = [codec.decode(AdmittedStart, written.value)
               for written in self.driver.take(self.topics.admitted)
               if written.value is not None]
        self.admitted += len(out)
        return out

    def complete(self, start: AdmittedStart) -> None:
        self.driver.report(start.execution_id, RunEventKind.completed,
                           workflow=start.workflow)

    def close(self) -> None:
        self.driver.close()


def records(driver: TestDriver) -> int:
    """Every record the driver's stages have written (kept or only counted), changelogs
    and the ledger included; a start handed over in-process is none."""
    return sum(driver.counts().values())


def instrument(on: bool) -> None:
    """Callgrind's instrumentation on or off in this process (run under `valgrind
    --tool=callgrind --instr-atstart=no`, as bench.instructions --depth does): the starts
    queued first are not counted, and not slowed fifty times over."""
    subprocess.run(["callgrind_control", "--instr=" + ("on" if on else "off"),
                    str(os.getpid())], check=True, capture_output=True)


def run(depth: int, starts: int, keys: int, limit: int, commit_every: int,
        profiler: cProfile.Profile | None = None, priority: str = "none",
        at_once: bool = False, counts: dict[str, float] | None = None,
        through_topics: bool = False, made: int = 0, window: bool = False) -> float:
    """CPU per start; `at_once`: each run completes before the next start arrives, which
    then takes the slot it freed at once (nothing queued: `depth` is ignored). `counts`
    gets the records written per measured start. `window`: callgrind counts the measured
    starts only (`instrument`)."""
    if at_once:
        depth = 0
    app = gate_app(limit, priority)
    maker = StartMaker(app)
    # The starts as the SDK makes them (validated, keyed, encoded): at least `made` of
    # them, so two runs given the same `made` do the producer's work alike and a
    # difference between them counts the worker's alone (bench.instructions).
    values = [maker.make_payload(WORKFLOW, {"id": f"j{i}", "grp": f"k{i % keys}",
                                            "prio": (i * 7919) % 1201 - 600})
              for i in range(keys * limit + depth + max(starts, made))]
    gate = Gate(app, through_topics)
    try:
        engine: deque[AdmittedStart] = deque()
        fill = keys * limit + depth
        # A cycle of the worker per `commit_every` records: its timers fire, then it commits.
        for first in range(0, fill, commit_every):
            with gate.driver.cycle():
                for value in values[first:min(first + commit_every, fill)]:
                    gate.arrive(value)
        engine.extend(gate.admitted_since())
        assert len(engine) == keys * limit, (len(engine), keys * limit)
        admitted_before = gate.admitted
        settle_garbage_collector()
        # Two records a start: its own, and the report of the run it lets through.
        per_cycle = max(1, commit_every // 2)
        written = records(gate.driver)
        t0 = time.process_time()
        if profiler:
            profiler.enable()
        if window:
            instrument(True)
        end = fill + starts
        for first in range(fill, end, per_cycle):
            with gate.driver.cycle():
                for value in values[first:min(first + per_cycle, end)]:
                    if at_once:
                        gate.complete(engine.popleft())
                        gate.arrive(value)
                    else:
                        gate.arrive(value)
                        gate.complete(engine.popleft())
                    engine.extend(gate.admitted_since())
        if window:
            instrument(False)
        if profiler:
            profiler.disable()
        us = (time.process_time() - t0) / starts * 1e6
        if counts is not None:
            counts["records"] = (records(gate.driver) - written) / starts
        # Every completion admitted exactly one start from the queue.
        assert gate.admitted - admitted_before == starts, (gate.admitted, admitted_before)
    finally:
        gate.close()
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depths", default="1000,10000,100000")
    parser.add_argument("--starts", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--priority", choices=("none", "strict", "age"), default="none",
                        help="order each key's queue by the starts' priority (-600..600)")
    parser.add_argument("--at-once", action="store_true",
                        help="each start takes a slot freed just before it: none queues")
    parser.add_argument("--through-topics", action="store_true",
                        help="the hops to the concurrency stage go through its topic, as "
                             "before a worker has caught up (by default handed over)")
    parser.add_argument("--made", type=int, default=0,
                        help="make at least this many starts up front (the SDK's work), "
                             "measured or not")
    parser.add_argument("--callgrind-window", action="store_true",
                        help="under callgrind with --instr-atstart=no: count the measured "
                             "starts only (bench.instructions --depth)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="cProfile order (--profile)")
    args = parser.parse_args()
    ordered = "" if args.priority == "none" else f", {args.priority} priority"
    how = "admitted at once" if args.at_once else "queued"
    how += ", hops through the topics" if args.through_topics else ""
    print(f"concurrency limit {args.limit} per key over {args.keys} keys{ordered}, "
          f"{args.starts:,} starts measured ({how}), commit every {args.commit_every:,} "
          f"records")
    print("| queued | CPU µs/start | records/start |\n|---:|---:|---:|")
    for depth in (int(d) for d in args.depths.split(",")):
        profiler = cProfile.Profile() if args.profile else None
        counts: dict[str, float] = {}
        us = run(depth, args.starts, args.keys, args.limit, args.commit_every, profiler,
                 args.priority, args.at_once, counts, args.through_topics, args.made,
                 args.callgrind_window)
        print(f"| {0 if args.at_once else depth:,} | {us:.1f} | {counts['records']:.2f} |",
              flush=True)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)


if __name__ == "__main__":
    main()
