"""cancelOn on the real broker, time driven by a ManualClock: exact commands and ledger rows."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedStart,
    CommandKind,
    DeadLetter,
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
from tests.apps.operations import ISSUE_DELETED, app
from tests.integration.kafka_helpers import TopicReader, WorkerThread, clock_at_now

pytestmark = pytest.mark.broker


def _setup(settings: Settings) -> Topics:
    # With the app, the cancelOn event topics too, waited for until they have leaders.
    create_topics(settings, app)
    return Topics(settings)


def _produce(settings: Settings, topic: str, key: bytes, value: bytes,
             timestamp: int | None = None) -> None:
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    if timestamp is None:
        producer.produce(topic, value, key)
    else:
        producer.produce(topic, value, key, timestamp=timestamp)
    assert producer.flush(30) == 0


def _start(client: Client, admitted: TopicReader[AdmittedStart], workflow: str, row: str,
           issue: str) -> str:
    handle = client.submit(workflow, {"rowId": row, "issueKey": issue})
    client.flush()
    runs = admitted.until(lambda rs: any(handle.request_id in r.request_ids for r in rs),
                          timeout=30, what=f"{row} admitted")
    return next(r.execution_id for r in runs if handle.request_id in r.request_ids)


def _cancels(commands: list[EngineCommand]) -> Counter[str]:
    return Counter(c.execution_id for c in commands if c.kind is CommandKind.cancel)


def test_an_event_cancels_a_suspended_run_and_a_debounced_start_but_not_later_runs(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    runs = TopicReader(settings, topics.runs, RunRow)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        sleeping = _start(client, admitted, "tourNarration", "r1", "K1")
        other = _start(client, admitted, "tourNarration", "r2", "K2")
        _produce(settings, topics.run_events, sleeping.encode(), codec.encode(RunEvent(
            execution_id=sleeping, workflow="tourNarration", kind=RunEventKind.suspended,
            at_ms=clock.now_ms(), reason="sleeping 6h")))
        runs.until(lambda rs: any(r.execution_id == sleeping and r.status is
                                  RunStatus.suspended for r in rs), what="r1 suspended")
        queued = client.submit("tourEdits", {"rowId": "e1", "issueKey": "K1"})
        client.flush()
        ledger.until(lambda rs: any(r.request_id == queued.request_id for r in rs),
                     what="the edit queued")
        event_at = clock.now_ms()
        clock.advance(1_000)
        later = _start(client, admitted, "tourNarration", "r3", "K1")
        _produce(settings, topics.event(ISSUE_DELETED), b"K1",
                 json.dumps({"issueKey": "K1"}).encode(), timestamp=event_at)
        commands.until(lambda cs: sleeping in _cancels(cs), what="the cancel of r1")
        ledger.until(lambda rs: any(r.request_id == queued.request_id and r.outcome is
                                    Outcome.cancelled for r in rs), what="the edit cancelled")
        commands.settle(1.0)
        clock.advance(2 * 60_000)  # past the debounce period: the discarded edit never runs
        admitted.settle(1.5)

    (command,) = commands.records
    assert (command.execution_id, command.reason) == (sleeping, "cancelOn:jira.issue.deleted")
    assert _cancels(commands.records) == Counter({sleeping: 1})
    assert other not in _cancels(commands.records) and later not in _cancels(commands.records)
    assert not any(a.workflow == "tourEdits" for a in admitted.records)
    outcomes = [r.outcome for r in ledger.records if r.request_id == queued.request_id]
    assert outcomes == [Outcome.queued, Outcome.cancelled]
    (edit,) = [r for r in ledger.records if r.request_id == queued.request_id
               and r.outcome is Outcome.cancelled]
    assert edit.reason is not None and edit.reason.startswith("cancelOn:jira.issue.deleted")
    (run_row,) = [r for r in ledger.records if r.execution_id == sleeping
                  and r.outcome is Outcome.cancelled]
    assert run_row.stage == "cancelon"


def test_an_event_that_does_not_decode_is_reported_and_cancels_nothing(
        settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    dead = TopicReader(settings, topics.deadletter, DeadLetter)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        _start(client, admitted, "tourNarration", "r1", "K1")
        clock.advance(1_000)
        _produce(settings, topics.event(ISSUE_DELETED), b"K1", b'{"issue": "K1"}',
                 timestamp=clock.now_ms())
        (letter,) = dead.until(lambda ds: len(ds) >= 1, what="the dead letter")
        ledger.until(lambda rs: any(r.outcome is Outcome.rejected for r in rs),
                     what="the rejected row")
        commands.settle(1.5)

    assert commands.records == []
    assert letter.stage == "cancelon" and "does not decode" in letter.reason
    (rejected,) = [r for r in ledger.records if r.outcome is Outcome.rejected]
    assert rejected.workflow == "tourNarration, tourEdits"


def test_a_restarted_correlator_repeats_no_cancel(settings: Settings) -> None:
    topics = _setup(settings)
    clock = clock_at_now()
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    event_topic = topics.event(ISSUE_DELETED)
    with WorkerThread(app, settings, clock=clock), \
            Client(app=app, settings=settings, replies=False) as client:
        first = _start(client, admitted, "tourNarration", "r1", "K1")
        second = _start(client, admitted, "tourNarration", "r2", "K2")
        clock.advance(1_000)
        _produce(settings, event_topic, b"K1", b'{"issueKey": "K1"}', clock.now_ms())
        commands.until(lambda cs: first in _cancels(cs), what="the first cancel")
    # The second event arrives while no worker runs.
    _produce(settings, event_topic, b"K2", b'{"issueKey": "K2"}', clock.now_ms())
    # A fresh state directory: the second worker restores the correlator's store from its
    # changelog and resumes from the committed offsets (a lock keeps the first one's dir).
    with WorkerThread(app, settings.with_(state_dir=settings.state_dir / "again"),
                      clock=clock):
        commands.until(lambda cs: second in _cancels(cs), what="the second cancel")
        commands.settle(1.5)

    assert _cancels(commands.records) == Counter({first: 1, second: 1})
