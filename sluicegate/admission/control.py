"""The control table: pause rows and limit overrides, read in full by every worker (a
global table).

`sg.control` is compacted and keyed `pause:<workflow>` (a `ControlRow`) or
`override:<control>:<budget>` (an `OverrideRow`, admission/overrides.py); each worker
reads all of it from the beginning outside its consumer group, catches up before it
processes anything, and then polls it from the loop, so a pause or an override applies
fleet-wide within a loop iteration or two of being written (the seeds' "next drain tick,
~1 s").
"""

from __future__ import annotations

import dataclasses
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.admission.overrides import OVERRIDE_PREFIX, in_force
from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import ControlRow, OverrideRow
from sluicegate.topology.topics import Topics

PAUSE_PREFIX = "pause:"
# Its name as a global table of the engine (`GlobalTable.name`), which the stages that
# read it are told.
CONTROL_TABLE = "control"


def pause_key(workflow: str) -> bytes:
    return f"{PAUSE_PREFIX}{workflow}".encode()


class ControlTable:
    """The engine's global table (`engine.topology.GlobalTable`): pause rows by workflow
    (`rows`), and limit overrides by target (`overrides`). At restore the engine tells
    the pause rows; the concurrency stage reads the overrides itself."""

    name = CONTROL_TABLE

    def __init__(self, settings: Settings) -> None:
        self.topic = Topics(settings).control
        self.rows: dict[str, ControlRow] = {}
        self.overrides: dict[str, OverrideRow] = {}
        self._consumer = Consumer(settings.client_config(**{
            "group.id": f"{settings.namespace}control-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
        }))
        self._consumer.assign([TopicPartition(self.topic, 0, 0)])

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Read to the end of the table (at start, before any start is judged)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._read(0.2, stop_at_eof=True):
                return
        raise TimeoutError(f"could not read {self.topic} to its end within {timeout_s}s")

    def poll(self) -> list[ControlRow | OverrideRow]:
        """Apply what arrived since the last call; returns the rows that changed."""
        changed: list[ControlRow | OverrideRow] = []
        self._read(0.0, changed=changed)
        return changed

    def _read(self, timeout: float, *, stop_at_eof: bool = False,
              changed: list[ControlRow | OverrideRow] | None = None) -> bool:
        for msg in self._consumer.consume(500, timeout=timeout):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if stop_at_eof:
                        return True
                    continue
                continue
            key = (msg.key() or b"").decode(errors="replace")
            if key.startswith(OVERRIDE_PREFIX):
                self._read_override(key[len(OVERRIDE_PREFIX):], msg.value(), changed)
                continue
            if not key.startswith(PAUSE_PREFIX):
                continue
            workflow = key[len(PAUSE_PREFIX):]
            if msg.value() is None:
                # A deleted row means "not paused": report it as an unpause.
                gone = self.rows.pop(workflow, None)
                if changed is not None and gone is not None and gone.paused:
                    changed.append(dataclasses.replace(gone, paused=False))
                continue
            try:
                row = codec.decode(ControlRow, msg.value())
            except codec.DecodeError:
                continue
            previous = self.rows.get(workflow)
            self.rows[workflow] = row
            if changed is not None and (previous is None or previous.paused != row.paused):
                changed.append(row)
        return False

    def _read_override(self, name: str, value: bytes | None,
                       changed: list[ControlRow | OverrideRow] | None) -> None:
        if value is None:
            # A deleted override means the declaration applies: told as a cleared one.
            gone = self.overrides.pop(name, None)
            if changed is not None and gone is not None and gone.limit is not None:
                changed.append(dataclasses.replace(gone, limit=None, period_ms=None))
            return
        try:
            row = codec.decode(OverrideRow, value)
        except codec.DecodeError:
            return
        self.overrides[name] = row
        if changed is not None:
            changed.append(row)

    def override(self, control: str, budget: str) -> OverrideRow | None:
        """The override in force on `budget`'s `control` limit, if any."""
        return in_force(self.overrides, control, budget)

    def paused(self, workflow: str) -> bool:
        row = self.rows.get(workflow)
        return row is not None and row.paused

    def close(self) -> None:
        self._consumer.close()
