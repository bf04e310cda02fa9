"""Instructions per start in memory, counted by callgrind: the passthrough's two stages,
or (`--gate`) the concurrency gate.

`python -m bench.instructions [--tree DIR]`: runs `bench.micro --once` under valgrind's
callgrind for 4,000 and for 12,000 starts (the same 12,000 made in both) and prints the
difference per start. `python -m bench.instructions --gate [--tree DIR]`: the same with
`bench.gate_micro` (limit 50 per key over 200 keys, 1,000 queued, a cycle every 680
records) for 2,000 and 6,000 starts, once with every start queued and admitted from the
queue, once with every start admitted at once, with the records written per start. Both
runs make the same starts up front (the SDK's work), so the difference is the worker's.
Unlike a time, the count does not move with other load on the machine, so it is the
steady guide while working on the stages (docs/benchmarks.md); the broker benchmarks
(`bench.passthrough`, `bench.gate`) say what a change is worth in the worker. Needs
valgrind (`apt-get install valgrind`); takes about a minute (the gate: several).

`python -m bench.instructions --depth 100000 [--tree DIR]`: the gate's cost per start as
state grows: `bench.gate_micro` with that many starts queued first (not counted: the
counting is turned on for the 20,000 starts measured alone, by `callgrind_control`), so
the figure is the instructions of those starts divided by their number; compare it with
`--depth 1000`. Takes tens of minutes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bench.controls_micro import SCENARIOS as CONTROL_SCENARIOS

SMALL, LARGE = 4_000, 12_000


def instructions(tree: Path, starts: int) -> int:
    """The instructions callgrind counts for one `bench.micro --once` process."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-m", "bench.micro", "--once", "--starts", str(starts)],
        cwd=tree, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{out.stderr}")
    return int(found.group(1))


GATE_SMALL, GATE_LARGE = 2_000, 6_000


def gate_instructions(tree: Path, starts: int, at_once: bool) -> tuple[int, float]:
    """The instructions of one `bench.gate_micro` process, and the records it wrote per
    measured start."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-m", "bench.gate_micro", "--depths", "1000", "--starts", str(starts),
         "--commit-every", "680", "--made", str(GATE_LARGE),
         *(["--at-once"] if at_once else [])],
        cwd=tree, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    row = re.search(r"^\|[^|]*\|[^|]*\| ([\d.]+) \|$", out.stdout, re.MULTILINE)
    if found is None or row is None:
        raise SystemExit(f"no instruction count or records in the output:\n{out.stdout}"
                         f"\n{out.stderr}")
    return int(found.group(1)), float(row.group(1))


WINDOW_STARTS = 20_000


def window_instructions(tree: Path, depth: int, starts: int,
                        at_once: bool) -> tuple[float, float]:
    """Instructions per start of the starts `bench.gate_micro` measures at a queue depth,
    callgrind's instrumentation on for them alone (the starts queued first are neither
    counted nor slowed), and the records written per start."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         "--callgrind-out-file=/dev/null", sys.executable, "-m", "bench.gate_micro",
         "--depths", str(depth), "--starts", str(starts), "--commit-every", "680",
         "--made", str(starts), "--callgrind-window", *(["--at-once"] if at_once else [])],
        cwd=tree, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    row = re.search(r"^\|[^|]*\|[^|]*\| ([\d.]+) \|$", out.stdout, re.MULTILINE)
    if found is None or row is None or int(found.group(1)) == 0:
        raise SystemExit(f"no instruction count (or none counted: callgrind_control did not "
                         f"reach the process) or records in the output:\n{out.stdout}"
                         f"\n{out.stderr}")
    return int(found.group(1)) / starts, float(row.group(1))


CONTROLS_STARTS = 2_000
# The copies `--controls` puts beside a tree without them (its own `bench` package has
# neither: an older tree), as bench.gate copies the scenarios beside a baseline's worker.
CONTROLS_MODULE, SCENARIOS_MODULE = "sg_bench_controls_micro", "sg_bench_gate_apps"


def controls_instructions(tree: Path, scenario: str, starts: int) -> tuple[float, float]:
    """Instructions and records per measured start of one scenario of
    `bench.controls_micro`, callgrind counting its measured starts alone."""
    here = Path(__file__).resolve().parent
    if (tree / "bench" / "controls_micro.py").exists():
        module = "bench.controls_micro"
    else:
        shutil.copyfile(here / "controls_micro.py", tree / f"{CONTROLS_MODULE}.py")
        shutil.copyfile(here / "gate_apps.py", tree / f"{SCENARIOS_MODULE}.py")
        module = CONTROLS_MODULE
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         "--callgrind-out-file=/dev/null", sys.executable, "-m", module,
         "--scenario", scenario, "--starts", str(starts), "--callgrind-window"],
        cwd=tree, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    row = re.search(r"([\d.]+) records per start", out.stdout)
    if out.returncode != 0 or found is None or row is None or int(found.group(1)) == 0:
        raise RuntimeError(f"{scenario}: no instruction count or records in the output:\n"
                           f"{out.stdout}\n{out.stderr[-2000:]}")
    return int(found.group(1)) / starts, float(row.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", type=Path, default=Path.cwd(),
                        help="the source tree to count (an exported commit, say)")
    parser.add_argument("--gate", action="store_true",
                        help="the concurrency gate rather than the passthrough")
    parser.add_argument("--depth", type=int, default=None,
                        help="the gate's measured starts alone, with this many queued "
                             f"({WINDOW_STARTS:,} starts; callgrind_control turns the "
                             "counting on and off)")
    parser.add_argument("--controls", nargs="?", const=",".join(CONTROL_SCENARIOS),
                        metavar="SCENARIO[,...]",
                        help="every control's scenario (bench.controls_micro; default all "
                             "of them), instructions and records per start")
    args = parser.parse_args()
    if args.controls is not None:
        print(f"{args.tree}: instructions per start in memory ({CONTROLS_STARTS:,} starts "
              "each, bench.controls_micro)\n| scenario | instructions/start | records/start |"
              "\n|---|---:|---:|", flush=True)
        for scenario in args.controls.split(","):
            try:
                per_start, records = controls_instructions(args.tree, scenario,
                                                           CONTROLS_STARTS)
            except RuntimeError as exc:
                print(f"| {scenario} | failed: {str(exc).splitlines()[0]} | |", flush=True)
                print(exc, file=sys.stderr)
                continue
            print(f"| {scenario} | {per_start:,.0f} | {records:.2f} |", flush=True)
        return
    if args.depth is not None:
        per_start, records = window_instructions(args.tree, args.depth, WINDOW_STARTS,
                                                 at_once=False)
        print(f"{args.tree}: {per_start:,.0f} instructions per queued gated start at a depth "
              f"of {args.depth:,}, {records:.2f} records per start")
        return
    if args.gate:
        for at_once, what in ((False, "queued gated start"),
                              (True, "gated start admitted at once")):
            small, _ = gate_instructions(args.tree, GATE_SMALL, at_once)
            large, records = gate_instructions(args.tree, GATE_LARGE, at_once)
            per_start = (large - small) // (GATE_LARGE - GATE_SMALL)
            print(f"{args.tree}: {per_start:,} instructions per {what}, {records:.2f} "
                  f"records per start (its start and its run's report included)")
        return
    per_start = (instructions(args.tree, LARGE) - instructions(args.tree, SMALL)) // (
        LARGE - SMALL)
    print(f"{args.tree}: {per_start:,} instructions per start")


if __name__ == "__main__":
    main()
