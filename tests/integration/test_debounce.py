"""Debounce on the real broker, time driven by a ManualClock: exact ledger outcomes."""

from __future__ import annotations

import json

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import FailureReport
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.defer import app, without_tour
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

MINUTE = 60_000


def _count(rows: list[LedgerRecord], outcome: Outcome, workflow: str | None = None) -> int:
    return sum(1 for r in rows if r.outcome is outcome and workflow in (None, r.workflow))


def _history(rows: list[LedgerRecord], request_id: str) -> list[Outcome]:
    return [r.outcome for r in rows if r.request_id == request_id]


def _edit(client: Client, ledger: TopicReader, workflow: str, row: str,
          edited_at: int) -> str:
    """One edit, waited for until it is queued, so edits arrive in the order sent."""
    handle = client.submit(workflow, {"rowId": row, "editedAt": edited_at})
    client.flush()
    ledger.until(lambda rows: any(r.request_id == handle.request_id for r in rows),
                 timeout=30, what=f"edit {edited_at} queued")
    return handle.request_id


def test_twenty_edits_within_the_period_make_one_run_with_the_twentieth_payload(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        requests = []
        for i in range(20):  # one every 30 s: 9.5 minutes, inside the 15-minute period
            requests.append(_edit(client, ledger, "tourNarration", "r1", i))
            clock.advance(30_000)
        clock.advance(14 * MINUTE)  # 14.5 minutes after the last edit: still quiet
        admitted.settle(1.0)
        assert admitted.records == []
        clock.advance(30_000)
        admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the run")
        ledger.until(lambda rows: _count(rows, Outcome.admitted) >= 1, what="admitted row")
        admitted.settle(0.5)
        ledger.settle(0.5)

    (run,) = admitted.records
    assert json.loads(run.payload) == {"rowId": "r1", "editedAt": 19}
    assert run.request_ids == requests
    assert run.admitted_at_ms == t0 + 9 * MINUTE + 30_000 + 15 * MINUTE
    rows = ledger.records
    for request in requests[:19]:
        assert _history(rows, request) == [Outcome.queued, Outcome.collapsed]
    assert _history(rows, requests[19]) == [Outcome.queued, Outcome.admitted]
    collapsed = [r for r in rows if r.outcome is Outcome.collapsed]
    assert len(collapsed) == 19
    assert {r.execution_id for r in collapsed} == {run.execution_id}
    assert {r.key for r in collapsed} == {"tour:r1"}
    (final,) = [r for r in rows if r.outcome is Outcome.admitted]
    assert (final.request_id, final.execution_id, final.folded) == (
        requests[19], run.execution_id, 19)
    last_queued = next(r for r in rows if r.request_id == requests[19])
    assert (last_queued.deferral, last_queued.due_at_ms) == ("debounce", run.admitted_at_ms)


def test_with_a_timeout_an_unbroken_stream_still_runs_at_the_cap(settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        requests = []
        for i in range(18):  # every 2 minutes, never 5 quiet ones
            requests.append(_edit(client, ledger, "tourCapped", "r2", i))
            clock.advance(2 * MINUTE)
        admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the capped run")
        clock.advance(3 * MINUTE)  # 5 minutes after the last edit, at 34 minutes
        admitted.until(lambda rows: len(rows) >= 2, timeout=30, what="the next burst's run")
        ledger.until(lambda rows: _count(rows, Outcome.admitted) >= 2, what="admitted rows")

    capped, after = admitted.records
    # The cap (30 minutes after the first edit) runs what has come so far: edits 0..14.
    assert capped.admitted_at_ms == t0 + 30 * MINUTE
    assert capped.request_ids == requests[:15]
    assert json.loads(capped.payload) == {"rowId": "r2", "editedAt": 14}
    # The edits from 30 minutes on are a new burst, run 5 quiet minutes after the last.
    assert after.request_ids == requests[15:]
    assert after.admitted_at_ms == t0 + 34 * MINUTE + 5 * MINUTE
    assert _count(ledger.records, Outcome.collapsed) == 14 + 2


def test_without_a_cap_timeouts_start_expires_a_starving_burst_into_on_failure(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        requests = []
        for i in range(15):  # every 4 minutes: the 5-minute quiet period never comes
            requests.append(_edit(client, ledger, "tourGuarded", "r3", i))
            clock.advance(4 * MINUTE)  # the last advance reaches an hour after the first
        ledger.until(lambda rows: _count(rows, Outcome.expired) >= 1, timeout=30,
                     what="the expiry")
        admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the failure handler")
        admitted.settle(0.5)

    rows = ledger.records
    (expired,) = [r for r in rows if r.outcome is Outcome.expired]
    assert expired.request_id == requests[14]
    assert expired.decided_at_ms == t0 + 60 * MINUTE
    assert expired.reason is not None and "timeouts.start (1h)" in expired.reason
    assert _count(rows, Outcome.collapsed) == 14
    (handler,) = admitted.records
    assert handler.workflow == "reportFailure"
    report = FailureReport.model_validate_json(handler.payload)
    assert (report.workflow, report.payload, report.execution_id) == (
        "tourGuarded", {"rowId": "r3", "editedAt": 14}, None)
    assert report.reason == expired.reason


def test_a_repeat_of_a_collapsed_edit_answers_existing_with_the_run_that_absorbed_it(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        first = _edit(client, ledger, "tourNarration", "r4", 1)
        second = _edit(client, ledger, "tourNarration", "r4", 2)
        clock.advance(15 * MINUTE)
        admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the run")
        # The second edit carried the burst under the first edit's execution id.
        repeat = _edit(client, ledger, "tourNarration", "r4", 2)
        ledger.settle(0.5)

    (run,) = admitted.records
    assert run.request_ids == [first, second]
    (row,) = [r for r in ledger.records if r.request_id == repeat]
    assert (row.outcome, row.execution_id) == (Outcome.existing, run.execution_id)
    assert _count(ledger.records, Outcome.admitted) == 1


def test_starts_pending_for_a_workflow_removed_from_the_declarations_fail_at_restore(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        first = _edit(client, ledger, "tourNarration", "r5", 1)
        second = _edit(client, ledger, "tourNarration", "r5", 2)
    redeployed = settings.with_(state_dir=settings.state_dir.parent / "redeployed")
    with WorkerThread(without_tour, redeployed, clock=clock):
        ledger.until(lambda rows: _count(rows, Outcome.failed) >= 1, timeout=60,
                     what="the failed row")
        ledger.settle(0.5)

    assert _history(ledger.records, first) == [Outcome.queued, Outcome.collapsed]
    assert _history(ledger.records, second) == [Outcome.queued, Outcome.failed]
    (failed,) = [r for r in ledger.records if r.outcome is Outcome.failed]
    assert failed.reason == "workflow removed from the declarations"


def test_a_debounce_handing_over_every_event_runs_with_all_of_them_in_arrival_order(
        settings: Settings) -> None:
    """Seven edits 30 s apart: the fifth fills the window (max_events 5), which runs at
    once with edits 0-4; the last two run 15 quiet minutes after the seventh, with their
    own window. Every edit's payload reaches a run; none is lost or repeated."""
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        requests = []
        for i in range(7):
            requests.append(_edit(client, ledger, "tourEveryEdit", "r1", i))
            if i < 6:
                clock.advance(30_000)
        last_edit = clock.now_ms()
        admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the full window's run")
        clock.advance(15 * MINUTE - 1)
        admitted.settle(1.0)
        assert len(admitted.records) == 1  # the second window is still quiet
        clock.advance(1)
        admitted.until(lambda rows: len(rows) >= 2, timeout=30, what="the second run")
        ledger.until(lambda rows: _count(rows, Outcome.admitted) >= 2, what="admitted rows")
        ledger.settle(0.5)

    first, second = admitted.records
    assert json.loads(first.payload) == {"events": [{"rowId": "r1", "editedAt": i}
                                                    for i in range(5)]}
    assert json.loads(second.payload) == {"events": [{"rowId": "r1", "editedAt": i}
                                                     for i in (5, 6)]}
    assert first.request_ids == requests[:5] and second.request_ids == requests[5:]
    assert second.admitted_at_ms == last_edit + 15 * MINUTE
    rows = ledger.records
    assert _history(rows, requests[0]) == [Outcome.queued, Outcome.admitted]
    for request in requests[1:4]:
        assert _history(rows, request) == [Outcome.queued, Outcome.collapsed]
    # The fifth filled the window, which ran at once: it never waited.
    assert _history(rows, requests[4]) == [Outcome.collapsed]
    assert _history(rows, requests[5]) == [Outcome.queued, Outcome.admitted]
    assert _history(rows, requests[6]) == [Outcome.queued, Outcome.collapsed]
    collapsed = [r for r in rows if r.outcome is Outcome.collapsed]
    assert {r.execution_id for r in collapsed} == {first.execution_id, second.execution_id}
    queued = {r.request_id: r for r in rows if r.outcome is Outcome.queued}
    # Each arrival moves the window's due time to 15 minutes after it.
    assert queued[requests[6]].deferral == "debounce"
    assert queued[requests[6]].due_at_ms == second.admitted_at_ms
    assert queued[requests[5]].due_at_ms == last_edit - 30_000 + 15 * MINUTE


def test_a_direct_start_of_a_debounce_handing_over_every_event_runs_as_a_window_of_one(
        settings: Settings) -> None:
    """Debounce does not apply to `direct` starts (seed 003's matrix): the run still gets
    the workflow's own shape, `{"events": [payload]}`, at once."""
    create_topics(settings)
    admitted = TopicReader(settings, Topics(settings).admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings, replies=False) as client:
        client.submit("tourEveryEdit", {"rowId": "r9", "editedAt": 3}, origin="direct")
        client.flush()
        (run,) = admitted.until(lambda rows: len(rows) >= 1, timeout=30, what="the run")
    assert json.loads(run.payload) == {"events": [{"rowId": "r9", "editedAt": 3}]}
