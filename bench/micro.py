"""The per-start CPU cost of the passthrough's two stages in memory, without a broker.

`python -m bench.micro [--starts N] [--profile]`: the same encoded StartRequests the SDK
produces go through `IdentityStage.process`, and the admitted starts it writes through
`RunsStage.process` (as the worker hands them over; with a real RocksDB store, committed
every 2,000 records as the worker does), with contexts whose sends only collect the
bytes. This is the Python work per start that the worker adds to a raw pipe, less the
runtime's own loop.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.apps import WORKFLOW, app
from bench.records import InMemoryStage, in_memory_identity, in_memory_runs, make_starts

COMMIT_EVERY = 2000


def timed(stage: InMemoryStage, topic: str, values: list[bytes],
          profiler: cProfile.Profile | None) -> float:
    process, ctx = stage.stage.process, stage.ctx
    records = stage.records(topic, values)
    t0 = time.perf_counter()
    if profiler:
        profiler.enable()
    for first in range(0, len(records), COMMIT_EVERY):
        for record in records[first:first + COMMIT_EVERY]:
            process(ctx, record)
        stage.commit()
    if profiler:
        profiler.disable()
    return (time.perf_counter() - t0) / len(records) * 1e6


def run(starts: int, profiler: cProfile.Profile | None = None) -> tuple[float, float]:
    values = [value for _key, value in make_starts(app, WORKFLOW, starts)]
    identity = in_memory_identity(app)
    identity_us = timed(identity, identity.topics.starts, values, profiler)
    admitted = [v for topic, v in identity.sent
                if topic == identity.topics.admitted and v is not None]
    assert len(admitted) == starts, len(admitted)
    with tempfile.TemporaryDirectory(prefix="bench-micro-") as tmp:
        runs = in_memory_runs(app, Path(tmp))
        runs_us = timed(runs, runs.topics.stage("runs"), admitted, profiler)
        assert sum(topic == runs.topics.runs for topic, _ in runs.sent) == starts
        assert runs.tx is not None
        runs.tx.store.close()
    return identity_us, runs_us


def median_of_3(f: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    results = [f() for _ in range(3)]
    return (sorted(r[0] for r in results)[1], sorted(r[1] for r in results)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    run(2000)  # warm up
    identity_us, runs_us = median_of_3(lambda: run(args.starts))
    print(f"identity (passthrough): {identity_us:.1f} µs/start; runs (admitted start): "
          f"{runs_us:.1f} µs/start; together {identity_us + runs_us:.1f} (median of 3)")
    if args.profile:
        profiler = cProfile.Profile()
        run(args.starts, profiler)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
