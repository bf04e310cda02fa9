"""Singleton `queue` mode: one start waits behind the active run of its key.

While a run holds the key, the newcomer waits here instead of standing down. A later
start replaces the waiting one: it runs under the waiting one's execution id, with the
latest payload, and the replaced start is `collapsed` naming that run, as debounce does
(docs/decisions/singleton-queue-mode.md). When the holder's run ends, the singleton stage
admits the waiting start: it takes the key and goes on down its route.

The waiting start is one logged row per key (and one for the headers it came with), so it
survives a worker's death; the hand-over from waiting to holding happens in the
transaction that applies the holder's release, so it is admitted once and never lost.
`timeouts.start` expires it (a timer from its arrival) and a cancelOn sweep discards it,
as every queue does.
"""

from __future__ import annotations

from typing import Any

from sluicegate.admission import pending
from sluicegate.admission.routing import Router
from sluicegate.admission.rows import Avro
from sluicegate.admission.stage import StageContext
from sluicegate.admission.stages import cancelon
from sluicegate.admission.stages.concurrency import expires_at
from sluicegate.admission.stages.groups import merged_slots
from sluicegate.declare import App, Workflow, format_duration
from sluicegate.engine.stage import Headers, StoreReader
from sluicegate.engine.tables import TEXT, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas.records import CancelSweep, Outcome, PendingStart, changed
from sluicegate.topology.keys import ControlKey, key_text

DEFERRAL = "singleton"
# Rows, under the stage's key for the singleton key (its hop key: workflow first, so a
# sweep reads the rows of the workflows it names and no others).
_WAITING = STATE_PREFIX + b"W"
WAITING = TableSpec("waiting", _WAITING, TEXT, Avro(PendingStart))  # -> the waiting start
# -> the headers it came with, when it came with any
WAITING_HEADERS = TableSpec("waiting.headers", STATE_PREFIX + b"V", TEXT,
                            pending.HeadersCodec())
TABLES: tuple[TableSpec[Any, Any], ...] = (WAITING, WAITING_HEADERS)
# Timer: + hop key, due when the waiting start's timeouts.start runs out.
_EXPIRE = b"X"

# -- the pure core -------------------------------------------------------------------


def replace(waiting: PendingStart | None, newcomer: PendingStart) -> PendingStart:
    """The start that waits once `newcomer` arrives: the newcomer itself, or, when one
    already waits, the newcomer under the waiting one's execution id (so the run a
    collapsed row names is the run that goes), with every request folded into it and
    every hold they took."""
    if waiting is None:
        return newcomer
    return changed(newcomer, execution_id=waiting.execution_id,
                   request_ids=[*waiting.request_ids, *newcomer.request_ids],
                   slots=merged_slots(waiting.slots, newcomer.slots))


# -- the rows --------------------------------------------------------------------------


def waiting(store: StoreReader, key: str) -> tuple[PendingStart, Headers | None] | None:
    """The start waiting at hop key `key`, with its headers."""
    raw = store.get(_WAITING + WAITING.key.encode(key))
    if raw is None:
        return None
    packed = store.get(WAITING_HEADERS.prefix + WAITING_HEADERS.key.encode(key))
    return (WAITING.value.decode(raw),
            WAITING_HEADERS.value.decode(packed) if packed is not None else None)


def _waiting(ctx: StageContext, key: str) -> tuple[PendingStart, Headers | None] | None:
    start = ctx.table(WAITING.name).get(key)
    if start is None:
        return None
    return start, ctx.table(WAITING_HEADERS.name).get(key)


def any_waiting(store: StoreReader) -> bool:
    """Whether a start waits at any key of `store`."""
    return next(iter(store.items(_WAITING)), None) is not None


def waiting_for(store: StoreReader, workflow: str, text: str) -> PendingStart | None:
    """The start waiting for `workflow`'s singleton key `text` (ops: what waits there)."""
    found = waiting(store, str(ControlKey(workflow, text)))
    return found[0] if found is not None else None


def _put(ctx: StageContext, key: str, start: PendingStart, headers: Headers | None) -> None:
    ctx.table(WAITING.name).put(key, start)
    if headers:
        ctx.table(WAITING_HEADERS.name).put(key, headers)
    else:
        ctx.table(WAITING_HEADERS.name).delete(key)


def _timeout_ms(router: Router, workflow: str) -> int | None:
    wf = router.workflow(workflow)
    return wf.timeouts.start_ms if wf is not None and wf.timeouts is not None else None


def _remove(ctx: StageContext, router: Router, key: str, start: PendingStart) -> None:
    ctx.table(WAITING.name).delete(key)
    ctx.table(WAITING_HEADERS.name).delete(key)
    due = expires_at(start, _timeout_ms(router, start.workflow))
    if due is not None:
        ctx.timers.cancel(due, _EXPIRE + key.encode())


# -- what the singleton stage asks of it ---------------------------------------------------


def wait(ctx: StageContext, app: App, router: Router, wf: Workflow, key: str,
         start: PendingStart, holder: str, headers: Headers | None) -> None:
    """`start` found the key held by run `holder`: it waits, replacing the start that
    waited before it, if any (that one is `collapsed` into the run that will go)."""
    text = key_text(key)
    if cancelon.discard_on_arrival(ctx, app, router, start, text, headers=headers):
        # A sweep passed while it was on its way here: it would have been discarded here.
        return
    before = _waiting(ctx, key)
    carrier = replace(before[0] if before is not None else None, start)
    if before is not None:
        old = before[0]
        _remove(ctx, router, key, old)
        router.decide(ctx, old, Outcome.collapsed, key=text, execution_id=carrier.execution_id,
                      reason=f"replaced by a later start while singleton key {text!r} is held "
                             f"by run {holder}; the latest payload runs as "
                             f"{carrier.execution_id} when that run ends")
        router.alias(ctx, start, carrier.execution_id)
    _put(ctx, key, carrier, headers)
    due = expires_at(carrier, _timeout_ms(router, wf.name))
    if due is not None:
        ctx.timers.schedule(due, _EXPIRE + key.encode())
    router.queued(ctx, carrier, deferral=DEFERRAL, key=text, position=0,
                  reason=f"singleton: key {text!r} is held by run {holder}; next to run "
                         "when it ends (a later start would replace this one)",
                  headers=headers)


def take(ctx: StageContext, router: Router, key: str) -> tuple[PendingStart, Headers | None] | None:
    """The key's holder ended: the start waiting for it, no longer waiting (the stage
    gives it the key and sends it on)."""
    found = _waiting(ctx, key)
    if found is not None:
        _remove(ctx, router, key, found[0])
    return found


def sweep(ctx: StageContext, app: App, router: Router, cancel: CancelSweep) -> None:
    """cancelOn discards the waiting starts of the workflows the sweep names that match."""
    for workflow in cancel.workflows:
        for key in list(ctx.table(WAITING.name).keys(ControlKey(workflow).encode())):
            found = _waiting(ctx, key)
            if found is None:
                continue
            start, headers = found
            reason = cancelon.judge(app, router, ctx.stage, cancel, start,
                                    cancelon.Group.of(headers))
            if reason is not None:
                _remove(ctx, router, key, start)
                cancelon.discard(ctx, router, start, cancel, reason, key_text(key),
                                 headers=headers)


def fire(ctx: StageContext, router: Router, due_ms: int, timer: bytes) -> bool:
    """A timer of this mode: its waiting start's timeouts.start ran out. False for a
    timer that is not this mode's."""
    if not timer.startswith(_EXPIRE):
        return False
    key = timer[len(_EXPIRE):].decode()
    found = _waiting(ctx, key)
    if found is None:
        return True
    start, headers = found
    allowed = _timeout_ms(router, start.workflow)
    if expires_at(start, allowed) != due_ms:
        # A timer of a start replaced since, or of a declaration changed since.
        return True
    _remove(ctx, router, key, start)
    waited = format_duration(max(0, ctx.now_ms - start.arrived_at_ms))
    limit = f" (timeouts.start is {format_duration(allowed)})" if allowed else ""
    router.fail(ctx, start, Outcome.expired,
                f"timeouts.start: waited {waited} for singleton key {key_text(key)!r} to be "
                f"free and its run never ended{limit}", key=key_text(key), headers=headers)
    return True
