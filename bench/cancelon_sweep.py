"""What one cancelOn event's sweep costs with other workflows' starts parked: 0, 10,000 and
100,000 of them, half waiting behind a concurrency limit (in the same deployment-cap
budget as the event's workflow), half as debounce groups. Flat is the point: a sweep reads
the parked starts of the workflows whose cancelOn declares the event, and no others
(docs/decisions/cancelon-sweep-bounds.md).

`python -m bench.cancelon_sweep [--parked 0,10000,100000] [--events 20] [--profile]`

The worker's stages run in the test driver (`sluicegate.testing`), stores in memory, one
partition. For each count the unrelated starts are parked first (not timed); then, per
event, the event's workflows park 20 starts (10 behind the concurrency limit, 10
debounce groups, half of them matching the event), and the time of the event alone is
taken: decoded by the correlator, fanned out to every stage where starts wait, each
sweep judged there, the 10 matching starts discarded (ledger rows, holds given back).
The figure is the median over `--events` events, in ms, and the CPU time per event.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import App, CancelOn, Concurrency, Debounce, Workflow
from sluicegate.ops.worker import settle_garbage_collector
from sluicegate.testing import TestDriver


class Row(BaseModel):
    rowId: str
    issueKey: str


class IssueDeleted(BaseModel):
    issueKey: str


EVENT = "jira.issue.deleted"
_on_delete = [CancelOn(event=EVENT, schema=IssueDeleted,
                       match="event.issueKey == payload.issueKey")]
APP = App([
    # The event's workflows: one waiting for a slot, one collapsing edits.
    Workflow(name="slots", payload=Row, concurrency=Concurrency(limit=100_000),
             cancel_on=_on_delete),
    Workflow(name="edits", payload=Row, debounce=Debounce(key="rowId", period="7d"),
             cancel_on=_on_delete),
    # Unrelated: no cancelOn for this event.
    Workflow(name="busy", payload=Row, concurrency=Concurrency(limit=100_000)),
    Workflow(name="drafts", payload=Row, debounce=Debounce(key="rowId", period="7d")),
])
# Every start waits behind the deployment cap, one budget for every workflow: its one
# slot is held by the first start, and never released.
SETTINGS = Settings(partitions=1, deployment_cap=1)
PER_EVENT = 10  # of each of the event's workflows, per event


def run(parked: int, events: int, profiler: cProfile.Profile | None = None) -> tuple[
        list[float], list[float], int]:
    """(wall ms per event, CPU ms per event, starts cancelled) with `parked` unrelated
    starts parked."""
    with TestDriver(APP, SETTINGS) as h:
        h.start("busy", {"rowId": "holder", "issueKey": "-"})
        for n in range(parked // 2):
            h.start("busy", {"rowId": f"b{n}", "issueKey": f"K{n % 97}"})
            h.start("drafts", {"rowId": f"d{n}", "issueKey": f"K{n % 97}"})
        h.commit()
        settle_garbage_collector()
        walls: list[float] = []
        cpus: list[float] = []
        cancelled = 0
        for e in range(events):
            issue = f"E{e}"
            for n in range(PER_EVENT):
                # Half match the event, half another issue's.
                key = issue if n % 2 == 0 else f"other{e}"
                h.start("slots", {"rowId": f"s{e}-{n}", "issueKey": key})
                h.start("edits", {"rowId": f"e{e}-{n}", "issueKey": key})
            h.commit()
            h.advance(1)
            seen = len(h.ledger)
            if profiler is not None:
                profiler.enable()
            wall, cpu = time.perf_counter(), time.process_time()
            h.event(EVENT, {"issueKey": issue})
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if profiler is not None:
                profiler.disable()
            walls.append(wall * 1e3)
            cpus.append(cpu * 1e3)
            cancelled += sum(1 for r in h.ledger[seen:] if r.outcome.value == "cancelled")
            h.commit()
        return walls, cpus, cancelled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parked", default="0,10000,100000")
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    print("| unrelated starts parked | event's sweep, median ms | CPU ms per event | "
          "cancelled per event |")
    print("| ---: | ---: | ---: | ---: |")
    for parked in (int(x) for x in args.parked.split(",")):
        profiler = cProfile.Profile() if args.profile else None
        walls, cpus, cancelled = run(parked, args.events, profiler)
        print(f"| {parked:,} | {statistics.median(walls):.2f} | {statistics.mean(cpus):.2f} "
              f"| {cancelled / args.events:g} |", flush=True)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
