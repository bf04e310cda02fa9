"""Writing a decision: the ledger row, the answer to a waiting caller, the admitted start.

Every stage that decides goes through here, so a decision is always a ledger record in
the same transaction as its effect, and a caller that asked to wait always hears back.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from sluicegate import tracing
from sluicegate.admission.stage import StageContext
from sluicegate.engine.stage import Headers, InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Origin,
    Outcome,
    Reply,
    StartRequest,
)

# Room a dead letter keeps for what is not the record's key and value (its reason, where
# the record came from, its framing); and the longest reason it carries.
DEAD_LETTER_RESERVE_BYTES = 16 * 1024
MAX_REASON_CHARS = 4000
# The stage that keeps the runs table (admission/stages/runs.py).
RUNS_STAGE = "runs"
# Outcomes whose decision span is marked failed.
_FAILED = frozenset({Outcome.rejected, Outcome.failed, Outcome.expired, Outcome.lease_expired})


def request_id_for(record: InputRecord) -> str:
    """The id of a request too broken to carry one: where it was read."""
    return f"{record.topic}:{record.partition}:{record.offset}"


def record_decision(ctx: StageContext, row: LedgerRecord, reply_partition: int | None,
                    trace: Headers | None = None) -> None:
    """The ledger row, with `trace` (the start's trace context, `tracing.trace_of`), the
    answer to a caller that waits, and the decision's span when the worker records spans."""
    ctx.send(ctx.topics.ledger, row.request_id.encode(), codec.encode(row), None, trace)
    spans = tracing.spans
    if spans is not None:
        decision_span(spans, ctx, row, trace)
    if reply_partition is not None:
        answer = Reply(
            request_id=row.request_id, outcome=row.outcome, decided_at_ms=row.decided_at_ms,
            execution_id=row.execution_id, reason=row.reason,
            retry_after_ms=row.retry_after_ms, deferral=row.deferral,
            due_at_ms=row.due_at_ms, position=row.position,
        )
        ctx.send(ctx.topics.replies, row.request_id.encode(), codec.encode(answer),
                 reply_partition)


def decision_span(spans: tracing.Spans, ctx: StageContext, row: LedgerRecord,
                  trace: Headers | None) -> None:
    """The span of one decision: what its ledger row says, in a trace backend."""
    spans.record(f"{row.outcome.value} {row.workflow}", trace, {
        "sluicegate.workflow": row.workflow,
        "sluicegate.outcome": row.outcome.value,
        "sluicegate.control": row.control,
        "sluicegate.key": row.key,
        "sluicegate.reason": row.reason,
        "sluicegate.queue_position": row.position,
        "sluicegate.waited_ms": row.waited_ms,
        "sluicegate.deferral": row.deferral,
        "sluicegate.stage": row.stage,
        "sluicegate.request_id": row.request_id,
        "sluicegate.execution_id": row.execution_id,
        "messaging.destination.partition.id": str(ctx.partition),
    }, (row.reason or row.outcome.value) if row.outcome in _FAILED else None)


def admit(ctx: StageContext, admitted: AdmittedStart, trace: Headers | None = None) -> None:
    """To the engines, with the start's trace context (`trace`), and to the runs stage,
    which keeps the run's row: handed over in this worker when it owns the row's
    partition, else through the runs stage's topic (docs/decisions/in-process-handover.md)."""
    key, value = admitted.execution_id.encode(), codec.encode(admitted)
    ctx.send(ctx.topics.admitted, key, value, None, trace)
    ctx.send(ctx.topics.stage(RUNS_STAGE), key, value, None, trace, admitted)


def dead_letter(ctx: StageContext, record: InputRecord, reason: str) -> None:
    """The record as it came, and why it could not be handled. A record too large to be
    copied whole (with the reason and where it came from) into a dead letter is cut, and
    the reason says where: a dead letter must always be writable, or the record would be
    lost with it."""
    key, value = record.key, record.value
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[:MAX_REASON_CHARS] + " [...]"
    room = ctx.topics.settings.max_record_bytes - DEAD_LETTER_RESERVE_BYTES
    if key is not None and len(key) > room // 2:
        reason += f"; key cut to its first {room // 2:,} of {len(key):,} bytes"
        key = key[:room // 2]
    if value is not None and len(value) > room - len(key or b""):
        keep = room - len(key or b"")
        reason += (f"; value cut to its first {keep:,} of {len(value):,} bytes to fit the "
                   "dead-letter topic")
        value = value[:keep]
    letter = DeadLetter(
        source_topic=record.topic, source_partition=record.partition,
        source_offset=record.offset, reason=reason, stage=ctx.stage, at_ms=ctx.now_ms,
        key=key, value=value,
    )
    # Keyed as the record was (within the limit), so a key's dead letters stay in order;
    # with the trace context of the start it was.
    ctx.send(ctx.topics.deadletter, key, codec.encode(letter), None,
             tracing.trace_of(record.headers) if record.headers else None)


def reject(ctx: StageContext, record: InputRecord, reason: str,
           start: StartRequest | None = None, workflow: str | None = None, *,
           salvaged: Salvaged | None = None) -> None:
    """A bad request: dead letter with the reason, and a `rejected` ledger row (and a reply
    to a caller that waits). A request that does not decode is named by what `salvaged`
    could read of it, else by where it was read."""
    dead_letter(ctx, record, reason)
    now = ctx.now_ms
    if start is None and salvaged is not None and salvaged.request_id is not None:
        start = salvaged.as_request(now)
    row = LedgerRecord(
        request_id=start.request_id if start else request_id_for(record),
        workflow=workflow or (start.workflow if start else ""),
        outcome=Outcome.rejected, requested_at_ms=start.requested_at_ms if start else now,
        decided_at_ms=now, stage=ctx.stage, reason=reason,
    )
    record_decision(ctx, row, start.reply_partition if start else None,
                    tracing.trace_of(record.headers) if record.headers else None)


@dataclass(frozen=True, slots=True)
class Salvaged:
    """What could be read of a start request that does not decode: enough to name the
    request on its `rejected` row and to answer a caller that waits for it."""

    request_id: str | None = None
    workflow: str | None = None
    reply_partition: int | None = None
    requested_at_ms: int | None = None
    # Where it was read, for the reason: "headers", "body", "headers and body".
    source: str | None = None

    def as_request(self, now_ms: int) -> StartRequest:
        assert self.request_id is not None
        return StartRequest(
            request_id=self.request_id, workflow=self.workflow or "", payload=b"",
            origin=Origin.event, requested_at_ms=self.requested_at_ms or now_ms,
            reply_partition=self.reply_partition)



def describe_invalid(exc: Exception) -> str:
    """A pydantic validation error (or a JSON error) in one line a person can act on."""
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)
