"""A run's lease: how long a run holding a concurrency slot may go without a report
before it is recorded lost, and how often the engine is asked to report it.

The runs stage arms and fires the lease (`stages/runs.py`); every stage that admits a
run puts it on the admitted start, so an engine in any language knows it
(docs/decisions/lease-on-the-admitted-start.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluicegate.declare import App, Workflow
from sluicegate.schemas.records import Slot

# What a slot lease covers: the crash backstop of SPEC.md is a concurrency rule (the
# deployment cap's slots live on the concurrency stage too).
LEASED_STAGE = "concurrency"
# A run of a workflow with no concurrency limit of its own can still hold a slot of the
# deployment-wide cap; it gets the same default as a limit's `lease`.
DEFAULT_LEASE_MS = 3_600_000
# The engine is asked to report a run this many times per lease: up to three heartbeats
# in a row can be lost or read late before the run is taken for lost.
HEARTBEATS_PER_LEASE = 4


def lease_of(wf: Workflow | None) -> int:
    """The shortest lease among the workflow's concurrency limits (its slots are freed
    together), or the default for a run that holds only a deployment-cap slot."""
    if wf is None or not wf.concurrency:
        return DEFAULT_LEASE_MS
    return min(limit.lease_ms for limit in wf.concurrency)


def heartbeat_every(lease_ms: int) -> int:
    return max(1, lease_ms // HEARTBEATS_PER_LEASE)


class Leases:
    """Each workflow's lease as an admitted start carries it, answered once per worker:
    (lease_ms, heartbeat_every_ms) for a run holding a concurrency slot, nothing for a
    workflow whose `timeouts.finish` bounds its runs instead (finish replaces the lease)."""

    def __init__(self, app: App) -> None:
        self._of: dict[str, tuple[int, int]] = {}
        for wf in app.workflows.values():
            if wf.timeouts is not None and wf.timeouts.finish_ms is not None:
                continue
            lease = lease_of(wf)
            self._of[wf.name] = (lease, heartbeat_every(lease))

    def for_run(self, workflow: str, slots: Iterable[Slot]) -> tuple[int, int] | None:
        """The lease of a run of `workflow` admitted with `slots` (None: it has none)."""
        lease = self._of.get(workflow)
        if lease is not None:
            for slot in slots:  # a loop, not any(): no generator on every admission
                if slot.stage == LEASED_STAGE:
                    return lease
        return None
