"""CPU per start of the controls that hold starts on timers, in memory, without a broker, at
several counts of starts held: a debounce fire with 1,000 or 1,000,000 keys parked, a
delayed start with 1,000 or 1,000,000 others waiting for their time (SPEC.md section 5).

`python -m bench.timers_micro [--held 1000,10000,100000,1000000] [--starts N]
[--controls debounce,delayed,throttle] [--profile]`

The worker's stages run as the worker runs them in one task, in the test driver
(`sluicegate.testing`), each with a real RocksDB store, keeping only the admitted starts.
Time is the driver's clock: a cycle of the worker's reads `--per-cycle` starts, then the
clock moves on one millisecond per start read, and the timers due meanwhile fire.

- `debounce`: one key per start, its period H milliseconds: every start parks under a key
  of its own with a timer H ms out, so H keys (and H timers) are parked at any moment,
  and each start read is matched by the fire of the key parked H ms before it.
- `delayed`: every start asks to run H milliseconds after it is read (`at`): H starts wait
  as future rows with their timers, and each start read is matched by one coming due.
- `throttle`: one key paced at one start per millisecond; H starts arrive at once, then
  one per millisecond: H wait in the key's queue, and each start read is matched by the
  one its slot lets go.

For each count H, H starts are read first (not timed), so H are held when the window
begins; then `--starts` more are read while as many fire. The figure is CPU per start over
that window: a park or a delayed row, its timer, its fire, its admission and its run's
row. Flat across counts is the point: no scan proportional to the keys parked, the timers
or the cycle's writes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from pydantic import BaseModel

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App, Debounce, Throttle, Workflow
from sluicegate.ops.worker import settle_garbage_collector
from sluicegate.schemas import codec
from sluicegate.testing import TestDriver
from sluicegate.topology.topics import Topics


class Job(BaseModel):
    id: str
    grp: str


WORKFLOW = "held"
CONTROLS = ("debounce", "delayed", "throttle")


def held_app(control: str, held: int) -> App:
    """`control`'s workflow for `held` starts held at once (one read per millisecond)."""
    if control == "debounce":
        return App([Workflow(name=WORKFLOW, payload=Job,
                             debounce=Debounce(key="grp", period=f"{held}ms"))])
    if control == "throttle":
        return App([Workflow(name=WORKFLOW, payload=Job,
                             throttle=Throttle(key="grp", limit=1000, period="1s"))])
    return App([Workflow(name=WORKFLOW, payload=Job)])


def run(control: str, held: int, starts: int, per_cycle: int,
        profiler: cProfile.Profile | None = None) -> float:
    app = held_app(control, held)
    settings = Settings(partitions=1)
    topics = Topics(settings)
    driver = TestDriver(app, settings, keep=(topics.admitted,))
    builder = StartBuilder(app, settings)
    delay = held if control == "delayed" else None

    def value(i: int) -> bytes:
        # A delayed start's `at` is counted from the moment it is read: `held` ms later.
        at = None if delay is None else driver.now_ms + delay
        grp = "k" if control == "throttle" else f"k{i}"
        start, _key = builder.build(WORKFLOW, {"id": f"j{i}", "grp": grp}, at=at,
                                    request_id=f"r{i}", requested_at_ms=driver.now_ms)
        return codec.encode(start)

    try:
        for at in range(0, held, per_cycle):
            end = min(at + per_cycle, held)
            values = [value(i) for i in range(at, end)]
            with driver.cycle():
                for v in values:
                    driver.pipe(topics.starts, v)
            if control != "throttle":  # a throttle's queue fills at once
                driver.advance(end - at)
        admitted_before = driver.count(topics.admitted)
        # Of the first `held`, only the first cycle's have come due (at the fill's last
        # millisecond; a throttle lets its first go at once): the rest are held.
        assert admitted_before <= per_cycle, admitted_before
        settle_garbage_collector()
        # The starts are built in the window, and the CPU that takes (the SDK's work, not
        # the worker's) is taken out.
        cpu0 = time.process_time()
        if profiler:
            profiler.enable()
        built = 0.0
        for at in range(held, held + starts, per_cycle):
            end = min(at + per_cycle, held + starts)
            b0 = time.process_time()
            values = [value(i) for i in range(at, end)]
            built += time.process_time() - b0
            with driver.cycle():
                for v in values:
                    driver.pipe(topics.starts, v)
            driver.advance(end - at)
        if profiler:
            profiler.disable()
        us = (time.process_time() - cpu0 - built) / starts * 1e6
        admitted = driver.count(topics.admitted) - admitted_before
        # One admission per start read in the window: the one held `held` ms before it.
        assert abs(admitted - starts) <= per_cycle, (admitted, starts)
    finally:
        driver.close()
    return us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--held", default="1000,10000,100000,1000000")
    parser.add_argument("--starts", type=int, default=20_000)
    parser.add_argument("--controls", default=",".join(CONTROLS))
    parser.add_argument("--per-cycle", type=int, default=1_000,
                        help="starts read per cycle of the worker (then its timers fire)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="cProfile order (--profile)")
    args = parser.parse_args()
    controls = args.controls.split(",")
    counts = [int(h) for h in args.held.split(",")]
    print(f"{args.starts:,} starts measured, {args.per_cycle:,} read per cycle")
    print("| control | " + " | ".join(f"{h:,} held" for h in counts) + " |")
    print("| --- |" + " ---: |" * len(counts))
    for control in controls:
        if control not in CONTROLS:
            parser.error(f"--controls: {control!r} is none of {', '.join(CONTROLS)}")
        cells = []
        for held in counts:
            profiler = cProfile.Profile() if args.profile else None
            cells.append(f"{run(control, held, args.starts, args.per_cycle, profiler):.1f}")
            if profiler is not None:
                pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)
        print(f"| {control} | " + " | ".join(cells) + " µs/start |", flush=True)


if __name__ == "__main__":
    main()
