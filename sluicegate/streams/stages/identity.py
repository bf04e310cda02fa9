"""Identity: validate a start, resolve its idempotency key, answer repeats with the first run.

Step 1 of SPEC.md section 3. The idempotency key is the execution's identity: once spent
it answers `existing` with the first run's execution id, permanently unless the
workflow declares a `ttl`. A workflow with no idempotency key and no explicit id touches
no state here at all; one with no controls is admitted on the spot (the passthrough).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sluicegate.declare import App, Workflow, applies
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    LedgerRecord,
    Outcome,
    StartRequest,
)
from sluicegate.streams.decisions import admit, execution_id_for, record_decision, reject
from sluicegate.streams.stage import InputRecord, Stage, StageContext
from sluicegate.streams.timers import STATE_PREFIX
from sluicegate.topology.route import Route, route_for
from sluicegate.topology.topics import Topics

# -- the pure core -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IdentityRow:
    execution_id: str
    request_id: str
    # None while the key is permanent, or while its run is live.
    expires_at_ms: int | None = None

    def encode(self) -> bytes:
        expires = "" if self.expires_at_ms is None else str(self.expires_at_ms)
        return f"{self.execution_id}\x1f{self.request_id}\x1f{expires}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> IdentityRow:
        execution_id, request_id, expires = raw.decode().split("\x1f")
        return cls(execution_id, request_id, int(expires) if expires else None)


@dataclass(frozen=True, slots=True)
class Spent:
    """The key was used before: the caller gets the earlier run."""

    execution_id: str


@dataclass(frozen=True, slots=True)
class Fresh:
    row: IdentityRow


def decide(row: IdentityRow | None, execution_id: str, request_id: str,
           now_ms: int) -> Spent | Fresh:
    if row is not None and (row.expires_at_ms is None or row.expires_at_ms > now_ms):
        return Spent(row.execution_id)
    return Fresh(IdentityRow(execution_id, request_id))


def identity_key(wf: Workflow, start: StartRequest, payload: Any) -> str | None:
    """The key that names this start's execution, or None when nothing names it.

    An explicit id wins on every origin (a `direct` start's retry-safe id, or an event's
    own id); the declared expression applies to event starts only (seed 003's matrix).
    """
    if start.idempotency_id is not None:
        return start.idempotency_id
    idem = wf.idempotency
    if idem is not None and idem.key_expr is not None and applies("idempotency", start.origin):
        return idem.key_expr.text(payload)
    return None


def store_key(workflow: str, key: str) -> bytes:
    return f"{workflow}\x1f{key}".encode()


# -- the stage -----------------------------------------------------------------------


class IdentityStage(Stage):
    name = "identity"

    def __init__(self, app: App, partitions: int) -> None:
        self.app = app
        self.partitions = partitions
        self.routes: dict[str, Route] = {wf.name: route_for(wf) for wf in app.workflows.values()}

    def inputs(self, topics: Topics) -> tuple[str, ...]:
        return (topics.starts, topics.stage(self.name))

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.value is None:
            reject(ctx, record, "empty record: a start request needs a value")
            return
        try:
            start = codec.decode(StartRequest, record.value)
        except codec.DecodeError as exc:
            reject(ctx, record, f"not a start request: {exc}")
            return
        wf = self.app.get(start.workflow)
        if wf is None:
            reject(ctx, record, f"unknown workflow {start.workflow!r}", start)
            return
        try:
            payload = json.loads(start.payload)
            model = wf.batch.item if wf.batch is not None else wf.payload
            model.model_validate(payload)
        except (ValueError, ValidationError) as exc:
            reject(ctx, record, f"workflow {wf.name}: payload does not validate: {_brief(exc)}",
                   start)
            return

        key = identity_key(wf, start, payload)
        now = ctx.now_ms
        execution_id = execution_id_for(wf.name, start.request_id)
        if key is not None:
            skey = store_key(wf.name, key)
            if partition_for(skey, self.partitions) != ctx.partition:
                # Produced under another key: re-key it so this key's state has one owner.
                ctx.send(ctx.topics.stage(self.name), skey, record.value)
                return
            raw = ctx.store.get(STATE_PREFIX + skey)
            decision = decide(IdentityRow.decode(raw) if raw else None, execution_id,
                              start.request_id, now)
            if isinstance(decision, Spent):
                self._decided(ctx, start, wf, Outcome.existing, key, decision.execution_id,
                              f"idempotency key {key!r} already spent")
                return
            ctx.store.put(STATE_PREFIX + skey, decision.row.encode())

        route = self.routes[wf.name]
        if route.passthrough:
            admit(ctx, AdmittedStart(
                execution_id=execution_id, workflow=wf.name, payload=start.payload,
                declaration_version=wf.version, origin=start.origin,
                kind=AdmittedKind.start, slots=[], request_ids=[start.request_id],
                requested_at_ms=start.requested_at_ms, admitted_at_ms=now,
            ))
            self._decided(ctx, start, wf, Outcome.admitted, key, execution_id, None)
            return
        # The controls' stages consume their own topics; until one judges this start it
        # waits there, durably.
        next_hop = route.hops[1]
        ctx.send(ctx.topics.stage(next_hop.stage), store_key(wf.name, key or start.request_id),
                 record.value)

    def _decided(self, ctx: StageContext, start: StartRequest, wf: Workflow, outcome: Outcome,
                 key: str | None, execution_id: str | None, reason: str | None) -> None:
        now = ctx.now_ms
        record_decision(ctx, LedgerRecord(
            request_id=start.request_id, workflow=wf.name, outcome=outcome,
            requested_at_ms=start.requested_at_ms, decided_at_ms=now,
            waited_ms=max(0, now - start.requested_at_ms), key=key, stage=self.name,
            reason=reason, execution_id=execution_id, declaration_version=wf.version,
        ), start.reply_partition)


def _brief(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)
