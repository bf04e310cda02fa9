"""A task: one partition number, with every stage's store for that partition.

Every input topic has the same partition count, and the consumer uses the range
assignor, so a worker owns partition p of every input topic at once; the task for p
holds the state of each key that hashes to p, in every stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sluicegate.engine.stage import Send, Stage, StageContext, Table
from sluicegate.engine.store import PartitionStore, StoreTransaction
from sluicegate.engine.timers import Timers
from sluicegate.topology.topics import Topics


@dataclass(slots=True)
class StageState:
    stage: Stage
    store: PartitionStore | None
    tx: StoreTransaction | None
    timers: Timers | None
    ctx: StageContext
    changelog: str
    tables: tuple[Table, ...]


class Task:
    def __init__(
        self,
        partition: int,
        stages: list[Stage],
        topics: Topics,
        state_dir: Path,
        send: Send,
        clock: Callable[[], int],
        max_record_bytes: int | None = None,
        stores: Mapping[str, PartitionStore] | None = None,
    ) -> None:
        """`stores`: stores already open, by stage name, to take over instead of opening
        them (the test driver's restart keeps its stores open)."""
        self.partition = partition
        self.states: dict[str, StageState] = {}
        for stage in stages:
            store = tx = timers = None
            if stage.stateful:
                store = (stores or {}).get(stage.name) or PartitionStore(
                    state_dir / stage.name / str(partition))
                tx = StoreTransaction(store, max_record_bytes)
                timers = Timers(tx)
            ctx = StageContext(stage.name, partition, topics, tx, timers, send, clock)
            self.states[stage.name] = StageState(stage, store, tx, timers, ctx,
                                                 topics.changelog(stage.name),
                                                 stage.tables(topics))

    def stateful(self) -> Iterator[StageState]:
        return (s for s in self.states.values() if s.store is not None)

    def discard(self) -> None:
        """Drop this cycle's writes: the transaction aborted (the timers notice by themselves)."""
        for state in self.stateful():
            assert state.tx is not None
            state.tx.discard()

    def close(self) -> None:
        for state in self.stateful():
            assert state.store is not None
            state.store.close()
