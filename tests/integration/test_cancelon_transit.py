"""cancelOn and starts in transit: a start on its way between two stages when the sweep
passes (sent on before the sweep reached one stage, read by the next after the sweep
reached it) is judged by the next, on the real broker with a manual clock."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sluicegate.admission.routing import Router
from sluicegate.admission.stages.cancelon import KEPT, SWEEP_GRACE_MS, decode_for
from sluicegate.client import Client, Handle
from sluicegate.config import Settings
from sluicegate.ops.services.control import write_control
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    CancelSweep,
    ControlRow,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.keys import execution_id_for
from sluicegate.topology.topics import Topics
from tests.apps.operations import ISSUE_DELETED
from tests.apps.operations_queues import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread, clock_at_now
from tests.integration.test_cancelon import _produce, _setup
from tests.integration.test_cancelon_queues import _delete

pytestmark = pytest.mark.broker

ROUTER = Router(app, 0, None)


def _kept(settings: Settings, topics: Topics, stages: list[str], *, gone: bool = False,
          timeout: float = 30.0) -> None:
    """Wait until every partition of each stage's store holds a kept sweep (or, `gone`,
    has forgotten it), as its changelog says: the stage took the sweep."""
    consumer = Consumer(settings.client_config(**{
        "group.id": f"test-kept-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "isolation.level": "read_committed"}))
    wanted = {(topics.changelog(s), p) for s in stages for p in range(settings.partitions)}
    consumer.assign([TopicPartition(t, p, 0) for t, p in wanted])
    state: dict[tuple[str, int], bool] = {}
    deadline = time.monotonic() + timeout
    try:
        while any(state.get(tp) is not (not gone) for tp in wanted):
            if time.monotonic() > deadline:
                missing = sorted(tp for tp in wanted if state.get(tp) is not (not gone))
                raise AssertionError(f"no kept sweep {'forgotten' if gone else 'taken'} "
                                     f"in {missing}")
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None and (msg.key() or b"").startswith(KEPT):
                    state[(msg.topic(), msg.partition())] = msg.value() is not None
    finally:
        consumer.close()


def _in_transit(settings: Settings, topics: Topics, workflow: str, stage: str, issue: str,
                arrived_at_ms: int) -> str:
    """A start as the stage before `stage` sent it on (before the sweep reached that
    stage), arriving now; returns its request id."""
    wf = app.workflows[workflow]
    request_id = f"transit-{uuid.uuid4().hex[:8]}"
    payload = {"rowId": request_id, "issueKey": issue}
    hops = ROUTER.routes[workflow].hops
    if stage == "pause":
        # A paused start detours to the pause stage from the hop it stopped after.
        hop, key = 0, workflow
    else:
        hop = next(i for i, h in enumerate(hops) if h.stage == stage)
        key = Router.key_for(wf, hops[hop], payload)
    start = PendingStart(
        execution_id=execution_id_for(workflow, request_id, 0, settings.partitions),
        workflow=workflow,
        payload=json.dumps(payload).encode(), origin=Origin.event, kind=AdmittedKind.start,
        declaration_version=wf.version, hop=hop, request_id=request_id,
        request_ids=[request_id], requested_at_ms=arrived_at_ms, arrived_at_ms=arrived_at_ms,
        priority=0.0, slots=[], on_failure=wf.on_failure)
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    producer.produce(topics.stage(stage), codec.encode(start), key.encode())
    assert producer.flush(30) == 0
    return request_id


def _outcomes(ledger: TopicReader[LedgerRecord], request_id: str) -> list[Outcome]:
    return [r.outcome for r in ledger.records if r.request_id == request_id]


def _cancelled_at(ledger: TopicReader[LedgerRecord], request_id: str) -> str | None:
    return next((r.stage for r in ledger.records
                 if r.request_id == request_id and r.outcome is Outcome.cancelled), None)


QUEUES = [("editTour", "defer"), ("batchTour", "defer"), ("paceTour", "throttle"),
          ("slotTour", "concurrency"), ("pausedTour", "pause")]


def test_a_start_in_transit_when_the_sweep_passed_is_discarded(settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    write_control(settings, ControlRow(workflow="pausedTour", paused=True,
                                       at_ms=clock.now_ms(), reason="maintenance"))
    with WorkerThread(app, settings, clock=clock):
        event_at = clock.now_ms()
        clock.advance(1_000)
        _delete(settings, topics, "K1", event_at)
        _kept(settings, topics, sorted({stage for _, stage in QUEUES}))
        before = {(wf, stage): _in_transit(settings, topics, wf, stage, "K1", event_at - 500)
                  for wf, stage in QUEUES}
        spared = [_in_transit(settings, topics, wf, stage, issue, at)
                  for wf, stage in QUEUES
                  for issue, at in (("K1", event_at + 500), ("K2", event_at - 500))]
        ledger.until(lambda rs: all(_cancelled_at(ledger, rid) for rid in before.values()),
                     timeout=30, what="every start in transit discarded")
        ledger.settle(1.5)
        admitted.settle(0.5)

    for (_, stage), request_id in before.items():
        assert _outcomes(ledger, request_id) == [Outcome.cancelled]
        (row,) = [r for r in ledger.records if r.request_id == request_id]
        assert row.stage == stage
        assert row.reason is not None and row.reason.startswith("cancelOn:jira.issue.deleted")
    assert not any(set(before.values()) & set(a.request_ids) for a in admitted.records)
    # Arrived after the event, or not matching: never discarded.
    for request_id in spared:
        assert Outcome.cancelled not in _outcomes(ledger, request_id)


def test_a_debounced_group_defer_kept_is_not_discarded_by_the_next_stage(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        def edit(issue: str) -> Handle:
            handle = client.submit("editTour", {"rowId": "r1", "issueKey": issue})
            client.flush()
            ledger.until(lambda rs: any(r.request_id == handle.request_id for r in rs),
                         timeout=30, what="the edit queued")
            return handle

        first = edit("K1")
        clock.advance(1_000)
        event_at = clock.now_ms()
        clock.advance(1_000)
        # The latest edit, the one whose payload runs, arrives after the event: defer
        # keeps the group when the sweep passes.
        latest = edit("K1")
        _delete(settings, topics, "K1", event_at)
        _kept(settings, topics, ["defer", "concurrency"])
        # The group goes on to concurrency, which kept the sweep too, from the group's
        # first arrival, before the event.
        clock.advance(60_000)
        ledger.until(lambda rs: any(r.request_id == latest.request_id and r.outcome in (
            Outcome.admitted, Outcome.cancelled) for r in rs), timeout=30,
            what="the group decided")
        ledger.settle(1.0)

    assert _outcomes(ledger, first.request_id) == [Outcome.queued, Outcome.collapsed]
    assert _outcomes(ledger, latest.request_id) == [Outcome.queued, Outcome.admitted]


def test_a_restarted_worker_still_judges_by_the_sweeps_its_stages_kept_until_their_grace_ends(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=clock):
        event_at = clock.now_ms()
        clock.advance(1_000)
        _delete(settings, topics, "K1", event_at)
        _kept(settings, topics, ["defer"])
    # A fresh state directory: the stores come back from their changelogs.
    with WorkerThread(app, settings.with_(state_dir=settings.state_dir / "again"),
                      clock=clock):
        discarded = _in_transit(settings, topics, "editTour", "defer", "K1", event_at - 500)
        ledger.until(lambda rs: _cancelled_at(ledger, discarded) is not None, timeout=30,
                     what="the start in transit discarded after the restart")
        clock.advance(SWEEP_GRACE_MS)
        _kept(settings, topics, ["defer"], gone=True)
        # In transit for longer than the grace: judged by nobody, as a late run row.
        late = _in_transit(settings, topics, "editTour", "defer", "K1", event_at - 500)
        ledger.until(lambda rs: any(r.request_id == late for r in rs), timeout=30,
                     what="the late start decided")
        ledger.settle(1.0)

    assert _outcomes(ledger, discarded) == [Outcome.cancelled]
    assert _outcomes(ledger, late) == [Outcome.queued]


# -- a group defer let go before defer took the sweep --------------------------------------


def _sweep_reaches(settings: Settings, topics: Topics, stages: list[str], issue: str,
                   event_at: int) -> None:
    """The correlator's sweep for a `jira.issue.deleted` event, reaching these stages
    only (as every partition of a stage takes it, one stage before another)."""
    body = json.dumps({"issueKey": issue}).encode()
    source = f"{topics.event(ISSUE_DELETED)}:0:{event_at}"
    sweep = codec.encode(CancelSweep(event=ISSUE_DELETED, body=body, event_at_ms=event_at,
                                     source=source,
                                     workflows=decode_for(app, ISSUE_DELETED, body).workflows))
    producer = Producer(settings.client_config())
    for stage in stages:
        for partition in range(settings.partitions):
            producer.produce(topics.stage(stage), sweep, source.encode(), partition)
    assert producer.flush(30) == 0


def _submit(client: Client, ledger: TopicReader[LedgerRecord], workflow: str, row: str,
            issue: str) -> Handle:
    """A start, queued by defer before the next one comes (so arrivals keep this order)."""
    handle = client.submit(workflow, {"rowId": row, "issueKey": issue})
    client.flush()
    ledger.until(lambda rs: any(r.request_id == handle.request_id for r in rs), timeout=30,
                 what=f"{workflow} {row} queued")
    return handle


def _decided(ledger: TopicReader[LedgerRecord], handles: list[Handle]) -> None:
    final = (Outcome.admitted, Outcome.cancelled)
    ledger.until(lambda rs: all(any(r.request_id == h.request_id and r.outcome in final
                                    for r in rs) for h in handles),
                 timeout=30, what="every group decided")


def test_a_debounced_group_defer_let_go_before_it_took_the_sweep_is_judged_by_its_latest_edit(
        settings: Settings) -> None:
    """The window the correlator's fan-out leaves: defer lets a group go, then the sweep
    reaches concurrency, then the group does, and defer takes the sweep last."""
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        stale = _submit(client, ledger, "editTour", "r1", "K1")
        edited = _submit(client, ledger, "editTour", "r2", "K1")
        other = _submit(client, ledger, "editTour", "r3", "K2")
        clock.advance(1_000)
        event_at = clock.now_ms()
        clock.advance(1_000)
        latest = _submit(client, ledger, "editTour", "r2", "K1")  # after the event
        _sweep_reaches(settings, topics, ["concurrency"], "K1", event_at)
        _kept(settings, topics, ["concurrency"])
        clock.advance(60_000)  # the quiet period: defer lets every group go
        _decided(ledger, [stale, latest, other])
        _sweep_reaches(settings, topics, ["defer"], "K1", event_at)
        _kept(settings, topics, ["defer"])
        ledger.settle(1.0)

    assert _outcomes(ledger, stale.request_id) == [Outcome.queued, Outcome.cancelled]
    assert _cancelled_at(ledger, stale.request_id) == "concurrency"
    assert _outcomes(ledger, edited.request_id) == [Outcome.queued, Outcome.collapsed]
    assert _outcomes(ledger, latest.request_id) == [Outcome.queued, Outcome.admitted], (
        "its latest edit, the payload that runs, came after the event")
    assert _outcomes(ledger, other.request_id) == [Outcome.queued, Outcome.admitted]


def test_a_batch_defer_let_go_before_it_took_the_sweep_is_discarded_when_every_item_would_be(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        matching = [_submit(client, ledger, "batchSlotTour", "a", "K1") for _ in range(2)]
        mixed = [_submit(client, ledger, "batchSlotTour", "b", issue)
                 for issue in ("K1", "K2")]
        late = [_submit(client, ledger, "batchSlotTour", "c", "K1")]
        clock.advance(1_000)
        event_at = clock.now_ms()
        clock.advance(1_000)
        late.append(_submit(client, ledger, "batchSlotTour", "c", "K1"))  # after the event
        _sweep_reaches(settings, topics, ["concurrency"], "K1", event_at)
        _kept(settings, topics, ["concurrency"])
        clock.advance(60_000)  # the batches' deadline: defer lets them go
        _decided(ledger, [matching[0], mixed[0], late[0]])
        ledger.settle(1.0)
        admitted.settle(0.5)

    # Every item would have been discarded: nothing of the run would have run.
    assert _outcomes(ledger, matching[0].request_id) == [Outcome.queued, Outcome.cancelled]
    assert _cancelled_at(ledger, matching[0].request_id) == "concurrency"
    assert _outcomes(ledger, matching[1].request_id) == [Outcome.queued, Outcome.collapsed]
    # K2 would have run: the run goes on whole, as does one with an item after the event.
    runs = {tuple(a.request_ids) for a in admitted.records}
    assert runs == {tuple(h.request_id for h in mixed), tuple(h.request_id for h in late)}
    for handle in (mixed[0], late[0]):
        assert _outcomes(ledger, handle.request_id) == [Outcome.queued, Outcome.admitted]


def test_a_debounced_group_waiting_at_the_next_stage_is_judged_by_its_latest_edit_after_a_restart(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        holder = _submit(client, ledger, "editSlotTour", "h", "K0")
        clock.advance(60_000)
        _decided(ledger, [holder])  # it holds the workflow's one slot
        stale = _submit(client, ledger, "editSlotTour", "r1", "K1")
        first = _submit(client, ledger, "editSlotTour", "r2", "K1")
        clock.advance(1_000)
        event_at = clock.now_ms()
        clock.advance(1_000)
        latest = _submit(client, ledger, "editSlotTour", "r2", "K1")  # after the event
        clock.advance(60_000)  # defer lets both groups go: they wait for the slot
        ledger.until(lambda rs: all(sum(r.request_id == h.request_id and r.stage == "concurrency"
                                        for r in rs) == 1 for h in (stale, latest)),
                     timeout=30, what="both groups waiting for the slot")
    # A fresh state directory: the waiting groups, headers and all, come back from the
    # changelog.
    with WorkerThread(app, settings.with_(state_dir=settings.state_dir / "again"),
                      clock=clock):
        _delete(settings, topics, "K1", event_at)
        ledger.until(lambda rs: _cancelled_at(ledger, stale.request_id) is not None,
                     timeout=30, what="the stale group discarded")
        (run,) = [a for a in admitted.until(lambda rs: len(rs) >= 1, timeout=30,
                                            what="the holder's run")]
        _produce(settings, topics.run_events, run.execution_id.encode(),
                 codec.encode(RunEvent(execution_id=run.execution_id, workflow="editSlotTour",
                                       kind=RunEventKind.completed, at_ms=clock.now_ms())))
        _decided(ledger, [latest])
        ledger.settle(1.0)

    assert _cancelled_at(ledger, stale.request_id) == "concurrency"
    assert _outcomes(ledger, stale.request_id) == [
        Outcome.queued, Outcome.queued, Outcome.cancelled]
    assert _outcomes(ledger, first.request_id) == [Outcome.queued, Outcome.collapsed]
    assert _outcomes(ledger, latest.request_id) == [
        Outcome.queued, Outcome.queued, Outcome.admitted], (
        "its first edit came before the event, its latest after: it runs")
