"""Singleton `queue` mode: one start waits behind the active run of its key, a later one
replaces it, and the waiting one is admitted when the active run ends (issue 35, point 4)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.admission.stages.singleton import hold_key, holder
from sluicegate.admission.stages.singleton_queue import replace, waiting_for
from sluicegate.client.errors import BlockingCallerRefused
from sluicegate.client.producer import refuse_blocking
from sluicegate.declare import App, Singleton, Timeouts, Workflow
from sluicegate.ops.services.waiting import why
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    RunEvent,
    RunEventKind,
    Slot,
)
from sluicegate.testing import TestDriver
from tests.apps.singleton import SITE_DELETED, Rebuild
from tests.apps.singleton import app as singleton_app

QUEUED = "nextRebuild"
GUARDED = "guardedRebuild"  # debounce 10 s, timeouts.start 1 h, cancelOn site.deleted
DEBOUNCE_MS = 10_000


def _pending(execution_id: str, note: str, slots: list[Slot] | None = None) -> PendingStart:
    return PendingStart(
        execution_id=execution_id, workflow=QUEUED,
        payload=codec.dump_payload({"siteId": "s1", "note": note}),
        origin=Origin.event, kind=AdmittedKind.start, declaration_version="v", hop=1,
        request_id=f"r-{execution_id}", request_ids=[f"r-{execution_id}"],
        requested_at_ms=0, arrived_at_ms=0, priority=0.0, slots=slots or [],
        reply_partition=None)


# -- the pure core -------------------------------------------------------------------


def test_the_first_start_to_wait_waits_as_itself() -> None:
    newcomer = _pending("ex-2", "b")
    assert replace(None, newcomer) is newcomer


def test_a_later_start_replaces_the_waiting_one_under_its_execution_id_with_every_request() -> None:
    held = Slot("identity", "k-2")
    carrier = replace(_pending("ex-2", "b", [held]),
                      _pending("ex-3", "c", [Slot("identity", "k-3")]))
    assert carrier.execution_id == "ex-2"
    assert codec.load_payload(carrier.payload) == {"siteId": "s1", "note": "c"}
    assert carrier.request_id == "r-ex-3"
    assert carrier.request_ids == ["r-ex-2", "r-ex-3"]
    assert carrier.slots == [held, Slot("identity", "k-3")]


# -- the stage, through the worker's whole route -------------------------------------------


@pytest.fixture
def driver() -> Iterator[TestDriver]:
    with TestDriver(singleton_app, start_ms=1000) as d:
        yield d


def _rows(d: TestDriver, request_id: str) -> list[LedgerRecord]:
    return [r for r in d.ledger if r.request_id == request_id]


def _outcomes(d: TestDriver, request_id: str) -> list[Outcome]:
    return [r.outcome for r in _rows(d, request_id)]


def test_three_starts_behind_an_active_run_leave_one_waiting_and_it_runs_when_that_run_ends(
        driver: TestDriver) -> None:
    first = driver.start(QUEUED, Rebuild(siteId="s1", note="a"))
    (run,) = driver.admitted
    second = driver.start(QUEUED, Rebuild(siteId="s1", note="b"))
    third = driver.start(QUEUED, Rebuild(siteId="s1", note="c"))
    fourth = driver.start(QUEUED, Rebuild(siteId="s1", note="d"))
    other_site = driver.start(QUEUED, Rebuild(siteId="s2"))

    assert [a.execution_id for a in driver.admitted] == [run.execution_id,
                                                         other_site.execution_id]
    queued = _rows(driver, second.request.request_id)[0]
    assert (queued.outcome, queued.deferral, queued.key, queued.position) == (
        Outcome.queued, "singleton", "s1", 0)
    assert f"held by run {run.execution_id}" in (queued.reason or "")
    # Each replaced start is collapsed into the run that will go: the first one to wait.
    will_run = second.execution_id
    for replaced in (second, third):
        collapsed = _rows(driver, replaced.request.request_id)[-1]
        assert (collapsed.outcome, collapsed.execution_id) == (Outcome.collapsed, will_run)
    assert _outcomes(driver, fourth.request.request_id) == [Outcome.queued]
    assert holder(driver.store("singleton"), QUEUED, "s1") == run.execution_id

    driver.report(run.execution_id, RunEventKind.completed)

    assert [a.execution_id for a in driver.admitted][2:] == [will_run]
    admitted = driver.admitted[2]
    assert codec.load_payload(admitted.payload) == {"siteId": "s1", "note": "d"}
    assert admitted.slots == [Slot("singleton", hold_key(QUEUED, "s1"))]
    (row,) = [r for r in _rows(driver, fourth.request.request_id) if r.outcome is Outcome.admitted]
    assert (row.execution_id, row.folded) == (will_run, 2)
    assert holder(driver.store("singleton"), QUEUED, "s1") == will_run
    assert _outcomes(driver, first.request.request_id) == [Outcome.admitted]


def test_with_nothing_waiting_a_run_ending_frees_the_key_and_the_next_start_runs_at_once(
        driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1"))
    (run,) = driver.admitted
    driver.report(run.execution_id, RunEventKind.completed)
    assert holder(driver.store("singleton"), QUEUED, "s1") is None
    later = driver.start(QUEUED, Rebuild(siteId="s1"))
    assert _outcomes(driver, later.request.request_id) == [Outcome.admitted]


def test_a_suspended_run_keeps_the_key_and_the_start_keeps_waiting(driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1"))
    (run,) = driver.admitted
    driver.report(run.execution_id, RunEventKind.started)
    driver.report(run.execution_id, RunEventKind.suspended)
    waiting = driver.start(QUEUED, Rebuild(siteId="s1"))
    assert _outcomes(driver, waiting.request.request_id) == [Outcome.queued]
    driver.report(run.execution_id, RunEventKind.resumed)
    driver.report(run.execution_id, RunEventKind.failed)
    assert _outcomes(driver, waiting.request.request_id) == [Outcome.queued, Outcome.admitted]


def test_the_waiting_start_survives_a_restart_and_is_admitted_exactly_once(
        driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1", note="a"))
    (run,) = driver.admitted
    second = driver.start(QUEUED, Rebuild(siteId="s1", note="b"))
    driver.commit()
    driver.start(QUEUED, Rebuild(siteId="s1", note="c"))  # not committed: read again
    driver.restart()
    assert waiting_for(driver.store("singleton"), QUEUED, "s1") is not None
    driver.report(run.execution_id, RunEventKind.completed)
    driver.commit()
    driver.restart()  # the completion is committed: nothing is admitted again
    admitted = [a for a in driver.admitted if a.execution_id != run.execution_id]
    assert [a.execution_id for a in admitted] == [second.execution_id]
    assert codec.load_payload(admitted[0].payload)["note"] == "c"
    assert Outcome.collapsed in _outcomes(driver, second.request.request_id)
    assert waiting_for(driver.store("singleton"), QUEUED, "s1") is None


def test_a_repeat_of_a_replaced_starts_key_answers_with_the_run_that_goes(
        driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1"))
    second = driver.start(QUEUED, Rebuild(siteId="s1"))
    third = driver.start(QUEUED, Rebuild(siteId="s1"), id="job-3")
    assert _outcomes(driver, third.request.request_id) == [Outcome.queued]
    again = driver.start(QUEUED, Rebuild(siteId="s1"), id="job-3", origin="direct")
    (row,) = _rows(driver, again.request.request_id)
    assert (row.outcome, row.execution_id) == (Outcome.existing, second.execution_id)


def test_behind_a_debounce_the_settled_start_waits_and_timeouts_start_expires_it(
        driver: TestDriver) -> None:
    driver.start(GUARDED, Rebuild(siteId="s1"))
    driver.advance(DEBOUNCE_MS)
    (run,) = driver.admitted
    late = driver.start(GUARDED, Rebuild(siteId="s1"))
    driver.advance(DEBOUNCE_MS)
    assert [(r.outcome, r.deferral) for r in _rows(driver, late.request.request_id)] == [
        (Outcome.queued, "debounce"), (Outcome.queued, "singleton")]
    driver.advance(3_600_000 - DEBOUNCE_MS - 1)
    assert _outcomes(driver, late.request.request_id)[-1] is Outcome.queued
    driver.advance(1)
    expired = _rows(driver, late.request.request_id)[-1]
    assert expired.outcome is Outcome.expired
    assert "timeouts.start" in (expired.reason or "") and "'s1'" in (expired.reason or "")
    # Its run's end admits nothing: what waited is gone.
    driver.report(run.execution_id, RunEventKind.completed)
    assert len(driver.admitted) == 1


def test_a_cancelon_event_discards_the_waiting_start_and_leaves_the_active_run_to_the_correlator(
        driver: TestDriver) -> None:
    driver.start(GUARDED, Rebuild(siteId="s1"))
    driver.advance(DEBOUNCE_MS)
    (run,) = driver.admitted
    waiting = driver.start(GUARDED, Rebuild(siteId="s1"))
    driver.advance(DEBOUNCE_MS)
    other = driver.start(GUARDED, Rebuild(siteId="s2"))
    driver.event(SITE_DELETED, {"siteId": "s1"})
    cancelled = _rows(driver, waiting.request.request_id)[-1]
    assert cancelled.outcome is Outcome.cancelled
    assert "cancelOn:site.deleted" in (cancelled.reason or "")
    assert _outcomes(driver, other.request.request_id) == [Outcome.queued]  # its debounce
    driver.report(run.execution_id, RunEventKind.completed)
    assert [a.execution_id for a in driver.admitted] == [run.execution_id]


def test_a_waiting_start_let_go_while_its_workflow_is_paused_waits_for_the_unpause(
        driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1"))
    (run,) = driver.admitted
    waiting = driver.start(QUEUED, Rebuild(siteId="s1"))
    driver.pause(QUEUED, "deploying a fix")
    driver.report(run.execution_id, RunEventKind.completed)
    assert [(r.outcome, r.deferral) for r in _rows(driver, waiting.request.request_id)] == [
        (Outcome.queued, "singleton"), (Outcome.queued, "pause")]
    driver.unpause(QUEUED)
    driver.advance(1_000)
    assert _outcomes(driver, waiting.request.request_id)[-1] is Outcome.admitted
    assert holder(driver.store("singleton"), QUEUED, "s1") == waiting.execution_id


# -- the declaration ---------------------------------------------------------------


def test_queue_mode_waits_so_it_takes_timeouts_start_and_refuses_blocking_callers() -> None:
    wf = Workflow(name="f", payload=Rebuild, singleton=Singleton(key="siteId", mode="queue"),
                  timeouts=Timeouts(start="1h"))
    app = App([wf])
    with pytest.raises(BlockingCallerRefused, match="singleton mode 'queue'"):
        refuse_blocking(app, "f")


def test_the_why_waiting_sentence_says_it_waits_for_the_run_holding_the_key() -> None:
    assert why("singleton", "s1", None, 1, 1, None, None, 0) == (
        "singleton on key 's1': waits for the run holding the key to end (a later start "
        "would replace it)")


def test_a_start_waiting_when_a_redeploy_drops_queue_mode_still_goes_when_the_run_ends(
        driver: TestDriver) -> None:
    driver.start(QUEUED, Rebuild(siteId="s1"))
    (run,) = driver.admitted
    waiting = driver.start(QUEUED, Rebuild(siteId="s1"))
    driver.commit()
    skip_now = App([Workflow(name=QUEUED, payload=Rebuild,
                             singleton=Singleton(key="siteId", mode="skip"))])
    driver.restart(app=skip_now)
    driver.report(run.execution_id, RunEventKind.completed)
    assert _outcomes(driver, waiting.request.request_id) == [Outcome.queued, Outcome.admitted]


# -- exactly once, whatever the order of arrivals, ends and restarts -------------------------


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.sampled_from(["start", "start", "start", "end", "commit",
                                       "restart"]), max_size=25))
def test_every_start_is_admitted_once_or_collapsed_and_one_run_holds_the_key(
        steps: list[str]) -> None:
    with TestDriver(singleton_app, start_ms=1000) as d:
        requests: list[str] = []
        for step in steps:
            if step == "start":
                requests.append(d.start(QUEUED, Rebuild(siteId="s1")).request.request_id)
            elif step == "end":
                live = holder(d.store("singleton"), QUEUED, "s1")
                if live is not None:
                    d.report(live, RunEventKind.completed)
            elif step == "commit":
                d.commit()
            else:
                d.commit()
                d.restart()
            admitted = [a.execution_id for a in d.admitted]
            assert len(admitted) == len(set(admitted)), "no run admitted twice"
            ended = {e.execution_id for e in d.read(d.topics.run_events, RunEvent)
                     if e.kind is RunEventKind.completed}
            assert len(set(admitted) - ended) <= 1, "one run of the key at a time"
        finals = {r.request_id: r.outcome for r in d.ledger}
        assert set(finals) == set(requests), "every request decided"
        still = [r for r, outcome in finals.items() if outcome is Outcome.queued]
        assert len(still) <= 1, "one start waits at most"
        assert all(outcome in (Outcome.admitted, Outcome.collapsed, Outcome.queued)
                   for outcome in finals.values())
        if still:
            assert waiting_for(d.store("singleton"), QUEUED, "s1") is not None
