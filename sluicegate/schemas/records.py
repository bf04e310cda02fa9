"""The records sluicegate writes to and reads from Kafka.

One dataclass (or enum) per Avro named type in ``avro/``, with the same name and
the same fields in the same order; the codec checks the pairing at import.
Timestamps are milliseconds since the epoch; payloads are JSON bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import TypeVar, cast

from typing_extensions import dataclass_transform

# How a start was asked for: a declaration's concept (which controls apply), carried by
# the records.
from sluicegate.declare.origins import Origin

_R = TypeVar("_R")


@dataclass_transform(frozen_default=True)
def record(cls: type[_R]) -> type[_R]:
    """A record type: a slots dataclass that the type checker treats as frozen.

    Records are values: nothing assigns to a field once one is built (mypy refuses it,
    `dataclasses.replace` makes a changed copy). They are not frozen at run time because
    a frozen dataclass's `__init__` sets each field through `object.__setattr__`, which
    makes building one cost over twice as much, and the admission path builds several
    per start. `unsafe_hash` keeps them hashable like the frozen ones they stand for.
    """
    make: Callable[[type[_R]], type[_R]] = dataclass(slots=True, unsafe_hash=True)
    return make(cls)


# Per record type: a copier written out for its fields (one positional call, each field
# the change given for it or the record's own), and the names of its fields.
_COPIERS: dict[type, tuple[Callable[[object, dict[str, object]], object], frozenset[str]]] = {}


def _copier(cls: type) -> tuple[Callable[[object, dict[str, object]], object], frozenset[str]]:
    names = tuple(f.name for f in fields(cls))
    env: dict[str, object] = {"_cls": cls}
    args = ", ".join(f"c[{n!r}] if {n!r} in c else r.{n}" for n in names)
    exec(compile(f"def copy(r, c):\n    return _cls({args})\n", f"<copier {cls.__name__}>",
                 "exec"), env)
    copy = cast(Callable[[object, dict[str, object]], object], env["copy"])
    made = _COPIERS[cls] = (copy, frozenset(names))
    return made


def changed(rec: _R, **changes: object) -> _R:
    """A copy of the record `rec` with some fields changed: `dataclasses.replace` at a
    fraction of its cost (one positional call of the class, written out for its fields, so
    its `__init__` runs as replace runs it), for the copies the gated path makes at every
    hop. An unknown field is refused as replace refuses it."""
    cls = type(rec)
    known = _COPIERS.get(cls)
    copy, name_set = known if known is not None else _copier(cls)
    if not name_set.issuperset(changes):
        unknown = next(name for name in changes if name not in name_set)
        raise TypeError(f"{cls.__name__} has no field {unknown!r}")
    return copy(rec, changes)  # type: ignore[return-value]


class AdmittedKind(StrEnum):
    start = "start"
    resume = "resume"


class Outcome(StrEnum):
    """A decision on a start request, as written to the ledger (SPEC 2)."""

    admitted = "admitted"
    existing = "existing"
    queued = "queued"
    dropped = "dropped"
    skipped = "skipped"
    rejected = "rejected"
    collapsed = "collapsed"
    expired = "expired"
    cancelled = "cancelled"
    failed = "failed"
    lease_expired = "lease_expired"
    # An operator's replay of a run (replay-many): rows about the run, not a request.
    redriven = "redriven"
    retried = "retried"
    # An operator's override of a declared limit: a row about a limit, not a request.
    overridden = "overridden"


class RunEventKind(StrEnum):
    started = "started"
    heartbeat = "heartbeat"
    suspended = "suspended"
    resumed = "resumed"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


class CommandKind(StrEnum):
    cancel = "cancel"
    redrive = "redrive"


class ReleaseKind(StrEnum):
    ended = "ended"
    suspended = "suspended"
    expired = "expired"


class RunStatus(StrEnum):
    admitted = "admitted"
    running = "running"
    suspended = "suspended"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"


# A run in one of these has ended; in one of those, it is live (admitted to an engine,
# running, or suspended between steps).
ENDED = frozenset({RunStatus.completed, RunStatus.failed, RunStatus.cancelled})
LIVE = frozenset({RunStatus.admitted, RunStatus.running, RunStatus.suspended})


@record
class Slot:
    """A hold a run keeps on one stage's key until the engine reports it ended."""

    stage: str
    key: str


@record
class StartRequest:
    """sg.starts: a caller asks for a run."""

    request_id: str
    workflow: str
    payload: bytes
    origin: Origin
    requested_at_ms: int
    idempotency_id: str | None = None
    at_ms: int | None = None
    reply_partition: int | None = None
    wait: bool = False
    retry_of: str | None = None


@record
class AdmittedStart:
    """sg.admitted (key: execution_id): a run the engine is to start or resume."""

    execution_id: str
    workflow: str
    payload: bytes
    declaration_version: str
    origin: Origin
    kind: AdmittedKind
    slots: list[Slot]
    request_ids: list[str]
    requested_at_ms: int
    admitted_at_ms: int
    retry_of: str | None = None
    # The run's lease and the heartbeat cadence it asks of the engine (None: no lease).
    lease_ms: int | None = None
    heartbeat_every_ms: int | None = None


@record
class LedgerRecord:
    """sg.ledger (key: request_id): one decision on one start request."""

    request_id: str
    workflow: str
    outcome: Outcome
    requested_at_ms: int
    decided_at_ms: int
    waited_ms: int = 0
    folded: int = 0
    key: str | None = None
    stage: str | None = None
    reason: str | None = None
    execution_id: str | None = None
    retry_after_ms: int | None = None
    deferral: str | None = None
    due_at_ms: int | None = None
    position: int | None = None
    declaration_version: str | None = None
    payload: bytes | None = None
    # The declared control `key` belongs to (docs/decisions/ledger-keys.md).
    control: str | None = None


@record
class RunEvent:
    """sg.run-events (key: execution_id): the engine reports a run's lifecycle."""

    execution_id: str
    workflow: str
    kind: RunEventKind
    at_ms: int
    run_id: str | None = None
    retries_spent: int | None = None
    error_tag: str | None = None
    error_message: str | None = None
    reason: str | None = None


@record
class EngineCommand:
    """sg.commands (key: execution_id): sluicegate asks the engine to act on a run."""

    command_id: str
    execution_id: str
    workflow: str
    kind: CommandKind
    issued_at_ms: int
    reason: str | None = None


@record
class RunOperation:
    """sg.stage.runs (key: execution_id): an operator's bulk operation on one run, which the
    runs stage carries out and records (docs/decisions/bulk-operations.md)."""

    operation: str
    execution_id: str
    workflow: str
    verb: str  # cancel | redrive | retry
    issued_at_ms: int
    reason: str | None = None

    @property
    def command_id(self) -> str:
        """Unique per operation and run: what the engine command (or the ledger row) is
        named after."""
        return f"bulk-{self.verb}:{self.operation}:{self.execution_id}"


@record
class ControlRow:
    """sg.control (compacted, key: ``pause:<workflow>``): a workflow's pause state."""

    workflow: str
    paused: bool
    at_ms: int
    reason: str | None = None
    by: str | None = None


@record
class KeyLimit:
    """sg.limits (compacted, key: ``<per_key>:<key value>``): the limit of one key of the
    limits a workflow declares with that `per_key`, in the declared limit's own unit
    (slots, or starts per its period). A tombstone returns the key to the declared limit."""

    limit: int
    at_ms: int
    reason: str | None = None
    by: str | None = None


@record
class OverrideRow:
    """sg.control (compacted, key: ``override:<control>:<budget>``): an operator's limit
    in place of the declared one, for every start admitted after it (None: cleared, the
    declaration applies again)."""

    control: str
    budget: str
    at_ms: int
    limit: int | None = None
    period_ms: int | None = None
    declared: int | None = None
    reason: str | None = None
    by: str | None = None


@record
class DeadLetter:
    """sg.deadletter: an input record that could not be handled, and why."""

    source_topic: str
    source_partition: int
    source_offset: int
    reason: str
    stage: str
    at_ms: int
    key: bytes | None = None
    value: bytes | None = None


@record
class RunRow:
    """sg.runs (compacted, key: execution_id): the runs table."""

    execution_id: str
    workflow: str
    status: RunStatus
    payload: bytes
    declaration_version: str
    admitted_at_ms: int
    updated_at_ms: int
    slots: list[Slot]
    keys: dict[str, str]  # control name -> key value
    ended_at_ms: int | None = None
    last_reason: str | None = None
    retries_spent: int | None = None
    run_id: str | None = None


@record
class FailureReportRecord:
    """The payload an onFailure workflow is started with (SPEC 3, onFailure)."""

    workflow: str
    reason: str
    failed_at: int
    payload: bytes | None = None
    error_tag: str | None = None
    error_message: str | None = None
    run_id: str | None = None
    execution_id: str | None = None


@record
class Reply:
    """sg.replies (key: request_id): the decision answered to a waiting caller."""

    request_id: str
    outcome: Outcome
    decided_at_ms: int
    execution_id: str | None = None
    reason: str | None = None
    retry_after_ms: int | None = None
    deferral: str | None = None
    due_at_ms: int | None = None
    position: int | None = None


@record
class PendingStart:
    """sg.stage.<stage> (key: the stage's control key): a start between controls."""

    execution_id: str
    workflow: str
    payload: bytes
    origin: Origin
    kind: AdmittedKind
    declaration_version: str
    hop: int
    request_id: str
    request_ids: list[str]
    requested_at_ms: int
    arrived_at_ms: int
    priority: float
    slots: list[Slot]
    reply_partition: int | None = None
    identity_key: str | None = None
    retry_of: str | None = None
    on_failure: str | None = None


@record
class Release:
    """sg.stage.<stage> (key: the slot's key): a run gives back a hold on that stage."""

    stage: str
    key: str
    execution_id: str
    workflow: str
    kind: ReleaseKind
    at_ms: int
    reason: str | None = None


@record
class IdentityAlias:
    """sg.stage.identity (key: workflow \\x1f idempotency key): a start with that key was
    collapsed by debounce or batch into another run; a repeat of the key now names that run."""

    key: str
    execution_id: str
    request_id: str


@record
class CancelSweep:
    """sg.stage.cancelon and sg.stage.defer (one per partition, key: source): a cancelOn
    event that decoded, fanned out so each partition judges its live runs and queued starts."""

    event: str
    body: bytes
    event_at_ms: int
    source: str
    workflows: list[str]


Record = (
    StartRequest
    | PendingStart
    | Release
    | IdentityAlias
    | CancelSweep
    | AdmittedStart
    | LedgerRecord
    | RunEvent
    | EngineCommand
    | RunOperation
    | ControlRow
    | KeyLimit
    | OverrideRow
    | DeadLetter
    | RunRow
    | FailureReportRecord
    | Reply
    | Slot
)
"""Every type the codec frames on its own (Slot too: stores keep slot lists)."""
