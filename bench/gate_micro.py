"""The concurrency gate's CPU per start in memory, without a broker, at several queue depths.

`python -m bench.gate_micro [--depths 1000,10000,100000] [--starts N] [--profile]`

The worker's own stages run as the worker runs them in one task: identity hands each
start over to the concurrency stage (a real RocksDB store), which admits it or queues it
behind its key's limit; an admitted start is handed over to the runs stage (a real
store), and an engine completes each run as soon as it sees it (a `completed` run event
into the runs stage, whose release goes back to the concurrency stage, which admits the
next start waiting). Stores commit every `--commit-every` records, as the runtime's cycle
does.

For each depth D, the keys' slots are filled and D starts are queued first (not timed);
then `--starts` more arrive, each followed by the engine completing one run, so the queue
stays D deep while every measured start is queued, admitted from the queue, run and
released. The figure is CPU per start over that window: what a gated start costs the
worker besides Kafka. Flat across depths is the point (issue 15).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections import deque
from pathlib import Path

from pydantic import BaseModel

from bench.records import InMemoryStage, StartMaker
from sluicegate.admission.routing import Router
from sluicegate.admission.stages.concurrency import ConcurrencyStage
from sluicegate.admission.stages.identity import IdentityStage
from sluicegate.admission.stages.runs import RunsStage
from sluicegate.declare import App, Concurrency, Workflow
from sluicegate.engine.stage import InputRecord
from sluicegate.ops.worker import settle_garbage_collector
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedStart, RunEvent, RunEventKind


class Job(BaseModel):
    id: str
    grp: str


WORKFLOW = "gate"


def gate_app(limit: int) -> App:
    return App([Workflow(name=WORKFLOW, payload=Job,
                         concurrency=[Concurrency(limit=limit, key="grp")])])


class Gate:
    """identity -> concurrency -> runs in memory, with an engine that completes at once."""

    def __init__(self, app: App, state_dir: Path, commit_every: int) -> None:
        router = Router(app, 0, None)
        self.identity = InMemoryStage(IdentityStage(app, 6, router, 10**6))
        self.concurrency = InMemoryStage(ConcurrencyStage(app, router, 0),
                                         state_dir=state_dir)
        self.runs = InMemoryStage(RunsStage(app, router), state_dir=state_dir)
        topics = self.identity.topics
        for stage in (self.identity, self.concurrency, self.runs):
            stage.hand_over[topics.stage("concurrency")] = self.concurrency
            stage.hand_over[topics.stage("runs")] = self.runs
        self.run_events = topics.run_events
        self.admitted_topic = topics.admitted
        self.commit_every = commit_every
        self.since_commit = 0
        self.admitted = 0
        self._seen = 0

    def _records(self) -> int:
        self.since_commit += 1
        if self.since_commit >= self.commit_every:
            self.concurrency.commit()
            self.runs.commit()
            self.identity.sent.clear()
            self.since_commit = 0
        return self.since_commit

    def arrive(self, value: bytes) -> None:
        self.identity.stage.process(self.identity.ctx, InputRecord(
            self.identity.topics.starts, 0, 0, None, value, 0))
        self._records()

    def admitted_since(self) -> list[AdmittedStart]:
        """The admitted starts sent since the last call (the engine's input)."""
        out = []
        for stage in (self.identity, self.concurrency, self.runs):
            for topic, value in stage.sent:
                if topic == self.admitted_topic and value is not None:
                    out.append(codec.decode(AdmittedStart, value))
            stage.sent.clear()
        self.admitted += len(out)
        return out

    def complete(self, start: AdmittedStart) -> None:
        event = RunEvent(execution_id=start.execution_id, workflow=start.workflow,
                         kind=RunEventKind.completed, at_ms=int(time.time() * 1000))
        self.runs.stage.process(self.runs.ctx, InputRecord(
            self.run_events, 0, 0, start.execution_id.encode(), codec.encode(event), 0))
        self._records()

    def close(self) -> None:
        for stage in (self.concurrency, self.runs):
            assert stage.tx is not None
            stage.tx.store.close()


def run(depth: int, starts: int, keys: int, limit: int, commit_every: int,
        profiler: cProfile.Profile | None = None) -> float:
    maker = StartMaker(gate_app(limit))
    values = [maker.make_payload(WORKFLOW, {"id": f"j{i}", "grp": f"k{i % keys}"})
              for i in range(keys * limit + depth + starts)]
    with tempfile.TemporaryDirectory(prefix="bench-gate-micro-") as tmp:
        gate = Gate(gate_app(limit), Path(tmp), commit_every)
        engine: deque[AdmittedStart] = deque()
        fill = keys * limit + depth
        for value in values[:fill]:
            gate.arrive(value)
        engine.extend(gate.admitted_since())
        assert len(engine) == keys * limit, (len(engine), keys * limit)
        gate.concurrency.commit()
        gate.runs.commit()
        admitted_before = gate.admitted
        settle_garbage_collector()
        t0 = time.process_time()
        if profiler:
            profiler.enable()
        for value in values[fill:]:
            gate.arrive(value)
            gate.complete(engine.popleft())
            engine.extend(gate.admitted_since())
        if profiler:
            profiler.disable()
        us = (time.process_time() - t0) / starts * 1e6
        # Every completion admitted exactly one start from the queue.
        assert gate.admitted - admitted_before == starts, (gate.admitted, admitted_before)
        gate.close()
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depths", default="1000,10000,100000")
    parser.add_argument("--starts", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="cProfile order (--profile)")
    args = parser.parse_args()
    print(f"concurrency limit {args.limit} per key over {args.keys} keys, "
          f"{args.starts:,} starts measured, commit every {args.commit_every:,} records")
    print("| queued | CPU µs/start |\n|---:|---:|")
    for depth in (int(d) for d in args.depths.split(",")):
        profiler = cProfile.Profile() if args.profile else None
        us = run(depth, args.starts, args.keys, args.limit, args.commit_every, profiler)
        print(f"| {depth:,} | {us:.1f} |", flush=True)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)


if __name__ == "__main__":
    main()
