"""Pause, unpause and forget: the fleet-wide control rows (SPEC.md section 4).

A pause is one row of the compacted `sg.control` topic keyed `pause:<workflow>`; every
worker polls that table each loop, so it applies everywhere within about a second. While
paused, starts collect in the pause stage (never discarded); unpause drains them in
priority order. Unpause writes a row saying `paused=false` rather than a tombstone: the
workers drain on seeing the change, and the row keeps who lifted the pause and when. The
one exception is a workflow the declarations no longer have: its row is deleted (the
workers failed what it had collected when they restored without it); `forget` deletes
such a row whether or not it pauses (docs/decisions/pause-rows.md,
docs/decisions/forget-control-rows.md). Every workflow named is checked first
(`sluicegate.ops.services.names`): declared in the app given, or without one, seen by the
cluster.
"""

from __future__ import annotations

import getpass
import time
from enum import Enum
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, Producer

from sluicegate.admission.control import ControlTable, pause_key
from sluicegate.config import Settings
from sluicegate.ops.services.names import check_known, check_workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import ControlRow
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.declare import App


class StillDeclared(ValueError):
    """`forget` of a workflow the declarations still have; the message says to unpause."""


class Unpaused(Enum):
    """What an unpause did."""

    not_paused = "nothing collected, nothing to drain: no row written"
    unpaused = "a row saying paused=false: the collected starts drain"
    deleted = "the pause row of a workflow the declarations do not have, deleted"


def control_rows(settings: Settings, timeout_s: float = 10.0) -> dict[str, ControlRow]:
    """Every workflow's current row on the control table."""
    table = ControlTable(settings)
    try:
        table.catch_up(timeout_s=timeout_s)
        return table.rows
    finally:
        table.close()


def write_control(settings: Settings, row: ControlRow, timeout_s: float = 30.0, *,
                  delete: bool = False) -> None:
    """Put one row on the control table (or, with `delete`, a tombstone for its workflow)
    and wait until the broker has it."""
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    producer.produce(Topics(settings).control, None if delete else codec.encode(row),
                     pause_key(row.workflow), on_delivery=delivered)
    if producer.flush(timeout_s) or errors:
        raise RuntimeError(f"could not write the control row for {row.workflow}: "
                           f"{errors or 'not delivered within ' + str(timeout_s) + 's'}")


def who(by: str | None) -> str:
    """Who acts: `by` when given, else the login name."""
    if by:
        return by
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _now_ms() -> int:
    return int(time.time() * 1000)


def pause(settings: Settings, name: str, reason: str, by: str | None, *,
          app: App | None = None, app_spec: str | None = None) -> ControlRow:
    """Pause `name` fleet-wide: its starts collect (none is discarded) until unpause."""
    check_known(settings, name, app, app_spec)
    row = ControlRow(workflow=name, paused=True, at_ms=_now_ms(), reason=reason, by=who(by))
    write_control(settings, row)
    return row


def unpause(settings: Settings, name: str, reason: str | None, by: str | None, *,
            app: App | None = None, app_spec: str | None = None) -> Unpaused:
    """Unpause `name`: the starts that collected are admitted in priority order. With an
    `app` that does not declare `name`, a workflow removed while paused: its pause row is
    deleted (what it collected failed when the workers restored without it); when it has
    no such row, `name` is a typo of a declared one (UnknownName)."""
    row = ControlRow(workflow=name, paused=False, at_ms=_now_ms(), reason=reason, by=who(by))
    if app is not None and app.get(name) is None:
        current = control_rows(settings).get(name)
        if current is None or not current.paused:
            check_workflow(name, set(app.workflows),
                           where=f"declared in {app_spec or ''}, and it is not paused")
        write_control(settings, row, delete=True)
        return Unpaused.deleted
    check_known(settings, name, app, app_spec)
    current = control_rows(settings).get(name)
    if current is None or not current.paused:
        return Unpaused.not_paused
    write_control(settings, row)
    return Unpaused.unpaused


def forget(settings: Settings, name: str, *, app: App, app_spec: str) -> ControlRow:
    """Delete the control row of a workflow `app` does not declare (a misspelled pause, a
    workflow removed since); the row deleted. StillDeclared when `app` declares it."""
    if app.get(name) is not None:
        raise StillDeclared(f"{name} is declared in {app_spec}: `sluicegate workflows "
                            f"unpause {name}` lifts its pause; forget is for workflows that "
                            "no longer exist")
    rows = control_rows(settings)
    check_workflow(name, set(rows), what="control row for", where="on the control table")
    write_control(settings, ControlRow(workflow=name, paused=False, at_ms=_now_ms()),
                  delete=True)
    return rows[name]


def set_paused(settings: Settings, name: str, paused: bool, reason: str | None,
               by: str) -> ControlRow:
    """Write a pause or unpause row as given, with no check (the console checks the name
    and what it may do first)."""
    row = ControlRow(workflow=name, paused=paused, at_ms=time.time_ns() // 1_000_000,
                     reason=reason, by=by)
    write_control(settings, row)
    return row
