"""The floor: the least any Python passthrough does per start with sluicegate's records.

Run inside the raw pipe (`python -m bench.rawpipe --floor`), it does per start only what
an admission cannot do without, with sluicegate's own pieces: decode the StartRequest,
validate its payload, make its execution id, build and encode the admitted record, the
ledger row and the run's row, look the run up in a RocksDB store and write the row
there (at commit, in one WriteBatch). No stages, no contexts, no routing, no runtime.

What the worker costs beyond this is its own orchestration; what this costs beyond the
raw-io pipe is the work itself. So it says how close to the raw pipe any design of the
passthrough in Python can come (docs/benchmarks.md).

`Bound` (`--bound`) is the floor with the three records' bytes made at no cost: the same
decode, validation, execution id and RocksDB lookup and write, and values of the sizes an
admission writes cut from the start's bytes, as the raw-io pipe makes its own. Building
and encoding the records in C from the start's bytes could at best reach it.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.records import admission_sizes
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.store import PartitionStore, StoreTransaction
from sluicegate.schemas import codec
from sluicegate.schemas.payloads import validate
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    LedgerRecord,
    Outcome,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.topics import Topics

# (topic, key, value, partition: -1 for the key's, as librdkafka takes it)
Output = tuple[str, bytes, bytes, int]
_RUN = b"R"


class Floor:
    """One store for the process (the worker keeps one per partition: the same writes)."""

    def __init__(self, app: App, workflow: str, settings: Settings, state_dir: Path) -> None:
        wf = app.get(workflow)
        assert wf is not None
        self.workflow = wf
        self.topics = Topics(settings)
        self.partitions = settings.partitions
        self.store = StoreTransaction(PartitionStore(state_dir))
        self.rows_written = 0

    def admit(self, value: bytes, partition: int) -> list[Output]:
        start = codec.decode(StartRequest, value)
        validate(self.workflow.start_model, start.payload)
        now = time.time_ns() // 1_000_000
        execution_id = execution_id_for(start.workflow, start.request_id, partition,
                                        self.partitions)
        key = execution_id.encode()
        admitted, ledger = self.decision(value, start, execution_id, now)
        out: list[Output] = [
            (self.topics.admitted, key, admitted, -1),
            (self.topics.ledger, start.request_id.encode(), ledger, -1),
        ]
        if self.store.get(_RUN + key) is None:
            row = self.run_row(value, start, execution_id, now)
            self.store.put(_RUN + key, row)
            out.append((self.topics.runs, key, row, partition))
        return out

    def decision(self, value: bytes, start: StartRequest, execution_id: str,
                 now: int) -> tuple[bytes, bytes]:
        """The admitted record and the ledger row, encoded."""
        wf = self.workflow
        admitted = AdmittedStart(
            execution_id=execution_id, workflow=wf.name, payload=start.payload,
            declaration_version=wf.version, origin=start.origin, kind=AdmittedKind.start,
            slots=[], request_ids=[start.request_id], requested_at_ms=start.requested_at_ms,
            admitted_at_ms=now)
        ledger = LedgerRecord(
            request_id=start.request_id, workflow=wf.name, outcome=Outcome.admitted,
            requested_at_ms=start.requested_at_ms, decided_at_ms=now,
            waited_ms=max(0, now - start.requested_at_ms), stage="identity",
            execution_id=execution_id, declaration_version=wf.version)
        return codec.encode(admitted), codec.encode(ledger)

    def run_row(self, value: bytes, start: StartRequest, execution_id: str, now: int) -> bytes:
        """The run's row, encoded."""
        wf = self.workflow
        return codec.encode(RunRow(
            execution_id=execution_id, workflow=wf.name, status=RunStatus.admitted,
            payload=start.payload, declaration_version=wf.version, admitted_at_ms=now,
            updated_at_ms=now, slots=[], keys={}))

    def commit(self) -> None:
        """After the Kafka transaction: the cycle's rows into RocksDB, in one WriteBatch."""
        self.rows_written += len(self.store)
        self.store.commit(None, {"runs": self.rows_written})

    def close(self) -> None:
        self.store.store.close()


class Bound(Floor):
    """The floor less building and encoding its records (see the module's text)."""

    def __init__(self, app: App, workflow: str, settings: Settings, state_dir: Path) -> None:
        super().__init__(app, workflow, settings, state_dir)
        self.sizes = admission_sizes(app, workflow)

    def decision(self, value: bytes, start: StartRequest, execution_id: str,
                 now: int) -> tuple[bytes, bytes]:
        return sized(value, self.sizes["admitted"]), sized(value, self.sizes["ledger"])

    def run_row(self, value: bytes, start: StartRequest, execution_id: str, now: int) -> bytes:
        return sized(value, self.sizes["runs"])


def sized(value: bytes, size: int) -> bytes:
    """`size` bytes made of `value` (repeated, then cut): realistic bytes for lz4."""
    return (value * (size // max(1, len(value)) + 1))[:size]
