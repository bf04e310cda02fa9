"""A cancelOn sweep reads the parked starts of the workflows it names, and no others: in
every stage where starts wait, with starts of other workflows parked beside them (in the
same pool, behind the same deployment cap), it decodes none of theirs, reads no more of
the store than with none parked, and still discards exactly the starts that match
(docs/decisions/cancelon-sweep-bounds.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from sluicegate.admission import pending
from sluicegate.admission.stages.cancelon import QUEUE_STAGES, SweepIndex
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Singleton,
    Throttle,
    Workflow,
)
from sluicegate.engine.memstore import MemoryStore
from sluicegate.engine.stage import StageContext
from sluicegate.engine.store import StoreTransaction
from sluicegate.schemas import codec
from sluicegate.schemas.records import Outcome, PendingStart
from sluicegate.testing import TestDriver
from sluicegate.topology.topics import STATEFUL_STAGES
from tests.apps.operations import ISSUE_DELETED, JiraIssueDeleted, Tour
from tests.apps.operations_queues import Tours

T = 1_000_000
TARGET = "target"
_on_delete = CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                      match="event.issueKey == payload.issueKey")
_on_delete_item = CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                           match="event.issueKey == payload.items[0].issueKey")
# Declares cancelOn too, for another event: indexed, never read by this event's sweep.
_on_other = CancelOn(event="jira.issue.archived", schema=JiraIssueDeleted,
                     match="event.issueKey == payload.issueKey")
_on_other_item = CancelOn(event="jira.issue.archived", schema=JiraIssueDeleted,
                          match="event.issueKey == payload.items[0].issueKey")


@dataclass(frozen=True)
class Case:
    """One stage where starts wait: the target workflow, the others parked beside it, and
    how a start of either is made to wait there."""

    workflows: list[Workflow]
    settings: Settings
    park: Callable[[TestDriver, str, str, int], Any]

    def driver(self) -> TestDriver:
        return TestDriver(App(self.workflows), self.settings, start_ms=T)


def _start(h: TestDriver, workflow: str, issue: str, n: int) -> None:
    h.start(workflow, {"rowId": f"r{n}", "issueKey": issue})


def _later(h: TestDriver, workflow: str, issue: str, n: int) -> None:
    h.start(workflow, {"rowId": f"r{n}", "issueKey": issue}, at=T + 3_600_000)


def _limited(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, concurrency=Concurrency(limit=50),
                    cancel_on=list(cancel_on))


def _pooled(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, cancel_on=list(cancel_on),
                    throttle=Throttle(limit=1, period="1h", pool="jira"))


def _paced(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, cancel_on=list(cancel_on), throttle=[
        Throttle(limit=1, period="1h", key="rowId"), Throttle(limit=1, period="1h")])


def _debounced(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, cancel_on=list(cancel_on),
                    debounce=Debounce(key="rowId", period="1h"))


def _batched(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tours, cancel_on=list(cancel_on),
                    batch=Batch(item=Tour, key="rowId", max_size=10, timeout="1h"))


def _one_waiting(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, cancel_on=list(cancel_on),
                    singleton=Singleton(key="rowId", mode="queue"))


def _behind_a_run(h: TestDriver, workflow: str, issue: str, n: int) -> None:
    """A run of the row (of an issue no event names), then the start that waits for it."""
    h.start(workflow, {"rowId": f"r{n}", "issueKey": "K0"})
    h.start(workflow, {"rowId": f"r{n}", "issueKey": issue})


def _plain(name: str, *cancel_on: CancelOn) -> Workflow:
    return Workflow(name=name, payload=Tour, cancel_on=list(cancel_on))


ONE = Settings(partitions=1)
CASES = {
    # Every start waits behind the deployment cap, one budget for all workflows; its
    # holder is the first start of `others`.
    "concurrency": Case([_limited(TARGET, _on_delete), _limited("others"),
                         _limited("listens", _on_other)],
                        Settings(partitions=1, deployment_cap=1), _start),
    # One pace shared by a pool: every start after the first waits in the pool's queue.
    "throttle": Case([_pooled(TARGET, _on_delete), _pooled("others"),
                      _pooled("listens", _on_other)], ONE, _start),
    "several throttles": Case([_paced(TARGET, _on_delete), _paced("others"),
                               _paced("listens", _on_other)], ONE, _start),
    "debounce": Case([_debounced(TARGET, _on_delete), _debounced("others"),
                      _debounced("listens", _on_other)], ONE, _start),
    "batch": Case([_batched(TARGET, _on_delete_item), _batched("others"),
                   _batched("listens", _on_other_item)], ONE, _start),
    "delayed": Case([_plain(TARGET, _on_delete), _plain("others"),
                     _plain("listens", _on_other)], ONE, _later),
    "pause": Case([_plain(TARGET, _on_delete), _plain("others"),
                   _plain("listens", _on_other)], ONE, _start),
    # Singleton `queue`: each start waits behind a run of its row.
    "singleton": Case([_one_waiting(TARGET, _on_delete), _one_waiting("others"),
                       _one_waiting("listens", _on_other)], ONE, _behind_a_run),
}


def _park(h: TestDriver, case: Case, unrelated: int) -> list[str]:
    """A start of issue K0 of each workflow (the first takes the turn or slot they share;
    none matches), `unrelated` starts of each other workflow, then the target's: two of
    issue K1 (the event's) and one of K2. The request ids of the K1 starts."""
    if case is CASES["pause"]:
        for wf in case.workflows:
            h.pause(wf.name)
    for n, wf in enumerate(case.workflows):
        case.park(h, wf.name, "K0", 10_000 + n)
    for n in range(unrelated):
        case.park(h, "others", "K1", n)
        case.park(h, "listens", "K1", n)
    before = len(h.ledger)
    for n, issue in enumerate(("K1", "K2", "K1")):
        case.park(h, TARGET, issue, 1_000 + n)
    # (The runs a singleton start waits behind are admitted.)
    mine = [r for r in h.ledger[before:]
            if r.workflow == TARGET and r.outcome is not Outcome.admitted]
    assert [r.outcome for r in mine if r.outcome is not Outcome.queued] == []
    return [r.request_id for r, issue in zip(mine, ("K1", "K2", "K1"), strict=True)
            if issue == "K1"]


@contextmanager
def _watched() -> Iterator[tuple[list[str], list[int]]]:
    """The workflows of the pending starts decoded, and the store rows read, meanwhile."""
    decoded: list[str] = []
    reads = [0]
    decode, get, items = codec.decode, StoreTransaction.get, StoreTransaction.items

    def watched_decode(cls: Any, raw: bytes) -> Any:
        value = decode(cls, raw)
        if isinstance(value, PendingStart):
            decoded.append(value.workflow)
        return value

    def watched_get(self: StoreTransaction, key: bytes) -> bytes | None:
        reads[0] += 1
        return get(self, key)

    def watched_items(self: StoreTransaction, prefix: bytes,
                      start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for row in items(self, prefix, start):
            reads[0] += 1
            yield row

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(codec, "decode", watched_decode)
        patch.setattr(StoreTransaction, "get", watched_get)
        patch.setattr(StoreTransaction, "items", watched_items)
        yield decoded, reads


def _sweep(case: Case, unrelated: int) -> tuple[list[str], int, list[str], TestDriver]:
    """The event's sweep with `unrelated` starts of each other workflow parked: the
    workflows of the starts it decoded, the rows it read, the request ids of the starts it
    cancelled against those it should have."""
    h = case.driver()
    expected = _park(h, case, unrelated)
    h.commit()
    h.advance(1_000)
    before = len(h.ledger)
    with _watched() as (decoded, reads):
        h.event(ISSUE_DELETED, {"issueKey": "K1"})
    cancelled = [r.request_id for r in h.ledger[before:] if r.outcome is Outcome.cancelled]
    assert sorted(cancelled) == sorted(expected), "exactly the matching starts"
    return decoded, reads[0], expected, h


@pytest.mark.parametrize("name", list(CASES))
def test_a_sweep_decodes_only_the_parked_starts_of_the_workflows_it_names(name: str) -> None:
    decoded, _, _, h = _sweep(CASES[name], unrelated=20)
    assert decoded, "it read the target's starts"
    assert set(decoded) == {TARGET}, "no start of another workflow is decoded"
    h.close()


@pytest.mark.parametrize("name", list(CASES))
def test_a_sweep_reads_as_many_rows_with_other_workflows_starts_parked_as_without(
        name: str) -> None:
    _, alone, _, h = _sweep(CASES[name], unrelated=0)
    h.close()
    _, crowded, _, h = _sweep(CASES[name], unrelated=40)
    h.close()
    assert crowded == alone


def _assert_derived_rows_follow(h: TestDriver) -> None:
    for stage in STATEFUL_STAGES:
        node = h.stage(stage)
        if not node.derived:
            continue
        store = h.store(stage)
        kept = {key: value for prefix in node.derived for key, value in store.items(prefix)}
        assert pending.agrees(kept, h.derive(stage)), stage


@pytest.mark.parametrize("name", list(CASES))
def test_the_index_a_sweep_reads_is_what_derive_makes_before_and_after_it(
        name: str) -> None:
    h = CASES[name].driver()
    _park(h, CASES[name], unrelated=3)
    _assert_derived_rows_follow(h)
    h.event(ISSUE_DELETED, {"issueKey": "K1"})
    _assert_derived_rows_follow(h)
    h.advance(7_200_000)  # groups run, delayed starts come due, a turn comes
    _assert_derived_rows_follow(h)
    h.close()


def _no_send(*args: object) -> None:
    raise AssertionError("the index sends nothing")


def test_a_store_kept_across_a_redeploy_is_indexed_again_when_cancelon_moved() -> None:
    """A RocksDB store restored with nothing to replay keeps its derived rows, made under
    the declarations before. The index is made again at the restore when the workflows
    declaring cancelOn changed, and only then."""
    tx = StoreTransaction(MemoryStore())
    store = StageContext("concurrency", 0, None, tx, None, _no_send, lambda: 0, _no_send,
                         tables=SweepIndex.TABLES)
    parked = [(TARGET, b"w1"), ("others", b"w2")]
    before = SweepIndex(App([_limited(TARGET), _limited("others")]))
    after = SweepIndex(App([_limited(TARGET, _on_delete), _limited("others")]))
    before.restored(store, lambda: parked)
    assert list(tx.items(b"")) == [], "nothing declares cancelOn: nothing to index"
    after.restored(store, lambda: parked)
    assert after.parked(store, TARGET) == [b"w1"]
    assert after.parked(store, "others") == []

    def unread() -> list[tuple[str, bytes]]:
        raise AssertionError("the same declarations read no parked start")

    after.restored(store, unread)
    before.restored(store, lambda: parked)
    assert before.parked(store, TARGET) == [], "cancelOn gone: its rows go"


def test_every_stage_a_sweep_reaches_has_a_case_here() -> None:
    covered = {"defer": ("debounce", "batch"), "throttle": ("throttle", "several throttles"),
               "concurrency": ("concurrency",), "pause": ("pause",), "identity": ("delayed",),
               "singleton": ("singleton",)}
    assert set(QUEUE_STAGES) == set(covered)
    assert all(case in CASES for cases in covered.values() for case in cases)
