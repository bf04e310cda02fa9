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

from bench.apps import WORKFLOW, app
from bench.records import InMemoryIdentity, make_starts


def run(starts: int, profile: bool) -> float:
    identity = InMemoryIdentity(app)
    sent, ctx = identity.sent, identity.ctx
    records = identity.records([value for _key, value in make_starts(app, WORKFLOW, starts)])
    process = identity.stage.process
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
