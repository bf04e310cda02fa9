"""Identity: validate a start, resolve its idempotency key, answer repeats with the first run.

Step 1 of SPEC.md section 3. The idempotency key is the execution's identity: once spent
it answers `existing` with the first run's execution id, permanently unless the
workflow declares a `ttl` (then the key is kept while the run is live and `ttl` after it
ends: the run holds an identity slot, and its release starts the countdown). A workflow
with no idempotency key and no explicit id touches no state here at all; one with no
controls is admitted on the spot (the passthrough).

Delayed starts (`at`) are parked here (`delayed.py`), after identity and before every
other control, so that at `at` they arrive at the controls as ordinary starts judged as of
that moment.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass

from sluicegate import tracing
from sluicegate.admission.decisions import (
    Salvaged,
    admit,
    describe_invalid,
    record_decision,
    reject,
)
from sluicegate.admission.routing import (
    Router,
    checked_under,
    declared_digest,
    declared_table,
    mark_checked,
)
from sluicegate.admission.rows import text_fields
from sluicegate.admission.stage import AdmissionStage, StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.delayed import DelayedStarts, is_delayed
from sluicegate.declare import App, Workflow
from sluicegate.engine.stage import Headers, InputRecord, StoreReader
from sluicegate.engine.tables import RAW, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.payloads import SealError, validate
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    CancelSweep,
    IdentityAlias,
    LedgerRecord,
    Outcome,
    PendingStart,
    Release,
    ReleaseKind,
    Slot,
    StartRequest,
    changed,
)
from sluicegate.topology.keys import (
    ControlKey,
    execution_id_for,
    identity_key,
    identity_store_key,
)

NAME = "identity"
_EXPIRE = b"X"

# Headers a producer may set on a start request. They are read only when its value does
# not decode, to name the request on its rejection and answer it (docs/wire-format.md).
REQUEST_ID_HEADER = "sluicegate.request_id"
WORKFLOW_HEADER = "sluicegate.workflow"
REPLY_PARTITION_HEADER = "sluicegate.reply_partition"
# Longer text read from a broken record is taken for noise, not an id or a name.
_MAX_SALVAGED_CHARS = 256

# -- the pure core -------------------------------------------------------------------


def salvage(record: InputRecord, partitions: int) -> Salvaged:
    """What can be read of a start request whose value does not decode: its headers
    first (the producer's own word), then the leading fields of its body
    (`codec.leading_fields`). Text that is not a plausible id or name, and a reply
    partition that `sg.replies` does not have, are left out; a reply partition is kept
    only with a request id to answer."""
    headers: dict[str, str] = {}
    for name, raw in record.headers or ():
        if name in (REQUEST_ID_HEADER, WORKFLOW_HEADER, REPLY_PARTITION_HEADER):
            try:
                headers[name] = raw.decode() if isinstance(raw, bytes) else raw or ""
            except UnicodeDecodeError:
                continue
    body = codec.leading_fields(StartRequest, record.value)
    sources: list[str] = []

    def text(header: str, field: str) -> str | None:
        for source, value in (("headers", headers.get(header)), ("body", body.get(field))):
            if (isinstance(value, str) and 0 < len(value) <= _MAX_SALVAGED_CHARS
                    and value.isprintable()):
                sources.append(source)
                return value
        return None

    def partition() -> int | None:
        given = headers.get(REPLY_PARTITION_HEADER, "")
        for source, value in (("headers", int(given) if given.isdecimal() else None),
                              ("body", body.get("reply_partition"))):
            if isinstance(value, int) and 0 <= value < partitions:
                sources.append(source)
                return value
        return None

    request_id = text(REQUEST_ID_HEADER, "request_id")
    workflow = text(WORKFLOW_HEADER, "workflow")
    reply = partition() if request_id is not None else None
    requested = body.get("requested_at_ms")
    return Salvaged(
        request_id=request_id, workflow=workflow, reply_partition=reply,
        requested_at_ms=requested if isinstance(requested, int) and requested > 0 else None,
        source=" and ".join(sorted(set(sources), reverse=True)) or None,
    )


@dataclass(frozen=True, slots=True)
class IdentityRow:
    execution_id: str
    request_id: str
    # None while the key is permanent, or while its run is live.
    expires_at_ms: int | None = None



# The spent keys: (workflow \x1f idempotency key) -> the run it names. Directly under
# STATE_PREFIX, as the releases before kept it: no workflow's name starts with 0x00, which
# the stage's other rows (the declarations' digest, cancelOn's, delayed starts') do.
SPENT = TableSpec("spent", STATE_PREFIX, RAW, text_fields(IdentityRow))


def spent_key_row(store_key: bytes, value: bytes | None) -> tuple[str, str, str | None] | None:
    """A record of the identity store's changelog read as (workflow, idempotency key,
    the execution id it names, or None once the key is gone), or None for the store's
    other rows (timers, delayed starts, the declarations' digest). What `runs show KEY`
    finds a run by before any repeat answered `existing` (docs/decisions/run-lookup.md)."""
    if not store_key.startswith(STATE_PREFIX) or store_key[len(STATE_PREFIX):][:1] == b"\x00":
        return None  # the declarations' digest, kept sweeps, a delayed start's trace
    key = ControlKey.parse(store_key[len(STATE_PREFIX):])
    if value is None:
        return key.budget, key.text, None
    try:
        return key.budget, key.text, SPENT.value.decode(value).execution_id
    except (ValueError, UnicodeDecodeError):
        return None


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


def ended(row: IdentityRow, execution_id: str, ended_at_ms: int, ttl_ms: int) -> IdentityRow:
    """The run holding the key ended: the key lives `ttl` more (only that run's end counts)."""
    if row.execution_id != execution_id:
        return row
    return IdentityRow(row.execution_id, row.request_id, ended_at_ms + ttl_ms)


# -- the stage -----------------------------------------------------------------------


class IdentityStage(AdmissionStage):
    name = NAME
    tables = (SPENT, *DelayedStarts.TABLES, *cancelon.KEPT_TABLES,
              declared_table())
    # cancelOn's index of the delayed starts by workflow follows from their timers.
    derived = cancelon.SweepIndex.DERIVED

    def derive(self, store: StoreReader,
               beside: Mapping[str, StoreReader] | None = None) -> dict[bytes, bytes]:
        return self.delayed.sweeps.rows(self.delayed.indexed(store))

    def __init__(self, app: App, partitions: int, router: Router,
                 max_payload_bytes: int) -> None:
        self.app = app
        self.partitions = partitions
        self.router = router
        self.max_payload_bytes = max_payload_bytes
        self._declared = declared_digest(app)
        self.delayed = DelayedStarts(app, router)
        # The workflows with no control after identity, admitted on the spot.
        self._passthrough = frozenset(
            name for name, route in router.routes.items() if route.passthrough)
        # Whether this stage needs a workflow's payload as data: for its idempotency
        # expression, its priority, or a key of a later hop. A passthrough with none of
        # these never parses it.
        self._reads_payload = {
            wf.name: bool((wf.idempotency is not None and wf.idempotency.key_expr is not None)
                          or wf.priority is not None
                          or wf.name not in self._passthrough)
            for wf in app.workflows.values()
        }

    def unprocessable(self, ctx: StageContext, record: InputRecord, reason: str) -> None:
        self.router.give_up(ctx, record, reason)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.value is None:
            self._undecodable(ctx, record, "empty record: a start request needs a value")
            return
        try:
            if record.topic == ctx.topics.starts:
                start = codec.decode(StartRequest, record.value)
            else:
                # Its own topic carries re-keyed starts and the releases of ttl keys.
                message = codec.decode_one_of(
                    (StartRequest, Release, IdentityAlias, CancelSweep), record.value)
                if isinstance(message, Release):
                    self._release(ctx, message)
                    return
                if isinstance(message, CancelSweep):
                    self._cancel_delayed(ctx, message)
                    return
                if isinstance(message, IdentityAlias):
                    # Collapsed by debounce or batch: a repeat of the key names the run
                    # that absorbed it (SPEC.md section 3, step 1).
                    ctx.table("spent").put(message.key.encode(), IdentityRow(
                        message.execution_id, message.request_id))
                    return
                start = message
        except codec.DecodeError as exc:
            self._undecodable(ctx, record, f"not a start request: {exc}")
            return
        if start.reply_partition is not None and not 0 <= start.reply_partition < self.partitions:
            # No answer can be written there; the rejection says why instead.
            reject(ctx, record, f"reply_partition {start.reply_partition} is not a partition "
                   f"of {ctx.topics.replies} (0 to {self.partitions - 1})",
                   changed(start, reply_partition=None))
            return
        wf = self.app.get(start.workflow)
        if wf is None:
            reject(ctx, record, f"unknown workflow {start.workflow!r}", start)
            return
        # Read once: each read of a declaration's field is a call (pydantic's __getattr__).
        name = wf.name
        payloads = self.router.payloads
        kept = payloads.seal_bytes(wf, start.payload)
        if kept is not start.payload:
            # A producer that does not seal: every copy from here on is sealed, a dead
            # letter's too.
            start = dataclasses.replace(start, payload=kept)
            record = dataclasses.replace(record, value=codec.encode(start))
        if len(start.payload) > self.max_payload_bytes:
            # It could be taken, but not admitted: the admitted start carries it whole.
            reject(ctx, record,
                   f"workflow {name}: payload of {len(start.payload):,} bytes is over the "
                   f"{self.max_payload_bytes:,}-byte limit of a start's payload (message.max"
                   ".bytes less room for the admitted start's other fields)", start)
            return
        try:
            plain = payloads.open_bytes(start.payload)
            validate(wf.start_model, plain)
            # Parsed into data only when something here reads it.
            payload = json.loads(plain) if self._reads_payload[name] else None
        except SealError as exc:
            reject(ctx, record, f"workflow {name}: payload cannot be opened: {exc}", start)
            return
        except ValueError as exc:  # pydantic's ValidationError is one
            reject(ctx, record,
                   f"workflow {name}: payload does not validate: {describe_invalid(exc)}",
                   start)
            return

        key = identity_key(wf, start, payload)
        now = ctx.now_ms
        # The producer's trace context goes on with the start; its other headers do not.
        trace = tracing.trace_of(record.headers) if record.headers else None
        # Placed on this partition: a passthrough's run row is written in this task.
        execution_id = execution_id_for(name, start.request_id, ctx.partition,
                                        self.partitions)
        slots: list[Slot] = []
        if key is not None:
            skey = identity_store_key(name, key)
            if partition_for(skey, self.partitions) != ctx.partition:
                # Produced under another key: re-key it so this key's state has one owner.
                ctx.send(ctx.topics.stage(self.name), skey, record.value, None, trace)
                return
            decision = decide(ctx.table("spent").get(skey), execution_id,
                              start.request_id, now)
            if isinstance(decision, Spent):
                self._existing(ctx, start, wf, key, decision.execution_id, now, trace)
                return
            ctx.table("spent").put(skey, decision.row)
            if wf.idempotency is not None and wf.idempotency.ttl is not None:
                slots.append(Slot(self.name, skey.decode()))

        if name in self._passthrough and start.at_ms is None and not self.router.paused(name):
            # The do-nothing path: straight to the engine.
            # Positional: a keyword call costs twice as much (records-built-in-python.md).
            admit(ctx, AdmittedStart(
                execution_id, name, start.payload, wf.version, start.origin,
                AdmittedKind.start, slots, [start.request_id], start.requested_at_ms, now,
                start.retry_of,
            ), trace)
            self._decided(ctx, start, wf, Outcome.admitted, key, execution_id, now, None, trace)
            return

        # Positional, as the admitted start above.
        priority = wf.priority
        pending = PendingStart(
            execution_id, name, start.payload, start.origin, AdmittedKind.start, wf.version,
            0, start.request_id, [start.request_id], start.requested_at_ms, now,
            priority.value(payload) if priority is not None else 0.0, slots,
            start.reply_partition, key, start.retry_of, wf.on_failure,
        )
        if start.at_ms is not None and start.at_ms > now:
            self.delayed.park(ctx, pending, start.at_ms, wf, trace)
            return
        self.router.forward(ctx, pending, payload, trace)

    def restored(self, ctx: StageContext) -> None:
        """A delayed start of a workflow no longer declared fails now, not at its `at`
        (up to its declared horizon away). This reads every timer of the partition (the
        idempotency keys' expiries too), so only when the declarations changed since the
        partition was last checked."""
        self.delayed.restored(ctx)
        if checked_under(ctx, self._declared):
            return
        self.delayed.fail_removed(ctx)
        mark_checked(ctx, self._declared)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if cancelon.forget(ctx, key):
            return
        if is_delayed(key):
            self.delayed.fire(ctx, due_ms, key, value)
        elif key.startswith(_EXPIRE):
            skey = key[len(_EXPIRE):]
            row = ctx.table("spent").get(skey)
            if row is not None and row.expires_at_ms is not None and row.expires_at_ms <= due_ms:
                ctx.table("spent").delete(skey)

    def _cancel_delayed(self, ctx: StageContext, sweep: CancelSweep) -> None:
        cancelon.keep(ctx, sweep)
        self.delayed.cancel_queued(ctx, sweep)

    def _undecodable(self, ctx: StageContext, record: InputRecord, reason: str) -> None:
        """A record that is no start request: rejected under what can be read of it, so
        that a producer waiting for its request id hears why (docs/wire-format.md)."""
        if record.topic != ctx.topics.starts:
            reject(ctx, record, reason)  # sluicegate's own topic: no producer waits
            return
        found = salvage(record, self.partitions)
        read = [what for what, value in (("request id", found.request_id),
                                         ("workflow", found.workflow),
                                         ("reply partition", found.reply_partition))
                if value is not None]
        if read:
            reason += f" ({', '.join(read)} read from the record's {found.source})"
        reject(ctx, record, reason, workflow=found.workflow, salvaged=found)

    # -- ttl ---------------------------------------------------------------------------

    def _release(self, ctx: StageContext, release: Release) -> None:
        if release.kind is not ReleaseKind.ended and release.kind is not ReleaseKind.expired:
            return
        wf = self.app.get(release.workflow)
        ttl = wf.idempotency.ttl_ms if wf is not None and wf.idempotency is not None else None
        skey = release.key.encode()
        spent = ctx.table("spent")
        found = spent.get(skey)
        if found is None or ttl is None:
            return
        row = ended(found, release.execution_id, release.at_ms, ttl)
        if row.expires_at_ms is not None:
            spent.put(skey, row)
            ctx.timers.schedule(row.expires_at_ms, _EXPIRE + skey)

    # -- decisions -----------------------------------------------------------------------

    def _existing(self, ctx: StageContext, start: StartRequest, wf: Workflow, key: str,
                  execution_id: str, now: int, trace: Headers | None) -> None:
        self._decided(ctx, start, wf, Outcome.existing, key, execution_id, now,
                      f"idempotency key {key!r} already spent", trace)

    def _decided(self, ctx: StageContext, start: StartRequest, wf: Workflow, outcome: Outcome,
                 key: str | None, execution_id: str | None, now: int,
                 reason: str | None = None, trace: Headers | None = None) -> None:
        # Positional, as the admitted start above: every start comes through here.
        record_decision(ctx, LedgerRecord(
            start.request_id, wf.name, outcome, start.requested_at_ms, now,
            max(0, now - start.requested_at_ms), 0, key, self.name, reason, execution_id,
            None, None, None, None, wf.version, None,
            "idempotency" if key is not None else None,
        ), start.reply_partition, trace)
