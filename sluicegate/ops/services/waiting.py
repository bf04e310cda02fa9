"""Why is this start waiting? Each start whose latest ledger row is `queued`, with the
control holding it, in words (seed 000, "Seeing what happened"; issue 17's console):

- debounce on key K until T (every start with the key moves T on, up to the timeout);
- batch n/size on key K until T;
- throttle on key K: its slot is at T;
- concurrency on key K: position N of M behind a limit of L; about 4 min: 37 ahead, 9
  runs a minute over the last 10 min (`estimate.py`: the pace its line has been moving at;
  before another limit, the wait for this one's slot, and the limit after it named);
- singleton on key K: waits for the run holding the key to end;
- paused since T (reason);
- delayed until T (`at`).

The facts are the ledger row's (`deferral`, `due_at`, `position`, `key`, `control`), the
ones `ledger ask why` shows; N and M are counted among the starts still waiting on the
same workflow, key and control, oldest first (exact for the FIFO default; under a
priority or fairness the queue may serve them in another order), L comes from the
declarations when the caller has them (the limit in force: an override's, else the
limits table's row for the key, said so), and a pause's time and reason from its row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluicegate.admission.limits import LimitChange
from sluicegate.admission.overrides import effective, in_force
from sluicegate.admission.overrides import target as override_name
from sluicegate.declare import App
from sluicegate.ops.services.estimate import Estimate, Line, no_estimate, read_line
from sluicegate.ops.services.formatting import clock as _clock
from sluicegate.ops.services.formatting import iso
from sluicegate.ops.services.ledger import LATEST, LedgerDb
from sluicegate.schemas.records import ControlRow, OverrideRow
from sluicegate.topology.route import DEPLOYMENT_CAP, control_name, route_for

WAITING_SQL = f"""
WITH {LATEST}
SELECT request_id, workflow, key, control, deferral, requested_at, decided_at, due_at,
       position, waited_ms,
       row_number() OVER (PARTITION BY workflow, key, control
                          ORDER BY decided_at, _partition, _offset) AS rank,
       count(*) OVER (PARTITION BY workflow, key, control) AS waiting
FROM latest
WHERE outcome = 'queued' AND NOT starts_with(request_id, 'run:')
  AND ($workflow IS NULL OR workflow = $workflow)
  AND ($key IS NULL OR key IS NOT DISTINCT FROM $key)
QUALIFY $request_id IS NULL OR request_id = $request_id
ORDER BY workflow, key NULLS FIRST, control, rank
LIMIT $limit
"""

_INDEX = re.compile(r"^concurrency\[(\d+)\]")


@dataclass(frozen=True, slots=True)
class Waiting:
    request_id: str
    workflow: str
    key: str | None
    control: str | None
    deferral: str | None
    requested_at_ms: int
    due_at_ms: int | None
    position: int | None  # as the ledger row says (the queue's, when it was parked)
    rank: int  # N: among the starts still waiting on this workflow, key and control
    waiting: int  # M
    limit: int | None  # L, a concurrency limit or the batch size, when known
    why: str
    # Behind a concurrency limit: how long it should still wait, from its line's pace
    # (None: not behind one, or nobody left the line lately).
    estimate_ms: int | None = None
    # With an estimate: the limits after this one, whose waits it does not count (empty:
    # none, it runs once it has this slot; None: not known).
    estimate_then: tuple[str, ...] | None = ()

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "workflow": self.workflow, "key": self.key,
                "control": self.control, "deferral": self.deferral,
                "requested_at": iso(self.requested_at_ms), "due_at": iso(self.due_at_ms),
                "position": self.position, "rank": self.rank, "waiting": self.waiting,
                "limit": self.limit, "why": self.why, "estimate_ms": self.estimate_ms,
                "estimate_then": None if self.estimate_then is None
                else list(self.estimate_then)}


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.replace(tzinfo=UTC).timestamp() * 1000)
    return int(value)


def limit_of(app: App | None, workflow: str, control: str | None, deferral: str | None,
             deployment_cap: int = 0, overrides: Mapping[str, OverrideRow] | None = None,
             key: str | None = None,
             key_limits: Mapping[tuple[str, str], LimitChange] | None = None,
             ) -> tuple[int, str] | None:
    """The figure a start waits behind: a concurrency limit (the one `control` names: an
    operator's override of it while one is in force, else the limits table's row for `key`
    when the limit declares per_key, else the declared one), the deployment-wide cap, or a
    batch's size; and where a concurrency limit comes from when it is not the declared one
    (` (an override; declared 4)`, ` (the key's, from the limits table; declared 2)`).
    None when unknown."""
    if deferral == "concurrency" and control == DEPLOYMENT_CAP:
        return (deployment_cap, "") if deployment_cap else None
    wf = app.get(workflow) if app is not None else None
    if wf is None:
        return None
    if deferral == "batch" and wf.batch is not None:
        return wf.batch.max_size, ""
    if deferral == "concurrency" and wf.concurrency:
        match = _INDEX.match(control or "")
        index = int(match.group(1)) if match else 0
        if index < len(wf.concurrency):
            option = wf.concurrency[index]
            budget = next((hop.budget for hop in route_for(wf).hops
                           if hop.stage == "concurrency" and hop.index == index), "")
            row = in_force(overrides or {}, "concurrency", budget)
            if row is not None:
                return effective(option.limit, row), f" (an override; declared {option.limit})"
            table = (key_limits or {}).get((option.per_key, key or "")) if option.per_key else None
            if table is not None and table.limit is not None:
                return table.limit, (f" (the key's, from the limits table; declared "
                                     f"{option.limit})")
            return option.limit, ""
    return None


def _repaced(app: App | None, workflow: str, control: str | None, key: str | None,
             queued_ms: int, overrides: Mapping[str, OverrideRow] | None,
             key_limits: Mapping[tuple[str, str], LimitChange] | None, now_ms: int) -> str:
    """Why a throttle's slot time, worked out when the start queued, may not hold: the
    pace changed after it, by an operator's override (set or cleared) of the throttle, or
    by the key's row of the limits table. The stage paces the turns after the one due at
    the new rate, but does not rewrite the queued rows (docs/decisions/limit-overrides.md)."""
    budget = (control.split(" ", 1)[1] if control and control.startswith("throttle ")
              else workflow)
    changes = []
    row = (overrides or {}).get(override_name("throttle", budget))
    if row is not None and row.at_ms > queued_ms:
        changes.append((row.at_ms, "an operator's override" if row.limit is not None
                        else "an operator's override cleared"))
    wf = app.get(workflow) if app is not None else None
    per_key = wf.throttle[0].per_key if wf is not None and len(wf.throttle) == 1 else None
    table = (key_limits or {}).get((per_key, key or "")) if per_key is not None else None
    if table is not None and table.at_ms > queued_ms:
        changes.append((table.at_ms, "the key's row of the limits table"))
    if not changes:
        return ""
    at, what = max(changes)
    return f"the pace changed at {_clock(at, now_ms)} ({what})"


def limits_after(app: App | None, workflow: str, control: str | None, deployment_cap: int,
                 line: Line) -> tuple[str, ...] | None:
    """The limits a start waiting at `control` still meets once it has its slot there, as
    the ledger names them: from the route the declarations give (`app`), else from where
    the starts that left the line went (None: not known)."""
    wf = app.get(workflow) if app is not None else None
    if wf is None:
        return line.then()
    route = route_for(wf, deployment_cap)
    names = [control_name(wf, hop) for hop in route.hops]
    if control not in names:
        return line.then()
    return tuple(names[names.index(control) + 1:])


def why(deferral: str | None, key: str | None, due_at_ms: int | None, rank: int,
        waiting: int, limit: int | None, pause: ControlRow | None, now_ms: int,
        whence: str = "") -> str:
    """The sentence for one waiting start, its instants as `_clock` gives them; `whence`:
    where the limit comes from, when not from the declaration (a throttle: that its pace
    changed after its slot time was worked out)."""
    on_key = f" on key {key!r}" if key else ""
    if deferral == "debounce":
        return (f"debounce{on_key} until {_clock(due_at_ms, now_ms)} (each new start with this key "
                "moves it on, up to the timeout)")
    if deferral == "batch":
        size = f"/{limit}" if limit is not None else ""
        return f"batch {waiting}{size}{on_key} until {_clock(due_at_ms, now_ms)}"
    if deferral == "throttle":
        if due_at_ms is None:
            # Ranked by its priority behind more starts than were counted: no slot time
            # was worked out (docs/decisions/queue-position-bound.md).
            return f"throttle{on_key}: its slot comes after those of many starts ahead of it"
        if whence:
            # Worked out under the pace it queued with, which has changed since.
            return (f"throttle{on_key}: its slot was at {_clock(due_at_ms, now_ms)} when it "
                    f"queued; {whence}, so it may come sooner or later")
        return f"throttle{on_key}: its slot is at {_clock(due_at_ms, now_ms)}"
    if deferral == "concurrency":
        behind = f" behind a limit of {limit}{whence}" if limit is not None else ""
        return f"concurrency{on_key}: position {rank} of {waiting}{behind}"
    if deferral == "singleton":
        return (f"singleton{on_key}: waits for the run holding the key to end (a later start "
                "would replace it)")
    if deferral == "pause":
        if pause is None or not pause.paused:
            return "paused; the pause was lifted, its starts are draining"
        reason = f" ({pause.reason})" if pause.reason else ""
        return f"paused since {_clock(pause.at_ms, now_ms)}{reason}"
    if deferral == "delayed":
        return f"delayed until {_clock(due_at_ms, now_ms)} (its `at`)"
    return f"queued by {deferral or 'an unknown control'}{on_key}"


def waiting_starts(db: LedgerDb, control_rows: dict[str, ControlRow], *,
                   app: App | None = None, deployment_cap: int = 0,
                   workflow: str | None = None, key: str | None = None,
                   limit: int = 500, now_ms: int | None = None,
                   request_id: str | None = None,
                   overrides: Mapping[str, OverrideRow] | None = None,
                   key_limits: Mapping[tuple[str, str], LimitChange] | None = None,
                   ) -> list[Waiting]:
    """The starts waiting now (at most `limit`; only `request_id`'s when given, ranked
    among all), by workflow, key and control, oldest first; `now_ms` (default: the
    clock's) is what "today" is in their sentences; `overrides`, the control table's, and
    `key_limits`, the limits table's rows, give the concurrency limits in force."""
    if now_ms is None:
        now_ms = int(datetime.now(UTC).timestamp() * 1000)
    result = db.query(WAITING_SQL, {"workflow": workflow, "key": key, "limit": limit,
                                    "request_id": request_id})
    out = []
    lines: dict[tuple[str, str | None, str | None], Line] = {}
    for (request_id, wf, k, control, deferral, requested_at, decided, due_at, position,
         _waited, rank, count) in result.rows:
        found = limit_of(app, wf, control, deferral, deployment_cap, overrides, k, key_limits)
        cap, whence = found if found is not None else (None, "")
        due = _ms(due_at)
        if deferral == "throttle" and due is not None:
            whence = _repaced(app, wf, control, k, _ms(decided) or 0, overrides, key_limits,
                              now_ms)
        estimate = None
        said = ""
        if deferral == "concurrency":
            at = (wf, k, control)
            if at not in lines:
                lines[at] = read_line(db, wf, k, control, now_ms)
            line = lines[at]
            if line.pace is not None:
                estimate = Estimate(int(rank) - 1, line.pace,
                                    limits_after(app, wf, control, deployment_cap, line))
            said = "; " + (estimate.text() if estimate is not None else no_estimate())
        out.append(Waiting(
            request_id=request_id, workflow=wf, key=k, control=control, deferral=deferral,
            requested_at_ms=_ms(requested_at) or 0, due_at_ms=due,
            position=None if position is None else int(position), rank=int(rank),
            waiting=int(count), limit=cap,
            why=why(deferral, k, due, int(rank), int(count), cap, control_rows.get(wf),
                    now_ms, whence) + said
            + _paused_after(deferral, control_rows.get(wf)),
            estimate_ms=estimate.wait_ms if estimate is not None else None,
            estimate_then=estimate.then if estimate is not None else ()))
    return out


def _paused_after(deferral: str | None, pause: ControlRow | None) -> str:
    """A start held by another control of a paused workflow waits for the unpause next."""
    if deferral == "pause" or pause is None or not pause.paused:
        return ""
    return "; then the pause (the workflow is paused)"
