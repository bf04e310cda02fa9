"""The worker's cycle in memory: the test driver runs the worker's executor
(engine/executor.py), so a record that fails is retried and then given up on, records sent
to a control are handed over in order, and a restart restores the stores from their
changelogs, as in the worker."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Debounce, Workflow
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.records import RunEventKind, StartRequest
from sluicegate.testing import TestDriver


class Edit(BaseModel):
    rowId: str


DEBOUNCED = Workflow(name="edit", payload=Edit, debounce=Debounce(key="rowId", period="1m"))
ONE_AT_A_TIME = Workflow(name="one", payload=Edit, concurrency=Concurrency(limit=1))
APP = App([DEBOUNCED, ONE_AT_A_TIME])


def _fail_on(driver: TestDriver, request_id: str, times: int) -> list[str]:
    """The identity stage raises on `request_id`'s start, its first `times` attempts; the
    attempts are listed."""
    stage = driver.stage("identity")
    process = stage.process
    attempts: list[str] = []

    def failing(ctx: Any, record: InputRecord) -> None:
        if record.topic == driver.topics.starts and record.value is not None:
            request = codec.decode(StartRequest, record.value)
            if request.request_id == request_id:
                attempts.append(request_id)
                if len(attempts) <= times:
                    raise ValueError("the disk of a test is full of itself")
        process(ctx, record)

    stage.process = failing  # type: ignore[method-assign]
    return attempts


def test_a_record_that_keeps_failing_is_retried_once_then_dead_lettered_and_the_partition_moves_on(
) -> None:
    with TestDriver(APP) as driver:
        attempts = _fail_on(driver, "req-2", times=10)
        first = driver.start("one", {"rowId": "a"})
        driver.start("one", {"rowId": "b"})  # req-2
        driver.report(first.execution_id, RunEventKind.completed)
        third = driver.start("one", {"rowId": "c"})
        assert attempts == ["req-2", "req-2"], "tried, retried once, then given up on"
        (dead,) = driver.dead_letters
        assert dead.stage == "identity"
        assert dead.reason.startswith("could not be processed (2 attempts): identity failed on ")
        assert "the disk of a test is full of itself" in dead.reason
        assert [a.execution_id for a in driver.admitted] == [
            first.execution_id, third.execution_id], "the partition went on past it"


def test_a_record_that_fails_once_is_processed_once_in_the_replayed_cycle() -> None:
    with TestDriver(APP) as driver:
        attempts = _fail_on(driver, "req-2", times=1)
        first = driver.start("one", {"rowId": "a"})
        driver.start("edit", {"rowId": "b"})  # req-2: fails, the cycle is read again
        assert attempts == ["req-2", "req-2"]
        assert driver.dead_letters == []
        assert [a.execution_id for a in driver.admitted] == [first.execution_id], (
            "the aborted cycle's admission was dropped, and made once again")
        driver.advance(60_000)
        assert [a.workflow for a in driver.admitted] == ["one", "edit"]


def test_what_is_sent_to_a_control_is_handed_over_in_order_once_caught_up() -> None:
    with TestDriver(APP, in_order=True) as handing, TestDriver(APP) as writing:
        for driver in (handing, writing):
            started = [driver.start("one", {"rowId": row}) for row in "abc"]
            for done in started[:2]:
                driver.report(done.execution_id, RunEventKind.completed)
            assert [a.execution_id for a in driver.admitted] == [
                s.execution_id for s in started], "one at a time, in the order sent"
        concurrency = handing.topics.stage("concurrency")
        assert handing.sent(concurrency) == [], "handed over in-process, never written"
        assert len(writing.sent(concurrency)) == 5, (
            "a driver not in order writes them: three starts, two releases")
        assert handing.admitted == writing.admitted


def test_a_failure_after_a_handover_in_order_reads_the_cycle_again_with_nothing_twice(
) -> None:
    with TestDriver(APP, in_order=True) as driver:
        attempts = _fail_on(driver, "req-3", times=1)
        started = [driver.start("one", {"rowId": row}) for row in "abc"]
        assert attempts == ["req-3", "req-3"]
        driver.report(started[0].execution_id, RunEventKind.completed)
        assert [a.execution_id for a in driver.admitted] == [
            s.execution_id for s in started[:2]]
        assert driver.sent(driver.topics.stage("concurrency")) == []


def test_a_restart_restores_state_and_timers_from_the_changelogs_and_remakes_derived_rows(
) -> None:
    with TestDriver(APP) as driver:
        driver.start("edit", {"rowId": "a"})  # a timer a minute from now
        first = driver.start("one", {"rowId": "a"})
        second = driver.start("one", {"rowId": "b"})  # queued behind the first
        driver.commit()
        store = driver.context("concurrency").store
        held = dict(store.items(b""))
        changelog = [w.key for w in driver.sent(driver.topics.changelog("concurrency"))]
        derived = driver.stage("concurrency").derived
        assert not any(key is not None and key.startswith(derived) for key in changelog), (
            "derived rows are not logged")
        assert any(key.startswith(derived) for key in held)
        due = driver.timers("defer").next_due

        before = driver.tasks[0].states["concurrency"].store
        driver.restart()
        after = driver.tasks[0].states["concurrency"].store
        assert after is before if before.persistent else after is not before, (
            "a store on disk taken over, one in memory made anew")
        assert dict(driver.context("concurrency").store.items(b"")) == held, (
            "its rows replayed from the changelog, its derived rows made again")
        assert driver.timers("defer").next_due == due
        driver.report(first.execution_id, RunEventKind.completed)
        assert [a.execution_id for a in driver.admitted] == [
            first.execution_id, second.execution_id]
        driver.advance(60_000)
        assert [a.workflow for a in driver.admitted] == ["one", "one", "edit"]


def test_a_restart_drops_what_was_not_committed_and_restores_only_what_was() -> None:
    with TestDriver(APP) as driver:
        driver.start("one", {"rowId": "a"})
        driver.commit()
        changelog = driver.topics.changelog("concurrency")
        committed = len(driver.sent(changelog))
        driver.start("edit", {"rowId": "b"})  # piped, not committed: read again
        driver.restart()
        assert len(driver.sent(changelog)) == committed
        assert len(driver.admitted) == 1, "the committed admission, once"
        driver.advance(60_000)
        assert [a.workflow for a in driver.admitted] == ["one", "edit"]


@pytest.mark.parametrize("times", [1, 5])
def test_a_restored_stage_whose_restored_hook_fails_joins_after_retrying_or_without_it(
        times: int) -> None:
    with TestDriver(APP) as driver:
        driver.start("one", {"rowId": "a"})
        driver.commit()
        calls: list[int] = []
        stage = driver.stage("concurrency")
        restored = type(stage).restored

        def failing(self: Any, ctx: Any) -> None:
            calls.append(1)
            if len(calls) <= times:
                raise ValueError("not yet")
            restored(self, ctx)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(stage), "restored", failing)
            driver.restart()
        assert len(calls) == (2 if times == 1 else driver.settings.poison_after)
        driver.start("one", {"rowId": "b"})
        assert len(driver.admitted) == 1, "the partition joined and went on"


def test_a_timer_that_keeps_failing_is_retried_once_then_dead_lettered() -> None:
    with TestDriver(APP) as driver:
        stage = driver.stage("defer")
        fired: list[int] = []

        def failing(ctx: Any, due_ms: int, key: bytes, value: bytes) -> None:
            fired.append(due_ms)
            raise ValueError("a timer of a test")

        stage.fire = failing  # type: ignore[method-assign]
        driver.start("edit", {"rowId": "a"})
        driver.commit()  # the start's cycle committed, as a worker's is long before
        driver.advance(60_000)
        assert len(fired) == 2 and len(set(fired)) == 1, "fired, fired again, given up"
        (dead,) = driver.dead_letters
        assert dead.source_topic == "timer:defer"
        assert "defer failed on its timer due at" in dead.reason
        assert "a timer of a test" in dead.reason
        assert driver.timers("defer").next_due is None, "the timer is spent"


def test_a_failure_of_a_record_handed_over_is_the_failure_of_the_record_that_sent_it(
) -> None:
    with TestDriver(APP) as driver:
        stage = driver.stage("runs")
        process_handed_over = stage.process_handed_over
        taken: list[bytes] = []

        def failing(ctx: Any, topic: str, key: bytes, *rest: Any) -> None:
            taken.append(key)
            if len(taken) > 1:  # the second run's row, every time
                raise ValueError("the runs stage of a test")
            process_handed_over(ctx, topic, key, *rest)

        stage.process_handed_over = failing  # type: ignore[method-assign]
        driver.start("edit", {"rowId": "a"})
        driver.start("edit", {"rowId": "b"})
        driver.commit()
        taken.clear()
        taken.append(b"")  # from here, every run's row fails
        driver.advance(60_000)  # both debounce timers fire; each admission fails
        reasons = [dead.reason for dead in driver.dead_letters]
        assert reasons and all("runs failed on a record handed over from defer's timer"
                               in reason for reason in reasons), reasons


def test_a_record_whose_handed_over_record_keeps_failing_is_dead_lettered_with_its_offset(
) -> None:
    with TestDriver(APP) as driver:
        stage = driver.stage("runs")

        def failing(*args: Any) -> None:
            raise ValueError("the runs stage of a test")

        stage.process_handed_over = failing  # type: ignore[method-assign]
        driver.start("one", {"rowId": "a"})
        (dead,) = driver.dead_letters
        concurrency = driver.topics.stage("concurrency")
        assert (dead.source_topic, dead.source_offset) == (concurrency, 0)
        assert f"runs failed on a record handed over from {concurrency}[0]@0" in dead.reason
        assert driver.admitted == [], "its admission was not committed with it"
