"""The singleton stage on the real broker: skip and cancel, including cancel behind a
debounce, and a run that ends freeing its key."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client, Handle, SingletonHeld
from sluicegate.config import Settings
from sluicegate.declare import App, load_app
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    EngineCommand,
    LedgerRecord,
    Outcome,
    RunEvent,
    RunEventKind,
    RunRow,
    RunStatus,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.singleton import SITE_DELETED
from tests.integration.kafka_helpers import (
    TopicReader,
    WorkerProcess,
    WorkerThread,
    clock_at_now,
)

pytestmark = pytest.mark.broker

DEBOUNCE_MS = 10_000  # tests.apps.singleton's settledOnly


@pytest.fixture
def app() -> App:
    return load_app("tests.apps.singleton")


def _report(settings: Settings, execution_id: str, workflow: str, kind: RunEventKind) -> None:
    """The engine's side: a lifecycle report on sg.run-events."""
    # The partitioner every sluicegate client uses, so the report meets its run's row.
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    event = RunEvent(execution_id=execution_id, workflow=workflow, kind=kind,
                     at_ms=int(time.time() * 1000))
    producer.produce(Topics(settings).run_events, codec.encode(event), execution_id.encode())
    assert producer.flush(10) == 0


def _status(runs: TopicReader, execution_id: str, status: RunStatus) -> None:
    runs.until(lambda rows: any(r.execution_id == execution_id and r.status is status
                                for r in rows), timeout=30, what=f"{execution_id} {status}")


def _outcomes(settings: Settings, count: int) -> dict[str, list[LedgerRecord]]:
    """Every ledger row, by request, once `count` rows are in and nothing more comes."""
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    ledger.until(lambda rows: len(rows) >= count, timeout=30, what=f"{count} ledger rows")
    ledger.settle()
    ledger.close()
    by_request: dict[str, list[LedgerRecord]] = {}
    for row in sorted(ledger.records, key=lambda r: r.decided_at_ms):
        by_request.setdefault(row.request_id, []).append(row)
    return by_request


def test_skip_a_newcomer_stands_down_naming_the_incumbent_until_the_incumbent_ends(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    runs = TopicReader(settings, Topics(settings).runs, RunRow)
    site = {"siteId": "s1"}
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings) as client:
        first = client.start("rebuildSearch", site, wait_decision=True, timeout=60)
        assert first.status == "admitted" and first.execution_id is not None
        with pytest.raises(SingletonHeld) as held:
            client.start("rebuildSearch", site, wait_decision=True, timeout=30)
        other_site = client.start("rebuildSearch", {"siteId": "s2"}, wait_decision=True)
        # A child started by invoke is part of its parent's work: singleton does not judge it.
        invoked = client.start("rebuildSearch", site, origin="invoke", wait_decision=True)

        _report(settings, first.execution_id, "rebuildSearch", RunEventKind.started)
        _report(settings, first.execution_id, "rebuildSearch", RunEventKind.suspended)
        _status(runs, first.execution_id, RunStatus.suspended)
        with pytest.raises(SingletonHeld):
            client.start("rebuildSearch", site, wait_decision=True, timeout=30)

        _report(settings, first.execution_id, "rebuildSearch", RunEventKind.completed)
        _status(runs, first.execution_id, RunStatus.completed)
        after = client.start("rebuildSearch", site, wait_decision=True, timeout=30)

    assert held.value.execution_id == first.execution_id
    assert held.value.handle.status == "skipped"
    assert other_site.status == invoked.status == after.status == "admitted"
    assert after.execution_id != first.execution_id
    decided = _outcomes(settings, 6)
    assert sorted(rows[0].outcome for rows in decided.values()) == sorted(
        [Outcome.admitted] * 4 + [Outcome.skipped] * 2)
    assert all(len(rows) == 1 for rows in decided.values())
    skipped = [rows[0] for rows in decided.values() if rows[0].outcome is Outcome.skipped]
    assert {row.execution_id for row in skipped} == {first.execution_id}
    assert {row.key for row in skipped} == {"s1"}


def test_a_repeat_of_a_skipped_start_answers_existing_with_the_holder(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    site = {"siteId": "s1"}
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings) as client:
        first = client.start("rebuildSearch", site, wait_decision=True, timeout=60)
        skipped = client.submit("rebuildSearch", site, id="job-7")
        client.flush()
        skipped.wait(60)
        # The alias reaches identity on its own topic: ask until the answer is the holder.
        deadline = time.monotonic() + 30
        again = client.submit("rebuildSearch", site, id="job-7")
        client.flush()
        again.wait(60)
        while again.execution_id != first.execution_id and time.monotonic() < deadline:
            again = client.submit("rebuildSearch", site, id="job-7")
            client.flush()
            again.wait(60)
    assert (skipped.status, skipped.execution_id) == ("skipped", first.execution_id)
    assert (again.status, again.execution_id) == ("existing", first.execution_id)


def test_cancel_the_newcomer_evicts_the_incumbent_and_an_old_run_ending_frees_nothing(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    runs = TopicReader(settings, topics.runs, RunRow)
    site = {"siteId": "s1"}
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings) as client:
        first = client.start("latestOnly", site, wait_decision=True, timeout=60)
        assert first.execution_id is not None
        _report(settings, first.execution_id, "latestOnly", RunEventKind.started)
        second = client.start("latestOnly", site, wait_decision=True, timeout=30)
        commands.until(lambda rows: len(rows) >= 1, timeout=30, what="the cancel of run 1")

        # The evicted run's end must not free the key its replacement now holds.
        _report(settings, first.execution_id, "latestOnly", RunEventKind.cancelled)
        _status(runs, first.execution_id, RunStatus.cancelled)
        third = client.start("latestOnly", site, wait_decision=True, timeout=30)
        commands.until(lambda rows: len(rows) >= 2, timeout=30, what="the cancel of run 2")
        commands.settle()

    assert first.status == second.status == third.status == "admitted"
    assert [(c.execution_id, c.kind) for c in commands.records] == [
        (first.execution_id, CommandKind.cancel), (second.execution_id, CommandKind.cancel)]
    assert commands.keys == [first.execution_id.encode(), str(second.execution_id).encode()]
    assert f"replaced by run {second.execution_id}" in (commands.records[0].reason or "")
    decided = _outcomes(settings, 3)
    assert [rows[0].outcome for rows in decided.values()] == [Outcome.admitted] * 3


def test_cancel_behind_a_debounce_evicts_the_incumbent_only_when_the_replacement_starts(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    clock = ManualClock()
    site = {"siteId": "s1"}

    def admitted(request_id: str) -> None:
        ledger.until(lambda rows: any(r.request_id == request_id and r.outcome is Outcome.admitted
                                      for r in rows), timeout=30, what=f"{request_id} admitted")

    with WorkerThread(app, settings, clock=clock), Client(app=app, settings=settings) as client:
        first = client.start("settledOnly", site, wait_decision=True, timeout=60)
        assert (first.status, first.deferral) == ("queued", "debounce")
        clock.advance(DEBOUNCE_MS)
        admitted(first.request_id)

        second = client.start("settledOnly", site, wait_decision=True, timeout=30)
        assert (second.status, second.deferral) == ("queued", "debounce")
        # The whole quiet period long, the incumbent runs on.
        clock.advance(DEBOUNCE_MS - 1)
        commands.settle()
        assert commands.records == []
        clock.advance(1)
        admitted(second.request_id)
        commands.until(lambda rows: len(rows) >= 1, timeout=30, what="the cancel")
        commands.settle()

    first_run = next(r.execution_id for r in ledger.records
                     if r.request_id == first.request_id and r.outcome is Outcome.admitted)
    second_run = next(r.execution_id for r in ledger.records
                      if r.request_id == second.request_id and r.outcome is Outcome.admitted)
    assert [(c.execution_id, c.kind) for c in commands.records] == [
        (first_run, CommandKind.cancel)]
    assert f"replaced by run {second_run}" in (commands.records[0].reason or "")
    decided = _outcomes(settings, 4)
    assert {request: [r.outcome for r in rows] for request, rows in decided.items()} == {
        first.request_id: [Outcome.queued, Outcome.admitted],
        second.request_id: [Outcome.queued, Outcome.admitted],
    }


THROTTLE_MS = 10_000  # tests.apps.singleton's spacedLatest: one start each 10 s


def test_cancel_behind_a_throttle_evicts_the_incumbent_only_once_the_replacement_is_admitted(
        settings: Settings, app: App) -> None:
    create_topics(settings)
    topics = Topics(settings)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    clock = ManualClock()
    site = {"siteId": "s1"}
    with WorkerThread(app, settings, clock=clock), Client(app=app, settings=settings) as client:
        first = client.start("spacedLatest", site, wait_decision=True, timeout=60)
        second = client.start("spacedLatest", site, wait_decision=True, timeout=30)
        assert (first.status, second.status, second.deferral) == ("admitted", "queued",
                                                                  "throttle")
        commands.settle()
        assert commands.records == []
        clock.advance(THROTTLE_MS)
        ledger.until(lambda rows: any(r.request_id == second.request_id
                                      and r.outcome is Outcome.admitted for r in rows),
                     timeout=30, what="the replacement admitted")
        commands.until(lambda rows: len(rows) >= 1, timeout=10, what="the cancel")
        commands.settle()

    second_run = next(r.execution_id for r in ledger.records
                      if r.request_id == second.request_id and r.outcome is Outcome.admitted)
    assert [(c.execution_id, c.kind) for c in commands.records] == [
        (first.execution_id, CommandKind.cancel)]
    assert f"replaced by run {second_run}" in (commands.records[0].reason or "")


def test_queue_three_starts_behind_an_active_run_leave_one_waiting_that_runs_when_it_ends(
        settings: Settings, app: App) -> None:
    """Issue 35, point 4: the latest of three waits, the two it replaced are collapsed into
    the run that goes, and that run is admitted once the active run ends."""
    create_topics(settings)
    topics = Topics(settings)
    runs = TopicReader(settings, topics.runs, RunRow)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    site = {"siteId": "s1"}
    with WorkerThread(app, settings, clock=ManualClock()), \
            Client(app=app, settings=settings) as client:
        first = client.start("nextRebuild", {**site, "note": "a"}, wait_decision=True,
                             timeout=60)
        assert first.status == "admitted" and first.execution_id is not None
        _report(settings, first.execution_id, "nextRebuild", RunEventKind.started)
        _status(runs, first.execution_id, RunStatus.running)
        waiting = [client.start("nextRebuild", {**site, "note": note}, wait_decision=True,
                                timeout=30) for note in ("b", "c", "d")]
        assert [(w.status, w.deferral) for w in waiting] == [("queued", "singleton")] * 3
        ledger.until(lambda rows: sum(r.outcome is Outcome.collapsed for r in rows) >= 2,
                     timeout=30, what="two collapsed rows")
        ledger.settle()
        assert not any(r.outcome is Outcome.admitted and r.request_id != first.request_id
                       for r in ledger.records), "nothing more runs while the key is held"

        _report(settings, first.execution_id, "nextRebuild", RunEventKind.completed)
        ledger.until(lambda rows: any(r.request_id == waiting[2].request_id
                                      and r.outcome is Outcome.admitted for r in rows),
                     timeout=30, what="the waiting start admitted")
        ledger.settle()

    by_request: dict[str, list[LedgerRecord]] = {}
    for row in sorted(ledger.records, key=lambda r: r.decided_at_ms):
        by_request.setdefault(row.request_id, []).append(row)
    outcomes = {w.request_id: [r.outcome for r in by_request[w.request_id]] for w in waiting}
    assert outcomes == {
        waiting[0].request_id: [Outcome.queued, Outcome.collapsed],
        waiting[1].request_id: [Outcome.queued, Outcome.collapsed],
        waiting[2].request_id: [Outcome.queued, Outcome.admitted],
    }
    (admitted,) = [r for r in by_request[waiting[2].request_id] if r.outcome is Outcome.admitted]
    collapsed_into = {by_request[w.request_id][-1].execution_id for w in waiting[:2]}
    assert collapsed_into == {admitted.execution_id}
    assert admitted.execution_id != first.execution_id and admitted.folded == 2
    assert sum(r.outcome is Outcome.admitted for r in ledger.records) == 2


def test_queue_the_waiting_start_survives_a_kill_and_is_admitted_exactly_once(
        settings: Settings, app: App, tmp_path: Path) -> None:
    """The waiting start is a logged row: a worker killed while it waits, and another on an
    empty state directory, still admit it once its key's run ends, and never twice."""
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    site = {"siteId": "s1"}
    worker = WorkerProcess(settings, "tests.apps.singleton", tmp_path / "first").start()
    try:
        with Client(app=app, settings=settings) as client:
            first = client.start("nextRebuild", site, wait_decision=True, timeout=90)
            assert first.status == "admitted" and first.execution_id is not None
            second = client.start("nextRebuild", {**site, "note": "b"}, wait_decision=True,
                                  timeout=30)
            third = client.start("nextRebuild", {**site, "note": "c"}, wait_decision=True,
                                 timeout=30)
        assert (second.status, third.status) == ("queued", "queued")
        ledger.until(lambda rows: any(r.outcome is Outcome.collapsed for r in rows),
                     timeout=30, what="the second start collapsed")
    finally:
        worker.kill()
    worker = WorkerProcess(settings, "tests.apps.singleton", tmp_path / "second").start()
    try:
        _report(settings, first.execution_id, "nextRebuild", RunEventKind.completed)
        admitted.until(lambda rows: len(rows) >= 2, timeout=120, what="the waiting start admitted")
        admitted.settle(2.0)
        ledger.settle()
    finally:
        worker.stop()
    will_run = next(r.execution_id for r in ledger.records
                    if r.request_id == second.request_id and r.outcome is Outcome.collapsed)
    assert Counter(a.execution_id for a in admitted.records) == {
        first.execution_id: 1, will_run: 1}
    last = admitted.records[-1]
    assert json.loads(last.payload)["note"] == "c"
    assert [r.outcome for r in ledger.records if r.request_id == third.request_id] == [
        Outcome.queued, Outcome.admitted]


def test_queue_composes_with_debounce_cancelon_and_timeouts_start(
        settings: Settings, app: App) -> None:
    """`guardedRebuild`: a debounce first, then the singleton's one waiting start, which a
    matching cancelOn event discards (sent to the singleton stage's topic) and
    `timeouts.start` expires."""
    create_topics(settings, app)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    clock = clock_at_now()

    def decided(handle: Handle, outcome: Outcome, deferral: str | None = None) -> None:
        ledger.until(lambda rows: any(r.request_id == handle.request_id and r.outcome is outcome
                                      and (deferral is None or r.deferral == deferral)
                                      for r in rows),
                     timeout=30, what=f"{handle.request_id} {outcome} {deferral}")

    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        def start(site: str) -> Handle:
            handle = client.submit("guardedRebuild", {"siteId": site})
            client.flush()
            decided(handle, Outcome.queued, "debounce")
            return handle

        holders = [start("s1"), start("s2")]
        clock.advance(DEBOUNCE_MS)
        for handle in holders:
            decided(handle, Outcome.admitted)
        discarded, expiring = start("s1"), start("s2")
        clock.advance(DEBOUNCE_MS)
        decided(discarded, Outcome.queued, "singleton")
        decided(expiring, Outcome.queued, "singleton")

        event_at = clock.now_ms()
        clock.advance(1_000)
        producer = Producer(settings.client_config())
        producer.produce(topics.event(SITE_DELETED), json.dumps({"siteId": "s1"}).encode(),
                         b"s1", timestamp=event_at)
        assert producer.flush(30) == 0
        decided(discarded, Outcome.cancelled)

        clock.advance(3_600_000)
        decided(expiring, Outcome.expired)
        ledger.settle()

    def outcomes(handle: Handle) -> list[tuple[Outcome, str | None]]:
        return [(r.outcome, r.deferral) for r in ledger.records
                if r.request_id == handle.request_id]

    assert outcomes(discarded) == [(Outcome.queued, "debounce"), (Outcome.queued, "singleton"),
                                   (Outcome.cancelled, None)]
    assert outcomes(expiring) == [(Outcome.queued, "debounce"), (Outcome.queued, "singleton"),
                                  (Outcome.expired, None)]
    (cancelled,) = [r for r in ledger.records if r.request_id == discarded.request_id
                    and r.outcome is Outcome.cancelled]
    assert cancelled.stage == "singleton"
    assert (cancelled.reason or "").startswith("cancelOn:site.deleted")
    assert sum(r.outcome is Outcome.admitted for r in ledger.records) == 2
