"""throttle on the real broker, time driven by a ManualClock: admissions follow GCRA to the
millisecond, the excess waits and is admitted in its turn, a full queue drops, a start
that waits too long expires into onFailure, and a removed workflow's starts fail. Several
throttles on one workflow hold all their paces; redeclared, their waiting starts are
judged again."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import AdmittedStart, LedgerRecord, Outcome
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.rates import app, call_partner_per_user, without_sync_crm
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.unit.test_throttle import reference_gcra

pytestmark = pytest.mark.broker

UPLOAD = {"userId": "u1", "imageId": "i1"}


def _of(rows: list[AdmittedStart], workflow: str) -> list[AdmittedStart]:
    return [row for row in rows if row.workflow == workflow]


def test_sixty_a_minute_with_burst_ten_admits_at_exactly_the_gcra_times(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    waves = [(0, 20), (70_000, 15)]  # a backlog, then a second burst after a quiet minute
    arrivals = [at for at, count in waves for _ in range(count)]
    expected = sorted(t0 + ms for ms in reference_gcra(60, 60_000, 10, arrivals))
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        decided = 0
        for at, count in waves:
            clock.set(t0 + at)
            for _ in range(count):
                client.submit("resizeImage", UPLOAD)
            client.flush()
            decided += count
            ledger.until(lambda rows, n=decided: len(rows) >= n, what=f"{decided} decisions")
            # Step the clock half a second at a time; wait for each step's turns to be taken
            # before the next, so a turn is never taken late.
            while clock.now_ms() < t0 + at + 12_000:
                due = sum(1 for ms in expected if ms <= clock.now_ms())
                admitted.until(lambda rows, n=due: len(rows) >= n, what=f"{due} admitted")
                clock.advance(500)
        admitted.until(lambda rows: len(rows) >= len(arrivals), what="every start admitted")
        ledger.until(lambda rows: len(rows) >= len(arrivals) + 13, what="every decision")
        admitted.settle()
        ledger.settle()

    assert sorted(a.admitted_at_ms for a in admitted.records) == expected
    queued = [row for row in ledger.records if row.outcome is Outcome.queued]
    assert len(queued) == 9 + 4
    assert all(row.deferral == "throttle" and row.key == "u1" for row in queued)
    # Each queued row promised the time its start was then admitted.
    assert sorted(row.due_at_ms for row in queued if row.due_at_ms is not None) == [
        ms for ms in expected if ms not in (t0, t0 + 70_000)]
    assert sorted(row.position for row in queued if row.position is not None) == sorted(
        [*range(9), *range(4)])
    finals = Counter(row.outcome for row in ledger.records if row.outcome is not Outcome.queued)
    assert finals == {Outcome.admitted: len(arrivals)}


def test_over_max_queued_a_start_is_dropped_as_queue_full(settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings, replies=False) as client:
        for _ in range(4):
            client.submit("pushPartner", UPLOAD)
        client.flush()
        ledger.until(lambda rows: len(rows) >= 4, what="four decisions")
        ledger.settle()

    assert Counter(row.outcome for row in ledger.records) == {
        Outcome.admitted: 1, Outcome.queued: 2, Outcome.dropped: 1}
    (drop,) = (row for row in ledger.records if row.outcome is Outcome.dropped)
    assert drop.reason is not None and drop.reason.startswith("queue-full")
    assert drop.retry_after_ms == 3_600_000


def test_a_start_past_its_timeouts_start_expires_and_starts_the_on_failure_workflow(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        handles = [client.submit("syncCrm", UPLOAD) for _ in range(4)]
        client.flush()
        ledger.until(lambda rows: len(rows) >= 4, what="four decisions")
        # One each 5 s: the turns at 5 s and 10 s are taken; the last would go at 15 s,
        # but it may wait 12 s only.
        for n in (2, 3):
            clock.advance(5000)
            admitted.until(lambda rows, n=n: len(_of(rows, "syncCrm")) >= n,
                           what=f"{n} syncCrm runs")
        clock.advance(2000)
        admitted.until(lambda rows: len(_of(rows, "throttleFailed")) >= 1,
                       what="the onFailure run")
        ledger.settle()
        admitted.settle()

    (expired,) = (row for row in ledger.records if row.outcome is Outcome.expired)
    assert expired.request_id in {h.request_id for h in handles}
    assert expired.key == "u1"
    assert expired.reason is not None and "timeouts.start" in expired.reason
    assert expired.decided_at_ms == clock.now_ms()
    assert len(_of(admitted.records, "syncCrm")) == 3
    (failure_run,) = _of(admitted.records, "throttleFailed")
    report = json.loads(failure_run.payload)
    assert report["workflow"] == "syncCrm"
    assert report["execution_id"] is None
    assert "timeouts.start" in report["reason"]
    assert report["payload"] == UPLOAD


def test_starts_queued_for_a_workflow_removed_from_the_declarations_fail_into_on_failure(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        for _ in range(3):
            client.submit("syncCrm", UPLOAD)
        client.flush()
        ledger.until(lambda rows: len(rows) >= 3, what="three decisions")
    # A worker with the new declarations, restoring the throttle's store from its changelog.
    moved = settings.with_(state_dir=settings.state_dir.parent / "state-after")
    with WorkerThread(without_sync_crm, moved, clock=clock):
        ledger.until(lambda rows: sum(r.outcome is Outcome.failed for r in rows) >= 2,
                     what="two failed starts")
        admitted.until(lambda rows: len(_of(rows, "throttleFailed")) >= 2,
                       what="two onFailure runs")
        ledger.settle()

    failed = [row for row in ledger.records if row.outcome is Outcome.failed]
    assert {row.reason for row in failed} == {"workflow removed from the declarations"}
    queued = {row.request_id for row in ledger.records if row.outcome is Outcome.queued}
    assert {row.request_id for row in failed} == queued
    reports = [json.loads(a.payload) for a in _of(admitted.records, "throttleFailed")]
    assert {(r["workflow"], r["reason"]) for r in reports} == {
        ("syncCrm", "workflow removed from the declarations")}


def test_a_throttle_pool_paces_two_workflows_as_one(settings: Settings) -> None:
    """partnerPush and partnerPull share one call a minute per user: three starts of the
    same user across both workflows are admitted a minute apart, in arrival order; another
    user's start is not held back by them."""
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        handles = []
        for workflow in ("partnerPush", "partnerPull", "partnerPush"):
            handles.append(client.submit(workflow, UPLOAD))
            client.flush()
            decided = len(handles)
            ledger.until(lambda rows, n=decided: len(rows) >= n, what="decided")
        other = client.submit("partnerPull", {"userId": "u2", "imageId": "i2"})
        client.flush()
        admitted.until(lambda rows: len(rows) >= 2, what="the first of u1 and u2's")
        for n in (3, 4):
            clock.advance(60_000)
            admitted.until(lambda rows, n=n: len(rows) >= n, what=f"{n} admitted")
        admitted.settle()

    times = {a.request_ids[0]: a.admitted_at_ms for a in admitted.records}
    assert [times[h.request_id] for h in handles] == [t0, t0 + 60_000, t0 + 120_000]
    assert times[other.request_id] == t0
    queued = [r for r in ledger.records if r.outcome is Outcome.queued]
    assert sorted((r.workflow, r.due_at_ms) for r in queued) == [
        ("partnerPull", t0 + 60_000), ("partnerPush", t0 + 120_000)]


def _submit_one_ms_apart(client: Client, ledger: TopicReader[LedgerRecord], clock: ManualClock,
                         workflow: str, users: list[str]) -> list[str]:
    ids: list[str] = []
    for user in users:
        ids.append(client.submit(workflow, {"userId": user, "imageId": "i"}).request_id)
        client.flush()
        decided = len(ids)
        ledger.until(lambda rows, n=decided: len(rows) >= n, what=f"{decided} decided")
        clock.advance(1)
    return ids


def test_several_throttles_admit_a_start_when_every_pace_has_room(settings: Settings) -> None:
    """pacedTwice: one each 10 s per user and two each 10 s in all. u1's second start waits
    for u1's pace, u2's for the global one; at 10 s u1's (the older) goes before u3's."""
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        ids = _submit_one_ms_apart(client, ledger, clock, "pacedTwice", ["u1", "u1", "u2", "u3"])
        admitted.until(lambda rows: len(rows) >= 1, what="u1's first")
        for at, n in ((5_000, 2), (10_000, 3), (15_000, 4)):
            clock.set(t0 + at)
            admitted.until(lambda rows, n=n: len(rows) >= n, what=f"{n} admitted")
        ledger.until(lambda rows: sum(r.outcome is Outcome.admitted for r in rows) >= 4,
                     what="four admitted rows")
        admitted.settle()
    times = {a.request_ids[0]: a.admitted_at_ms - t0 for a in admitted.records}
    assert [times[i] for i in ids] == [0, 10_000, 5_000, 15_000]
    queued = {r.request_id: r for r in ledger.records if r.outcome is Outcome.queued}
    assert (queued[ids[1]].key, queued[ids[1]].due_at_ms) == ("u1", t0 + 10_000)
    assert [r.key for r in ledger.records if r.outcome is Outcome.admitted] == [
        "u1", "u2", "u1", "u3"]


def test_starts_waiting_under_redeclared_throttles_are_judged_again(settings: Settings) -> None:
    """A worker restarted with callPartner's global throttle taken out: the starts that
    waited for it go through the throttle again, under the one left (per user), and are
    admitted by its pace, none lost and none twice."""
    create_topics(settings)
    topics = Topics(settings)
    clock = ManualClock()
    t0 = clock.now_ms()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        ids = _submit_one_ms_apart(client, ledger, clock, "callPartner", ["u1", "u2", "u3"])
        admitted.until(lambda rows: len(rows) >= 1, what="the first")
    moved = settings.with_(state_dir=settings.state_dir.parent / "state-after")
    with WorkerThread(call_partner_per_user, moved, clock=clock):
        # Each user's first start under the one throttle left: all at once.
        admitted.until(lambda rows: len(rows) >= 3, what="the waiting two, judged again")
        admitted.settle()
    assert sorted(a.request_ids[0] for a in admitted.records) == sorted(ids)
    later = [a for a in admitted.records if a.request_ids[0] != ids[0]]
    assert all(a.admitted_at_ms < t0 + 5_000 for a in later)
    assert not [r for r in ledger.records if r.outcome in (Outcome.failed, Outcome.expired)]
