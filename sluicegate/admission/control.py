"""The control table: pause rows, read in full by every worker (a global table).

`sg.control` is compacted and keyed `pause:<workflow>`; each worker reads all of it from
the beginning outside its consumer group, catches up before it processes anything, and
then polls it from the loop, so a pause applies fleet-wide within a loop iteration or
two of being written (the seeds' "next drain tick, ~1 s").
"""

from __future__ import annotations

import dataclasses
import time

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import ControlRow
from sluicegate.topology.topics import Topics

PAUSE_PREFIX = "pause:"
# Its name as a global table of the engine (`GlobalTable.name`), which the stages that
# read it are told.
CONTROL_TABLE = "control"


def pause_key(workflow: str) -> bytes:
    return f"{PAUSE_PREFIX}{workflow}".encode()


class ControlTable:
    """The engine's global table of pause rows, by workflow (`engine.topology.GlobalTable`)."""

    name = CONTROL_TABLE

    def __init__(self, settings: Settings) -> None:
        self.topic = Topics(settings).control
        self.rows: dict[str, ControlRow] = {}
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

    def poll(self) -> list[ControlRow]:
        """Apply what arrived since the last call; returns the rows that changed."""
        changed: list[ControlRow] = []
        self._read(0.0, changed=changed)
        return changed

    def _read(self, timeout: float, *, stop_at_eof: bool = False,
              changed: list[ControlRow] | None = None) -> bool:
        for msg in self._consumer.consume(500, timeout=timeout):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    if stop_at_eof:
                        return True
                    continue
                continue
            key = (msg.key() or b"").decode(errors="replace")
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

    def paused(self, workflow: str) -> bool:
        row = self.rows.get(workflow)
        return row is not None and row.paused

    def close(self) -> None:
        self._consumer.close()
