"""The per-start CPU cost of the passthrough's two stages in memory, without a broker.

`python -m bench.micro [--starts N] [--profile]`: the same encoded StartRequests the SDK
produces go through `IdentityStage.process`, which hands each admitted start over to
`RunsStage.process` as the worker does (with the record it encodes, and a real RocksDB
store committed every 2,000 starts), in the test driver (`sluicegate.testing`) running
only those two stages and keeping no output (it counts them), with Python's garbage
collector set as the worker sets it. This is the Python work per start that the worker
adds to a raw pipe, less the runtime's own loop.

`--once` processes the first N of MADE starts once, with no warm-up and no timing: what
`bench.instructions` counts under callgrind.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

from bench.apps import WORKFLOW, app
from bench.records import make_starts
from sluicegate.engine.stage import InputRecord
from sluicegate.ops.worker import settle_garbage_collector
from sluicegate.testing import TestDriver

COMMIT_EVERY = 2000
# The starts `--once` makes whatever N it processes, so that two counts differ only by
# the starts processed.
MADE = 12_000


def run(starts: int, profiler: cProfile.Profile | None = None,
        made: list[tuple[bytes, bytes]] | None = None) -> float:
    if made is None:
        made = make_starts(app, WORKFLOW, starts)
    with TestDriver(app, stages=("identity", "runs"), keep=()) as driver:
        topic = driver.topics.starts
        records = [InputRecord(topic, 0, i, key, value, 0)
                   for i, (key, value) in enumerate(made)]
        t0 = time.perf_counter()
        if profiler:
            profiler.enable()
        for first in range(0, len(records), COMMIT_EVERY):
            driver.process("identity", records[first:first + COMMIT_EVERY])
            driver.commit()
        if profiler:
            profiler.disable()
        us = (time.perf_counter() - t0) / len(records) * 1e6
        assert driver.count(driver.topics.admitted) == starts
        assert driver.count(driver.topics.runs) == starts
    return us


def median_of_3(f: Callable[[], float]) -> float:
    return sorted(f() for _ in range(3))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args()
    if args.once:
        if args.starts > MADE:
            parser.error(f"--once processes at most {MADE:,} starts")
        made = make_starts(app, WORKFLOW, MADE)
        settle_garbage_collector()
        run(args.starts, made=made[:args.starts])
        return
    settle_garbage_collector()
    run(2000)  # warm up
    us = median_of_3(lambda: run(args.starts))
    print(f"identity and runs (the passthrough, handed over): {us:.1f} µs/start "
          "(median of 3)")
    if args.profile:
        profiler = cProfile.Profile()
        run(args.starts, profiler)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
