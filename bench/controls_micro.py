"""Each control's cost per start in memory, in the test driver: the instruction counts of
`python -m bench.instructions --controls`, and a CPU time per start without callgrind.

    python -m bench.controls_micro --scenario conc50 [--starts 2000] [--callgrind-window]

The scenarios and their declarations are `bench.gate`'s (bench/gate_apps.py), and so are
the keys each spreads its starts over (`payload`, which `bench.gate` makes its input with,
--starts the scale): a control is measured on the same input on the broker and here. The
worker's stages run in the test driver (`sluicegate.testing.TestDriver`), all of them, on
one partition, handing records over in process as a worker does once it has caught up.

1. warm-up: 200 starts, decided and (where the scenario has an engine) run to their end:
   idem spends the keys its measured starts repeat, rl-drop its keys' one admission;
2. the measured starts, made up front by the SDK's own builder (not counted), arrive in
   cycles of 340; after each cycle an engine (the scenarios `bench.gate` runs one for)
   reports every run admitted so far, in a cycle of its own, as the broker's engine
   answers a cycle later (`runs`: started then completed; `steps`: started, suspended,
   resumed, and the re-admission completed), and the clock moves 50 ms;
3. then the clock moves on (debounce's second) and the engine answers until nothing is
   left to decide: every measured start has its final decision inside the window. The
   count of admitted records is checked against what the scenario must produce.

With `--callgrind-window`, under `valgrind --tool=callgrind --instr-atstart=no`, callgrind
counts phases 2 and 3 alone (`callgrind_control`), and the caller divides by --starts.

Self-contained on purpose (sluicegate and the scenarios' module only, nothing else from
`bench`): `bench.instructions --controls --tree DIR` copies it, and bench/gate_apps.py,
beside an older tree, whose own `bench` package has neither. It uses the test driver's
API as the tree of 2026-12-05 (`b2c175b`) has it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import AdmittedKind, AdmittedStart, RunEventKind
from sluicegate.testing import TestDriver

WARM = 200
PER_CYCLE = 340
TICK_MS = 50
# The scenarios whose runs hold something until the engine reports their end (bench.gate).
ENGINE_MODE = {"singleton": "runs", "conc50": "runs", "conc1": "runs", "steps": "steps",
               "priority": "runs"}
SCENARIOS = ("passthrough", "idem", "rl-admit", "rl-drop", "throttle", "throttles",
             "debounce", "batch", "singleton", "conc50", "conc1", "steps", "pause",
             "priority")
RL_DROP_KEYS = 10


def admitted_expected(scenario: str, starts: int) -> int:
    """The admitted records the measured starts must make."""
    if scenario in ("idem", "rl-drop"):
        return 0
    if scenario == "batch":
        return starts // 10
    if scenario == "steps":
        return 2 * starts  # the run, then its re-admission
    return starts


def payload(scenario: str, phase: str, i: int, scale: int, warm: int) -> dict[str, Any]:
    """Start `i` of `phase` (w: warm-up, m: measured, l: latency, ...), of `warm` warm-up
    starts. The keys a scenario spreads over follow `scale` (the measured starts) in every
    phase: a latency phase with fewer keys would be slower for that alone (conc1: each key
    admits one run per round trip through the engine). `bench.gate` makes its input so."""
    uid = f"{phase}{i}"
    grp = "g"
    if scenario == "idem":
        uid = f"w{i}" if phase == "w" else f"w{i % warm}"  # a key the warm-up spent
    elif scenario == "rl-drop":
        grp = f"g{i % RL_DROP_KEYS}"
    elif scenario in ("rl-admit", "throttle", "throttles"):
        grp = f"{phase}{i % max(1, scale // 20)}"
    elif scenario == "debounce":
        grp = uid
    elif scenario in ("conc50", "steps", "priority"):
        grp = f"g{i % max(1, scale // 500)}"
    elif scenario == "conc1":
        grp = f"g{i % max(1, scale // 100)}"
    prio = (i * 37) % 1201 - 600 if scenario == "priority" else 0
    return {"id": uid, "grp": grp, "prio": prio}


def reports(admitted: AdmittedStart, mode: str) -> tuple[RunEventKind, ...]:
    if mode == "steps":
        if admitted.kind is AdmittedKind.resume:
            return (RunEventKind.completed,)
        return (RunEventKind.started, RunEventKind.suspended, RunEventKind.resumed)
    return (RunEventKind.started, RunEventKind.completed)


def chunks(items: list[tuple[bytes, bytes]], n: int) -> Iterator[list[tuple[bytes, bytes]]]:
    for first in range(0, len(items), n):
        yield items[first:first + n]


def instrument(on: bool) -> None:
    """Callgrind's counting on or off in this process (run under `valgrind --tool=callgrind
    --instr-atstart=no`)."""
    subprocess.run(["callgrind_control", "--instr=" + ("on" if on else "off"),
                    str(os.getpid())], check=True, capture_output=True)


class Bench:
    def __init__(self, scenario: str, starts: int) -> None:
        apps = _scenarios_module()
        self.scenario = scenario
        self.app = apps.app_for(scenario)
        settings = Settings(partitions=1)
        options: dict[str, Any] = {}
        if "in_order" in inspect.signature(TestDriver).parameters:
            options["in_order"] = True  # handed over, as a worker that has caught up
        self.driver = TestDriver(self.app, settings, **options)
        self.topics = self.driver.topics
        self.mode = ENGINE_MODE.get(scenario)
        self.admitted = 0
        builder = StartBuilder(self.app, settings)
        requested = self.driver.now_ms

        def made(phase: str, n: int) -> list[tuple[bytes, bytes]]:
            out = []
            for i in range(n):
                start, key = builder.build(scenario, payload(scenario, phase, i, starts, WARM),
                                           request_id=f"{phase}{i}",
                                           requested_at_ms=requested)
                out.append((key, codec.encode(start)))
            return out

        self.warm = made("w", WARM)
        self.measured = made("m", starts)

    def _engine(self) -> int:
        """The admitted records written since the last call; an engine, if the scenario
        has one, reports each run."""
        admitted = [codec.decode(AdmittedStart, w.value)
                    for w in self.driver.take(self.topics.admitted) if w.value is not None]
        if self.mode is not None:
            for start in admitted:
                for kind in reports(start, self.mode):
                    self.driver.report(start.execution_id, kind, workflow=start.workflow)
        return len(admitted)

    def _arrive(self, starts: list[tuple[bytes, bytes]]) -> int:
        """`starts` in cycles, each followed by the engine's answer and a tick; then the
        clock moves on and the engine answers until nothing more is admitted."""
        admitted = 0
        for chunk in chunks(starts, PER_CYCLE):
            with self.driver.cycle():
                for key, value in chunk:
                    self.driver.pipe(self.topics.starts, value, key)
            with self.driver.cycle():
                admitted += self._engine()
            self.driver.advance(TICK_MS)
        return admitted + self._settle()

    def _settle(self) -> int:
        """The clock moves on (debounce's period, and more) and the engine answers, until a
        round finds nothing admitted: no report was sent, so nothing more can be."""
        admitted = 0
        for _ in range(10_000):
            self.driver.advance(1_100)
            with self.driver.cycle():
                n = self._engine()
            if n == 0:
                return admitted
            admitted += n
        raise SystemExit(f"{self.scenario}: the engine's rounds never ended")

    def records(self) -> int:
        return len(self.driver.sent())

    def run(self, window: bool) -> tuple[float, float]:
        """CPU µs and records per measured start."""
        self._arrive(self.warm)
        if self.scenario == "pause":
            self.driver.pause(self.scenario)
        written = self.records()
        t0 = time.process_time()
        if window:
            instrument(True)
        if self.scenario == "pause":
            admitted = self._arrive(self.measured)
            self.driver.unpause(self.scenario)
            admitted += self._settle()
        else:
            admitted = self._arrive(self.measured)
        if window:
            instrument(False)
        cpu = time.process_time() - t0
        expected = admitted_expected(self.scenario, len(self.measured))
        if admitted != expected:
            raise SystemExit(f"{self.scenario}: {admitted:,} admitted records, "
                             f"{expected:,} expected")
        n = len(self.measured)
        return cpu / n * 1e6, (self.records() - written) / n


def _scenarios_module() -> Any:
    """The scenarios' declarations: copied beside this file under this name in an older
    tree (bench.instructions), else this tree's own."""
    try:
        return importlib.import_module("sg_bench_gate_apps")
    except ModuleNotFoundError:
        return importlib.import_module("bench.gate_apps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=SCENARIOS, required=True)
    parser.add_argument("--starts", type=int, default=2_000,
                        help="measured starts (a multiple of 10: batch)")
    parser.add_argument("--callgrind-window", action="store_true",
                        help="under callgrind with --instr-atstart=no: count the measured "
                             "starts only")
    args = parser.parse_args()
    bench = Bench(args.scenario, args.starts)
    us, records = bench.run(args.callgrind_window)
    print(f"{args.scenario}: {us:.1f} CPU µs per start, {records:.2f} records per start")


if __name__ == "__main__":
    main()
