"""The command line's entry point (the `sluicegate` script, `python -m sluicegate`): SIGTERM
and SIGINT kept first (`sluicegate.ops.signals`), then the commands imported and run.

Light on purpose: nothing but the standard library is imported before the signals are kept.
"""

from __future__ import annotations

from sluicegate.ops import signals


def main() -> None:
    signals.hold()
    from sluicegate.ops.cli.root import main as run

    run()
