"""cancelOn discards queued starts in every queue (seed 000: "It also discards queued
starts"), on the real broker with a ManualClock: exact ledger outcomes."""

from __future__ import annotations

import json

import pytest

from sluicegate.client import Client, Handle
from sluicegate.config import Settings
from sluicegate.ops.services.control import write_control
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    ControlRow,
    LedgerRecord,
    Outcome,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.topics import Topics
from tests.apps.operations import ISSUE_DELETED
from tests.apps.operations_queues import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread, clock_at_now
from tests.integration.test_cancelon import _produce, _setup

pytestmark = pytest.mark.broker

MINUTE = 60_000


def _outcomes(ledger: TopicReader[LedgerRecord], handle: Handle) -> list[Outcome]:
    return [r.outcome for r in ledger.records if r.request_id == handle.request_id]


def _has(ledger: TopicReader[LedgerRecord], handles: list[Handle], outcome: Outcome,
         what: str) -> None:
    ledger.until(lambda rs: all(any(r.request_id == h.request_id and r.outcome is outcome
                                    for r in rs) for h in handles), timeout=30, what=what)


def _runs_with(admitted: TopicReader[AdmittedStart], handle: Handle) -> list[AdmittedStart]:
    return [a for a in admitted.records if handle.request_id in a.request_ids]


def _topics(settings: Settings) -> Topics:
    """The topics, the event topic among them (`_setup` waits for their leaders)."""
    return _setup(settings)


def _delete(settings: Settings, topics: Topics, issue: str, at_ms: int) -> None:
    _produce(settings, topics.event(ISSUE_DELETED), issue.encode(),
             json.dumps({"issueKey": issue}).encode(), timestamp=at_ms)


def test_an_event_discards_starts_queued_behind_concurrency_throttle_pause_and_at(
        settings: Settings) -> None:
    topics = _topics(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    write_control(settings, ControlRow(workflow="pausedTour", paused=True,
                                       at_ms=clock.now_ms(), reason="maintenance"))
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        def start(workflow: str, row: str, issue: str, **more: object) -> Handle:
            handle = client.submit(workflow, {"rowId": row, "issueKey": issue},
                                   **more)  # type: ignore[arg-type]
            client.flush()
            return handle

        holder = start("slotTour", "s0", "K0")
        pacer = start("paceTour", "p0", "K0")
        _has(ledger, [holder, pacer], Outcome.admitted, "the slot and the turn taken")
        before = [start("slotTour", "s1", "K1"), start("paceTour", "p1", "K1"),
                  start("pausedTour", "z1", "K1"),
                  start("laterTour", "l1", "K1", at=clock.now_ms() + 10 * MINUTE)]
        other = start("slotTour", "s2", "K2")  # does not match the event
        _has(ledger, [*before, other], Outcome.queued, "every start queued")
        event_at = clock.now_ms()
        clock.advance(1_000)
        after = [start("slotTour", "s3", "K1"), start("pausedTour", "z3", "K1"),
                 start("laterTour", "l3", "K1", at=clock.now_ms() + 10 * MINUTE)]
        _has(ledger, after, Outcome.queued, "the later starts queued")
        _delete(settings, topics, "K1", event_at)
        _has(ledger, before, Outcome.cancelled, "the queued starts discarded")
        # The slot frees: the next start that was not discarded takes it.
        admitted.until(lambda rs: any(holder.request_id in a.request_ids
                                      for a in rs), timeout=30, what="the holder")
        held = _runs_with(admitted, holder)[0].execution_id
        _produce(settings, topics.run_events, held.encode(), codec.encode(RunEvent(
            execution_id=held, workflow="slotTour", kind=RunEventKind.completed,
            at_ms=clock.now_ms())))
        _has(ledger, [other], Outcome.admitted, "K2 admitted into the freed slot")
        clock.advance(10 * MINUTE)  # past every `at` and the throttle turn
        _has(ledger, [after[2]], Outcome.admitted, "the later delayed start admitted")
        ledger.settle(1.5)

    for handle in before:
        assert _outcomes(ledger, handle) == [Outcome.queued, Outcome.cancelled]
        (row,) = [r for r in ledger.records if r.request_id == handle.request_id
                  and r.outcome is Outcome.cancelled]
        assert row.reason is not None and row.reason.startswith("cancelOn:jira.issue.deleted")
        assert not _runs_with(admitted, handle)
    stages = {r.request_id: r.stage for r in ledger.records if r.outcome is Outcome.cancelled}
    assert [stages[h.request_id] for h in before] == [
        "concurrency", "throttle", "pause", "identity"]
    assert _outcomes(ledger, other) == [Outcome.queued, Outcome.admitted]
    # Queued after the event: never discarded.
    assert _outcomes(ledger, after[0]) == [Outcome.queued]
    assert _outcomes(ledger, after[1]) == [Outcome.queued]
    assert _outcomes(ledger, after[2]) == [Outcome.queued, Outcome.admitted]


def test_an_event_discards_a_batch_item_and_the_batch_runs_with_the_others(
        settings: Settings) -> None:
    topics = _topics(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        items = [client.submit("batchTour", {"rowId": "r", "issueKey": issue})
                 for issue in ("K1", "K2", "K1", "K3")]
        lone = client.submit("batchTour", {"rowId": "alone", "issueKey": "K1"})
        client.flush()
        _has(ledger, [*items, lone], Outcome.queued, "every item batched")
        event_at = clock.now_ms()
        clock.advance(1_000)
        _delete(settings, topics, "K1", event_at)
        _has(ledger, [items[0], items[2], lone], Outcome.cancelled, "the K1 items discarded")
        clock.advance(MINUTE)  # the batch's deadline
        (run,) = admitted.until(lambda rs: len(rs) >= 1, timeout=30, what="the batch run")
        # Items reach the batch in any order (their requests are on several partitions):
        # the oldest remaining one carries the run.
        carrier, folded = sorted((items[1], items[3]),
                                 key=lambda h: h.request_id != run.request_ids[0])
        _has(ledger, [carrier], Outcome.admitted, "the batch's decision")
        admitted.settle(1.5)

    assert len(admitted.records) == 1  # the batch of `lone` alone had nothing left to run
    assert sorted(item["issueKey"] for item in json.loads(run.payload)["items"]) == ["K2", "K3"]
    assert sorted(run.request_ids) == sorted([items[1].request_id, items[3].request_id])
    for handle in (items[0], items[2], lone):
        assert _outcomes(ledger, handle) == [Outcome.queued, Outcome.cancelled]
    assert _outcomes(ledger, carrier) == [Outcome.queued, Outcome.admitted]
    assert _outcomes(ledger, folded) == [Outcome.queued, Outcome.collapsed]
    (collapsed,) = [r for r in ledger.records if r.request_id == folded.request_id
                    and r.outcome is Outcome.collapsed]
    assert collapsed.execution_id == run.execution_id
