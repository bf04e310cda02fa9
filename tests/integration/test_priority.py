"""Priority orders the concurrency queue, on the real broker: urgent starts waiting behind
normal ones go first; with every priority equal the queue is first come, first served."""

from __future__ import annotations

import json

import pytest

from sluicegate.config import Settings
from sluicegate.declare import App, load_app
from sluicegate.engine.clock import ManualClock
from sluicegate.schemas.records import LedgerRecord, Outcome, RunEventKind
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.integration.test_concurrency import APP, StepEngine, produce_in_order

pytestmark = pytest.mark.broker


@pytest.fixture
def app() -> App:
    return load_app(APP)


def _admission_order(settings: Settings, app: App, workflow: str,
                     urgent: list[bool]) -> list[int]:
    """Start `workflow` once per flag, in order, behind one running start; then end the
    runs one at a time (the limit is 1) and return the admitted starts' numbers."""
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    engine = StepEngine(settings)
    try:
        with WorkerThread(app, settings):
            produce_in_order(settings, [(workflow, {"urgent": False, "n": -1})])
            running = engine.next_admitted()
            produce_in_order(settings, [(workflow, {"urgent": flag, "n": i})
                                        for i, flag in enumerate(urgent)])
            ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows)
                         >= len(urgent), timeout=15, what="every start queued")
            order = []
            for _ in urgent:
                engine.report(running, RunEventKind.completed)
                running = engine.next_admitted()
                order.append(json.loads(running.payload)["n"])
    finally:
        engine.close()
    return order


def test_with_concurrency_1_urgent_starts_queued_behind_normal_ones_are_admitted_first(
        settings: Settings, app: App) -> None:
    flags = [False, False, False, True, False, True]
    order = _admission_order(settings, app, "report", flags)
    assert order == [3, 5, 0, 1, 2, 4]


def test_with_all_default_priorities_the_queue_is_first_come_first_served(
        settings: Settings, app: App) -> None:
    order = _admission_order(settings, app, "plain", [False, True, False, True, False])
    assert order == [0, 1, 2, 3, 4]


def test_in_age_mode_a_start_that_waited_longer_beats_a_boosted_newcomer_of_another_lane(
        settings: Settings, app: App) -> None:
    """Seed 003's shape: one slot overall, a lane per account. A start of account a that
    has waited 9 minutes with no boost goes before a start of account b that arrives now
    with a boost of 1 s, and one of account c boosted by 600 s (as if it came 10 minutes
    ago) goes before both."""
    create_topics(settings)
    ledger = TopicReader(settings, Topics(settings).ledger, LedgerRecord)
    engine = StepEngine(settings)
    clock = ManualClock()

    def start(account: str, boost: int, n: int, queued: int) -> None:
        produce_in_order(settings, [("byAccount", {"account": account, "boost": boost, "n": n})])
        ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= queued,
                     timeout=15, what=f"{queued} starts queued")

    try:
        with WorkerThread(app, settings, clock):
            produce_in_order(settings, [("byAccount", {"account": "a", "n": -1})])
            running = engine.next_admitted()
            start("a", 0, 0, queued=1)
            clock.advance(9 * 60_000)
            start("b", 1, 1, queued=2)
            clock.advance(1_000)
            start("c", 600, 2, queued=3)
            order = []
            for _ in range(3):
                engine.report(running, RunEventKind.completed)
                running = engine.next_admitted()
                order.append(json.loads(running.payload)["n"])
    finally:
        engine.close()
    assert order == [2, 0, 1]
