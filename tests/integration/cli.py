"""The real `sluicegate` entry point, run as a subprocess from the repository root (so
this tree's code is the one imported), timed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sluicegate.config import Settings

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def sluicegate(*args: str, bootstrap: str, state_dir: Path, namespace: str = "sg.",
               timeout: float = 60.0, env: dict[str, str] | None = None) -> Ran:
    """Run `sluicegate ARGS` with only these settings (none from the test's environment)
    and the variables in `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    environ.update(SLUICEGATE_BOOTSTRAP=bootstrap, SLUICEGATE_NAMESPACE=namespace,
                   SLUICEGATE_STATE_DIR=str(state_dir), COLUMNS="80", **(env or {}))
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sluicegate", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=timeout)
    return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - began)


def on(settings: Settings, *args: str, timeout: float = 60.0) -> Ran:
    """`sluicegate ARGS` on a test's broker, namespace and state directory."""
    return sluicegate(*args, bootstrap=settings.bootstrap, state_dir=settings.state_dir,
                      namespace=settings.namespace, timeout=timeout)
