"""The identity stage's per-start CPU cost in memory, without a broker.

`python -m bench.micro [--starts N] [--profile]`: the same encoded StartRequests the SDK
produces go through `IdentityStage.process` with a context whose sends only collect the
bytes; this is the Python work per start that the worker adds to a raw pipe.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Any

from bench.apps import WORKFLOW, app
from bench.records import make_starts
from sluicegate.config import Settings
from sluicegate.streams.routing import Router
from sluicegate.streams.stage import InputRecord, StageContext
from sluicegate.streams.stages.identity import IdentityStage
from sluicegate.topology.topics import Topics


def run(starts: int, profile: bool) -> float:
    settings = Settings(namespace="bench.")
    # The worker's identity stage, with no pause table (it would need a broker).
    stage = IdentityStage(app, settings.partitions, Router(app, 0, None))
    sent: list[Any] = []

    def send(topic: str, key: bytes | None, value: bytes | None, partition: int | None) -> None:
        sent.append(value)

    ctx = StageContext(stage.name, 0, Topics(settings), None, None, send,
                       lambda: int(time.time() * 1000))
    values = [value for _key, value in make_starts(app, WORKFLOW, starts)]
    topic = Topics(settings).starts
    records = [InputRecord(topic, 0, i, None, v, 0) for i, v in enumerate(values)]
    process = stage.process
    for record in records[:1000]:  # warm up
        process(ctx, record)
    sent.clear()
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    t0 = time.perf_counter()
    for record in records:
        process(ctx, record)
    elapsed = time.perf_counter() - t0
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    assert len(sent) == 2 * starts, len(sent)
    return elapsed / starts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=50_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    per_start = sorted(run(args.starts, False) for _ in range(3))[1]
    print(f"identity passthrough in memory: {per_start:.1f} µs/start (median of 3)")
    if args.profile:
        run(args.starts, True)


if __name__ == "__main__":
    main()
