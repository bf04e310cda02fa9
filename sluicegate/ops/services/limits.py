"""Set, unset and list the per-key limits of the limits table (`sg.limits`): the rows a
limit declared with `per_key` takes a key's limit from (admission/limits.py). Any system
may write them; this is the operator's way. A row is written with an idempotent producer
and the call returns once the broker has it; every worker applies it on its next loop.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Producer

from sluicegate.admission.limits import LimitChange, LimitsTable, limits_key, rows_of
from sluicegate.config import Settings
from sluicegate.declare.validation import MAX_LIMIT, NAME
from sluicegate.ops.services.control import who
from sluicegate.ops.services.names import check_workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import KeyLimit
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.declare import App


def declared_names(app: App) -> dict[str, list[str]]:
    """Each per_key name `app` declares, and the limits that take their values from it
    (`workflow w concurrency`, `workflow w throttle`, ...)."""
    names: dict[str, list[str]] = {}
    for wf in app.workflows.values():
        options: list[tuple[str, Any]] = [
                   *(("concurrency", c) for c in wf.concurrency),
                   *(("throttle", t) for t in wf.throttle),
                   *([("rate_limit", wf.rate_limit)] if wf.rate_limit is not None else [])]
        for what, option in options:
            if option.per_key is not None:
                names.setdefault(option.per_key, []).append(f"workflow {wf.name} {what}")
    return names


def check_name(name: str, app: App | None, app_spec: str | None) -> None:
    """A name fit for a row key; with `app`, one of its limits declares it as per_key
    (UnknownName with a did-you-mean otherwise: a misspelled name sets no limit)."""
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a per_key name: letters, digits, '_', '.' and "
                         "'-', not starting with '.' or '-'")
    if app is not None:
        check_workflow(name, set(declared_names(app)), what="per_key",
                       where=f"declared in {app_spec or 'the declarations'}")


def limit_rows(settings: Settings, name: str | None = None,
               timeout_s: float = 10.0) -> list[LimitChange]:
    """The rows of the limits table (of the limits named `name`), in name and key order."""
    table = LimitsTable(settings)
    try:
        table.catch_up(timeout_s=timeout_s)
        return rows_of(table.rows, name)
    finally:
        table.close()


def _write(settings: Settings, key: bytes, value: bytes | None, timeout_s: float = 30.0) -> None:
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(settings.client_config(**{"enable.idempotence": True}))
    producer.produce(Topics(settings).limits, value, key, on_delivery=delivered)
    if producer.flush(timeout_s) or errors:
        raise RuntimeError(f"could not write the limits row {key.decode(errors='replace')}: "
                           f"{errors or 'not delivered within ' + str(timeout_s) + 's'}")


def set_limit(settings: Settings, name: str, key: str, limit: int, *, reason: str | None,
              by: str | None, app: App | None = None,
              app_spec: str | None = None) -> KeyLimit:
    """Key `key` of the limits declared with per_key `name` gets `limit`."""
    check_name(name, app, app_spec)
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit {limit} is not from 1 to {MAX_LIMIT:,}")
    row = KeyLimit(limit=limit, at_ms=time.time_ns() // 1_000_000, reason=reason, by=who(by))
    _write(settings, limits_key(name, key), codec.encode(row))
    return row


def unset_limit(settings: Settings, name: str, key: str, *, app: App | None = None,
                app_spec: str | None = None) -> LimitChange | None:
    """Key `key` back to the declared limit (a tombstone); the row it had, or None when it
    had none (then nothing is written)."""
    check_name(name, app, app_spec)
    current = next((r for r in limit_rows(settings, name) if r.key == key), None)
    if current is not None:
        _write(settings, limits_key(name, key), None)
    return current
