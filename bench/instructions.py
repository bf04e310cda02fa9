"""Instructions per start of the passthrough's two stages in memory, counted by callgrind.

`python -m bench.instructions [--tree DIR]`: runs `bench.micro --once` under valgrind's
callgrind for 4,000 and for 12,000 starts (the same 12,000 made in both) and prints the
difference per start. Unlike a time, the count does not move with other load on the
machine, so it is the steady guide while working on the stages (docs/benchmarks.md);
the broker benchmark (`bench.passthrough`) says what a change is worth in the worker.
Needs valgrind (`apt-get install valgrind`); takes about a minute.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", type=Path, default=Path.cwd(),
                        help="the source tree to count (an exported commit, say)")
    args = parser.parse_args()
    per_start = (instructions(args.tree, LARGE) - instructions(args.tree, SMALL)) // (
        LARGE - SMALL)
    print(f"{args.tree}: {per_start:,} instructions per start")


if __name__ == "__main__":
    main()
