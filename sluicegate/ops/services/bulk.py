"""Bulk cancel and bulk replay (SPEC.md section 4, seed 000 "Bulk cancel and bulk replay").

Functions, so the CLI (`sluicegate workflows cancel-many|replay-many`) and an HTTP
dashboard share them: `preview_*` reads the runs table and says what `apply_*` would do;
`apply_*` does it. Both take a required `limit` (the blast radius: there is no "all"), and
report per run: `succeeded`, `failed` (with the reason), `skipped` (with what made the run
ineligible), and `truncated` when more runs were eligible than `limit`.

The runs come from `sg.runs`, read to its end (the latest row per execution id), in a
fixed order (oldest admission first), so a preview and the apply that follows it pick the
same runs when nothing changed in between; `only` restricts an apply to the execution ids
a preview returned, for a dashboard that must act on exactly what it showed.

Eligibility is fixed by the verb (docs/decisions/bulk-operations.md):
cancel acts on live runs (admitted, running, suspended); `redrive` on failed runs only
(an engine command: resume from the step that died); `retry` on failed and cancelled runs
(a fresh execution: a `direct` start of the same workflow and payload whose explicit id is
`retry:<execution id>`, so applying twice starts one retry, not two).

An apply sends one `RunOperation` per run to the runs stage, which carries it out in one
transaction with the run's row: the engine command (its `command_id` unique per operation
and run), or the retry's start; the operator's reason on the run; a ledger row per run.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaError, Producer

from sluicegate.admission.decisions import RUNS_STAGE
from sluicegate.admission.stages.runs import ELIGIBLE
from sluicegate.config import Settings
from sluicegate.ops.services.runs import RunsTable
from sluicegate.schemas import codec
from sluicegate.schemas.records import RunOperation, RunRow, RunStatus
from sluicegate.topology.topics import Topics

Verb = Literal["cancel", "redrive", "retry"]
Mode = Literal["redrive", "retry"]
# (done, total) after each run is acted on; the CLI draws a progress bar with it.
Progress = Callable[[int, int], None]

# -- the pure core -------------------------------------------------------------------

_WHY_NOT: dict[Verb, str] = {
    "cancel": "only live runs (admitted, running, suspended) can be cancelled",
    "redrive": "redrive resumes from the step that failed, which only a failed run has",
    "retry": "retry starts failed and cancelled runs afresh",
}


def ineligible(verb: Verb, row: RunRow) -> str | None:
    """Why `verb` does not apply to this run, or None when it does."""
    if row.status in ELIGIBLE[verb]:
        return None
    return f"the run is {row.status.value}: {_WHY_NOT[verb]}"


@dataclass(frozen=True, slots=True)
class RunResult:
    execution_id: str
    workflow: str
    status: str  # the run's status when it was selected
    detail: str | None = None  # why it failed, why it was skipped, what was done


@dataclass(slots=True)
class BulkResult:
    """What a bulk operation did (or, as a preview, would do), per run."""

    verb: Verb
    committed: bool
    limit: int
    # In a preview, `succeeded` lists the runs the apply would act on.
    succeeded: list[RunResult] = field(default_factory=list)
    failed: list[RunResult] = field(default_factory=list)
    skipped: list[RunResult] = field(default_factory=list)
    truncated: bool = False  # more runs were eligible than `limit`
    eligible: int = 0  # how many were eligible in all
    ineligible: int = 0  # how many were selected but ineligible (`skipped` lists `limit`)
    # An apply's id: its ledger rows are `run:<execution id>:bulk-<verb>:<operation>`.
    operation: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def plan(rows: Iterable[RunRow], verb: Verb, limit: int,
         only: Collection[str] | None = None) -> tuple[list[RunRow], BulkResult]:
    """The runs to act on (oldest admission first, at most `limit`), and the result so far:
    the ineligible ones skipped with why (at most `limit` of them listed), `truncated`."""
    if limit < 1:
        raise ValueError("limit must be at least 1 (there is no 'all')")
    result = BulkResult(verb=verb, committed=False, limit=limit)
    chosen: list[RunRow] = []
    for row in sorted(rows, key=lambda r: (r.admitted_at_ms, r.execution_id)):
        if only is not None and row.execution_id not in only:
            continue
        why = ineligible(verb, row)
        if why is not None:
            result.ineligible += 1
            if len(result.skipped) < limit:
                result.skipped.append(RunResult(row.execution_id, row.workflow,
                                                row.status.value, why))
            continue
        result.eligible += 1
        if len(chosen) < limit:
            chosen.append(row)
    result.truncated = result.eligible > limit
    return chosen, result


def selected(rows: Iterable[RunRow], *, workflow: str | None = None,
             status: RunStatus | None = None) -> list[RunRow]:
    return [r for r in rows if (workflow is None or r.workflow == workflow)
            and (status is None or r.status is status)]


# -- reading the runs table ------------------------------------------------------------


def read_runs(settings: Settings, timeout_s: float = 60.0) -> list[RunRow]:
    """Every run's latest row: `sg.runs` read from its start to its end (read_committed);
    TimeoutError when a partition does not get there within `timeout_s`."""
    table = RunsTable(settings)
    try:
        behind = table.refresh(timeout_s)
    finally:
        table.close()
    if behind:
        raise TimeoutError(f"could not read {Topics(settings).runs} to its end within "
                           f"{timeout_s}s")
    return list(table.rows.values())


# -- acting ----------------------------------------------------------------------------


class _Sender:
    """One idempotent producer; each record's delivery decides its run's outcome."""

    def __init__(self, settings: Settings) -> None:
        self.producer = Producer(settings.client_config(**{
            "enable.idempotence": True, "partitioner": "murmur2_random", "linger.ms": 5}))
        self.errors: dict[str, str] = {}
        self.delivered: set[str] = set()

    def send(self, ident: str, topic: str, key: bytes, value: bytes) -> None:
        def done(err: KafkaError | None, _msg: object) -> None:
            if err is None:
                self.delivered.add(ident)
            else:
                self.errors[ident] = f"not delivered: {err.str()}"

        while True:
            try:
                self.producer.produce(topic, value, key, on_delivery=done)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)

    def finish(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)


def _apply(settings: Settings, chosen: list[RunRow], result: BulkResult, reason: str | None,
           progress: Progress | None, timeout_s: float) -> BulkResult:
    """One `RunOperation` per chosen run to the runs stage (keyed by execution id, so it
    reaches the partition that keeps the run's row)."""
    result.committed = True
    result.operation = uuid.uuid4().hex
    topic = Topics(settings).stage(RUNS_STAGE)
    sender = _Sender(settings)
    done: list[tuple[RunRow, str]] = []
    for i, row in enumerate(chosen, 1):
        op = RunOperation(operation=result.operation, execution_id=row.execution_id,
                          workflow=row.workflow, verb=result.verb,
                          issued_at_ms=int(time.time() * 1000), reason=reason)
        sender.send(row.execution_id, topic, row.execution_id.encode(), codec.encode(op))
        done.append((row, f"{result.verb} sent as {op.command_id}"
                     + (f": {reason}" if reason else "")))
        if progress is not None:
            progress(i, len(chosen))
    sender.finish(timeout_s)
    for row, what in done:
        error = sender.errors.get(row.execution_id)
        if row.execution_id in sender.delivered:
            result.succeeded.append(RunResult(row.execution_id, row.workflow,
                                              row.status.value, what))
        else:
            result.failed.append(RunResult(
                row.execution_id, row.workflow, row.status.value,
                error or f"not delivered within {timeout_s:g}s"))
    return result


def _preview(chosen: list[RunRow], result: BulkResult, what: str) -> BulkResult:
    result.succeeded = [RunResult(r.execution_id, r.workflow, r.status.value, what)
                        for r in chosen]
    return result


def _require_reason(reason: str) -> str:
    if not reason.strip():
        raise ValueError("a bulk cancel needs a reason: it is recorded on every run it stops")
    return reason


def preview_cancel(settings: Settings, workflow: str, limit: int,
                   runs: list[RunRow] | None = None) -> BulkResult:
    rows = selected(runs if runs is not None else read_runs(settings), workflow=workflow)
    chosen, result = plan(rows, "cancel", limit)
    return _preview(chosen, result, "would be cancelled")


def apply_cancel(settings: Settings, workflow: str, reason: str, limit: int, *,
                 only: Collection[str] | None = None, progress: Progress | None = None,
                 timeout_s: float = 30.0) -> BulkResult:
    reason = _require_reason(reason)
    rows = selected(read_runs(settings), workflow=workflow)
    chosen, result = plan(rows, "cancel", limit, only)
    return _apply(settings, chosen, result, reason, progress, timeout_s)


def preview_replay(settings: Settings, status: RunStatus, mode: Mode, limit: int, *,
                   workflow: str | None = None, runs: list[RunRow] | None = None) -> BulkResult:
    rows = selected(runs if runs is not None else read_runs(settings),
                    workflow=workflow, status=status)
    chosen, result = plan(rows, mode, limit)
    return _preview(chosen, result, f"would be {'redriven' if mode == 'redrive' else 'retried'}")


def apply_replay(settings: Settings, status: RunStatus, mode: Mode, limit: int, *,
                 workflow: str | None = None, reason: str | None = None,
                 only: Collection[str] | None = None, progress: Progress | None = None,
                 timeout_s: float = 30.0) -> BulkResult:
    """`reason` (optional for a replay) goes on each run's ledger row and redrive command;
    without one the row says `replay-many --mode <mode>`."""
    rows = selected(read_runs(settings), workflow=workflow, status=status)
    chosen, result = plan(rows, mode, limit, only)
    return _apply(settings, chosen, result, reason.strip() or None if reason else None,
                  progress, timeout_s)
