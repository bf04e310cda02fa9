"""Pause: while a workflow is paused its starts collect here, never discarded; unpause
drains them in priority order (SPEC.md section 3). The starts of a workflow removed from
the declarations while they waited fail (`failed`, its onFailure told) when the worker
restores with the new declarations, as every other queue's do.

Only a paused workflow's starts take this detour — just before a throttle or concurrency
hop, or admission — keyed by workflow, so all of one workflow's paused starts wait in one
priority-ordered queue and drain in one order, each going on from the hop it stopped at.
"""

from __future__ import annotations

from sluicegate.admission.pending import PendingQueue, priority_mode, queue_names
from sluicegate.admission.routing import (
    PAUSE_STAGE,
    REMOVED,
    Router,
    checked_under,
    declared_digest,
    declared_table,
    mark_checked,
)
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.queueing import QueueStage
from sluicegate.declare import App
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import CancelSweep, ControlRow, Outcome, PendingStart


def queue_name(workflow: str) -> bytes:
    return workflow.encode()


class PauseStage(QueueStage):
    name = PAUSE_STAGE
    tables = (*QueueStage.tables, declared_table())

    def __init__(self, app: App, partitions: int, router: Router) -> None:
        super().__init__(app, router)
        self.partitions = partitions
        self._declared = declared_digest(app)

    def on_start(self, ctx: StageContext, record: InputRecord, start: PendingStart) -> None:
        headers = record.headers
        if cancelon.discard_on_arrival(ctx, self.app, self.router, start, start.workflow,
                                       headers=headers):
            return
        if self.router.paused(start.workflow):
            queue = PendingQueue(ctx.store, queue_name(start.workflow))
            queue.push(start, priority_mode(self.app.get(start.workflow)), headers)
            return
        # Unpaused while it was on its way here.
        self.router.forward(ctx, start, headers=headers)

    def on_sweep(self, ctx: StageContext, sweep: CancelSweep) -> None:
        """cancelOn discards the paused starts that match the event (a queue per
        workflow, on the partition that owns the workflow's name)."""
        for workflow in sweep.workflows:
            queue = PendingQueue(ctx.store, queue_name(workflow))
            for parked in list(queue):
                start = parked.start
                reason = cancelon.judge(self.app, self.router, ctx.stage, sweep, start,
                                        cancelon.Group.of(parked.headers))
                if reason is not None:
                    queue.remove(parked)
                    cancelon.discard(ctx, self.router, start, sweep, reason, workflow,
                                     headers=parked.headers)

    def restored(self, ctx: StageContext) -> None:
        """Fail the collected starts of workflows no longer declared: they would wait for
        an unpause that a worker without the workflow cannot act on. Read only when the
        declarations changed since the partition was last checked."""
        if checked_under(ctx, self._declared):
            return
        for name in queue_names(ctx.store):
            if self.app.get(name.decode(errors="replace")) is not None:
                continue
            queue = PendingQueue(ctx.store, name)
            for parked in list(queue):
                queue.remove(parked)
                self.router.fail(ctx, parked.start, Outcome.failed, REMOVED,
                                 headers=parked.headers)
        mark_checked(ctx, self._declared)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        cancelon.forget(ctx, key)  # its only timers

    def table_changed(self, ctx: StageContext, table: str, row: object) -> None:
        """A control row: an unpaused workflow's collected starts drain, on the partition
        that owns the workflow's name."""
        if (not isinstance(row, ControlRow) or row.paused
                or partition_for(row.workflow.encode(), self.partitions) != ctx.partition):
            return
        queue = PendingQueue(ctx.store, queue_name(row.workflow))
        while not self.router.paused(row.workflow):
            head = queue.pop()
            if head is None:
                return
            self.router.forward(ctx, head.start, headers=head.headers)
