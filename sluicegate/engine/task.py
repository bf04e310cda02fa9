"""A task: one partition number, with every stage's store for that partition.

Every input topic has the same partition count, and the consumer uses the range
assignor, so a worker owns partition p of every input topic at once; the task for p
holds the state of each key that hashes to p, in every stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.stage import Send, Stage, StageContext
from sluicegate.engine.store import Store, StoreTransaction, StoreUnwritable, open_store
from sluicegate.engine.timers import Timers
from sluicegate.engine.topology import Node, Table, Topology


@dataclass(slots=True)
class StageState:
    """One stage's part of a task: its context, and for a stage with a store, the store,
    the cycle's transaction over it and its timers."""

    node: Node
    ctx: StageContext[Any]
    store: Store | None = None
    tx: StoreTransaction | None = None
    timers: Timers | None = None

    @property
    def stage(self) -> Stage:
        return self.node.stage

    @property
    def changelog(self) -> str:
        changelog = self.node.changelog
        assert changelog is not None, f"stage {self.node.name} has no store"
        return changelog

    @property
    def tables(self) -> tuple[Table, ...]:
        return self.node.tables

    def logged(self, derived_too: bool = False) -> dict[str, list[tuple[bytes, bytes | None]]]:
        """The cycle's store writes by the log each goes to, in the order written: the
        changelog, or the topic of a table the stage publishes (its key without the
        table's prefix). A derived row goes to none (`Stage.derived`), unless
        `derived_too` (a roll from a release that logs them: SLUICEGATE_LOG_DERIVED)."""
        assert self.tx is not None
        logs: dict[str, list[tuple[bytes, bytes | None]]] = {}
        tables = self.node.tables
        derived = () if derived_too else self.node.stage.derived
        changelog = self.changelog
        for key, value in self.tx.changes.items():
            if derived and key.startswith(derived):
                continue
            topic, log_key = changelog, key
            for table in tables:
                if key.startswith(table.prefix):
                    topic, log_key = table.topic, key[len(table.prefix):]
                    break
            logs.setdefault(topic, []).append((log_key, value))
        if self.tx.logged:
            # The rows of the tables a memory store holds in structures of their own.
            logs.setdefault(changelog, []).extend(self.tx.logged.items())
        return logs


class Task:
    def __init__(
        self,
        partition: int,
        topology: Topology,
        state_dir: Path,
        send: Send,
        clock: Callable[[], int],
        max_record_bytes: int | None = None,
        stores: Mapping[str, Store] | None = None,
        monotonic: Callable[[], int] | None = None,
        backend: str = "memory",
        log_derived: bool = False,
    ) -> None:
        """`clock`: the wall clock's now in epoch ms; `monotonic`: the worker's own time
        (engine/clock.py), the wall clock when not given. `stores`: stores already open, by
        stage name, to take over instead of opening them (the test driver's restart keeps
        its stores open); `backend`: where the stores keep their rows, `memory` or
        `rocksdb` (under `state_dir`). `log_derived`: the task keeps its stores as a
        release before derived rows did (SLUICEGATE_LOG_DERIVED, for a rolling upgrade):
        every row logged, every timer among the logged ones, nothing made again at
        restore, so a worker of that release can take its partitions over."""
        self.partition = partition
        self.now_ms = clock
        self.log_derived = log_derived
        self.states: dict[str, StageState] = {}
        beside = frozenset(node.name for node in topology.nodes)
        for node in topology.nodes:
            store = tx = timers = None
            if node.changelog is not None:
                store = (stores or {}).get(node.name) or open_store(
                    backend, state_dir / node.name / str(partition), clock)
                held = None
                if isinstance(store, MemoryStore) and not log_derived:
                    # Its held tables and derived timers kept as values (engine.held).
                    for spec in node.stage.tables:
                        if spec.held or spec.values is not None:
                            store.held.table(spec)
                    if node.stage.derived_timers:
                        held = store.held.held_timers()
                tx = StoreTransaction(store, max_record_bytes)
                timers = Timers(tx, () if log_derived else node.stage.derived_timers, held)
            ctx = StageContext(node.name, partition, topology.topics, tx, timers, send, clock,
                               topology.dead_letter, monotonic, node.stage.tables,
                               log_derived, beside)
            self.states[node.name] = StageState(node, ctx, store, tx, timers)

    def stateful(self) -> Iterator[StageState]:
        return (s for s in self.states.values() if s.store is not None)

    def rebuild_derived(self, stores: Iterable[Store] | None = None) -> int:
        """Make every derived row of the stores again from their other rows (all of this
        task's, or `stores` and those whose stages derive rows from one of them:
        `Stage.derives_from`), dropping what they held under the derived prefixes (rows
        of an earlier release's changelog, or rows the replay left behind): their logs do
        not carry them. Returns the rows written."""
        written = 0
        if self.log_derived:
            # Its logs carry the derived rows too: restored, they are as they were.
            return written
        chosen = None if stores is None else {id(store) for store in stores}
        for state in self.stateful():
            stage, store = state.stage, state.store
            assert store is not None
            if not stage.derived:
                continue
            beside = self.beside(stage)
            if chosen is not None and id(store) not in chosen and not any(
                    id(other) in chosen for other in beside.values()):
                continue
            # The rows made, then a delete for every row held that they do not replace
            # (not a dict of the deletes updated with them: a copy of a million rows).
            rows = cast(dict[bytes, bytes | None], stage.derive(store, beside))
            for prefix in stage.derived:
                for key, _ in store.items(prefix):
                    rows.setdefault(key, None)
            if rows:
                store.write(rows, None)
                written += len(rows)
        return written

    def beside(self, stage: Stage) -> dict[str, Store]:
        """The stores of the stages `stage` derives rows from (`Stage.derives_from`) that
        this task runs."""
        found = {}
        for name in stage.derives_from:
            other = self.states.get(name)
            if other is not None and other.store is not None:
                found[name] = other.store
        return found

    def discard(self) -> None:
        """Drop this cycle's writes: the transaction aborted (the timers notice by themselves)."""
        for state in self.stateful():
            assert state.tx is not None
            state.tx.discard()

    def close(self, synced: bool = False) -> None:
        """`synced`: the task processed up to its last commit, so its stores are in step
        with their logs (not one still restoring)."""
        unwritable: StoreUnwritable | None = None
        for state in self.stateful():
            assert state.store is not None
            try:
                state.store.close(synced)
            except StoreUnwritable as exc:
                unwritable = unwritable or exc
        if unwritable is not None:
            raise unwritable
