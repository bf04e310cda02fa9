"""The runs stage's pure core: run rows after engine reports, and the backstop deadlines."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.admission.lease import DEFAULT_LEASE_MS, lease_of
from sluicegate.admission.stages.runs import (
    BACKSTOPS,
    ENDED,
    Backstop,
    RunsStage,
    admitted_row,
    alive,
    apply_event,
    backstop_for,
    failed_by_backstop,
    failure_reason,
    holds_lease,
    redriven,
)
from sluicegate.declare import Concurrency, Workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    LedgerRecord,
    Origin,
    Outcome,
    RunEvent,
    RunEventKind,
    RunOperation,
    RunRow,
    RunStatus,
    Slot,
)
from sluicegate.testing import TestDriver, Written
from tests.apps.lifecycle import Job
from tests.apps.lifecycle import app as lifecycle_app

ADMITTED_AT = 1_000_000


def _row(slots: list[Slot] | None = None, status: RunStatus = RunStatus.admitted) -> RunRow:
    return RunRow(execution_id="e1", workflow="w", status=status, payload=b"{}",
                  declaration_version="v", admitted_at_ms=ADMITTED_AT,
                  updated_at_ms=ADMITTED_AT, slots=slots or [], keys={})


def _event(kind: RunEventKind, at: int, **more: object) -> RunEvent:
    return RunEvent(execution_id="e1", workflow="w", kind=kind, at_ms=at, **more)  # type: ignore[arg-type]


events = st.builds(
    _event,
    st.sampled_from(list(RunEventKind)),
    st.integers(ADMITTED_AT, ADMITTED_AT + 10**9),
    reason=st.none() | st.text(max_size=5),
    retries_spent=st.none() | st.integers(0, 9),
    run_id=st.none() | st.text(min_size=1, max_size=4),
)
CONCURRENCY = Slot("concurrency", "w\x1f")
SINGLETON = Slot("singleton", "w\x1fk")


# -- apply_event ------------------------------------------------------------------------


def test_a_run_goes_admitted_running_suspended_running_completed() -> None:
    row = _row()
    for kind, status in [(RunEventKind.started, RunStatus.running),
                         (RunEventKind.suspended, RunStatus.suspended),
                         (RunEventKind.resumed, RunStatus.running),
                         (RunEventKind.heartbeat, RunStatus.running),
                         (RunEventKind.completed, RunStatus.completed)]:
        row = apply_event(row, _event(kind, ADMITTED_AT + 1))
        assert row.status is status
    assert row.ended_at_ms == ADMITTED_AT + 1


def test_a_status_change_without_a_reason_does_not_keep_the_earlier_status_reason() -> None:
    asleep = apply_event(_row(), _event(RunEventKind.suspended, ADMITTED_AT + 1,
                                        reason="waiting for approval"))
    assert asleep.last_reason == "waiting for approval"
    assert apply_event(asleep, _event(RunEventKind.heartbeat, ADMITTED_AT + 2)).last_reason == (
        "waiting for approval")
    assert apply_event(asleep, _event(RunEventKind.cancelled, ADMITTED_AT + 3)).last_reason is None
    # An operator's cancel: its reason is what the cancelled run shows.
    cancelled = apply_event(asleep, _event(RunEventKind.cancelled, ADMITTED_AT + 3,
                                           reason="cancelled by the engine"), "bad deploy")
    assert (cancelled.status, cancelled.last_reason) == (RunStatus.cancelled, "bad deploy")
    # ... and only a cancel takes it.
    done = apply_event(asleep, _event(RunEventKind.completed, ADMITTED_AT + 3), "bad deploy")
    assert (done.status, done.last_reason) == (RunStatus.completed, None)


def test_an_engine_failure_keeps_its_message_and_retries() -> None:
    event = _event(RunEventKind.failed, ADMITTED_AT + 5, retries_spent=3,
                   error_message="boom", error_tag="E")
    row = apply_event(_row(), event)
    assert (row.status, row.last_reason, row.retries_spent) == (RunStatus.failed, "boom", 3)
    assert failure_reason(event) == "retries exhausted (3)"


@given(st.lists(events, max_size=12))
def test_an_ended_run_changes_again_only_when_a_failed_run_is_redriven(
        sequence: list[RunEvent]) -> None:
    row = _row([CONCURRENCY])
    for event in sequence:
        before, row = row, apply_event(row, event)
        if before.status in ENDED:
            reopens = (before.status is RunStatus.failed
                       and event.kind in (RunEventKind.started, RunEventKind.resumed)
                       and event.at_ms > (before.ended_at_ms or 0))
            assert redriven(before, event) is reopens
            if reopens:
                # Its holds went back when it failed: the redriven run holds none.
                assert (row.status, row.slots, row.ended_at_ms) == (RunStatus.running, [],
                                                                    None)
            else:
                assert row == before
        elif row.status in ENDED:
            assert row.ended_at_ms == event.at_ms
        else:
            assert row.ended_at_ms is None


def test_a_completed_or_cancelled_run_is_never_reopened() -> None:
    for end in (RunEventKind.completed, RunEventKind.cancelled):
        ended = apply_event(_row(), _event(end, ADMITTED_AT + 1))
        for kind in (RunEventKind.started, RunEventKind.resumed):
            assert apply_event(ended, _event(kind, ADMITTED_AT + 2)) == ended


def test_a_report_from_before_the_failure_does_not_reopen_it() -> None:
    failed = apply_event(_row(), _event(RunEventKind.failed, ADMITTED_AT + 10))
    assert apply_event(failed, _event(RunEventKind.started, ADMITTED_AT + 10)) == failed
    again = apply_event(failed, _event(RunEventKind.resumed, ADMITTED_AT + 11))
    assert again.status is RunStatus.running


@given(st.lists(events, max_size=12), st.integers(0, 10**9))
def test_a_backstop_fails_a_live_run_and_leaves_an_ended_one(
        sequence: list[RunEvent], now: int) -> None:
    row = _row()
    for event in sequence:
        row = apply_event(row, event)
    late = failed_by_backstop(row, now, "timeouts.finish")
    if row.status in ENDED:
        assert late == row
    else:
        assert (late.status, late.ended_at_ms, late.last_reason) == (
            RunStatus.failed, now, "timeouts.finish")
        # ... and then nothing the engine says afterwards changes it.
        assert apply_event(late, _event(RunEventKind.completed, now + 1)) == late


# -- the backstop -------------------------------------------------------------------------


def test_finish_replaces_the_lease() -> None:
    assert backstop_for(ADMITTED_AT, 10_000, 3_600_000, True) == Backstop(
        finish_at_ms=ADMITTED_AT + 10_000)


def test_a_run_holding_no_concurrency_slot_has_no_lease() -> None:
    assert backstop_for(ADMITTED_AT, None, 3_600_000, False).idle


def test_a_suspended_steps_mode_run_holds_no_lease() -> None:
    suspended = _row([CONCURRENCY], RunStatus.suspended)
    assert not holds_lease(suspended, steps_mode=True)
    assert holds_lease(suspended, steps_mode=False)
    assert not holds_lease(_row([SINGLETON], RunStatus.running), steps_mode=False)


def test_the_lease_is_the_shortest_of_the_limits_or_the_default() -> None:
    wf = Workflow(name="w", payload=Job, concurrency=[
        Concurrency(limit=5, lease="10m"), Concurrency(limit=2, key="jobId", lease="2m")])
    assert lease_of(wf) == 120_000
    assert lease_of(Workflow(name="v", payload=Job)) == DEFAULT_LEASE_MS
    assert lease_of(None) == DEFAULT_LEASE_MS


@given(st.lists(st.tuples(st.integers(0, 10**7), st.booleans()), max_size=20),
       st.integers(1000, 10**7))
def test_leases_extend_on_each_report_and_finish_never_moves(
        reports: list[tuple[int, bool]], lease_ms: int) -> None:
    backstop = backstop_for(ADMITTED_AT, None, lease_ms, True)
    assert backstop.lease_until_ms == ADMITTED_AT + lease_ms
    now = ADMITTED_AT
    for step, holding in reports:
        now += step
        before = backstop
        backstop = alive(backstop, holding, now)
        assert backstop.finish_at_ms is None and backstop.lease_ms == lease_ms
        if not holding:
            assert backstop.lease_until_ms is None
        else:
            # A report extends the lease to a full lease from now, never shortens it.
            assert backstop.lease_until_ms == max(now + lease_ms, before.lease_until_ms or 0)
        assert _round_trips(backstop)

    finish = backstop_for(ADMITTED_AT, 5000, lease_ms, True)
    assert alive(finish, True, now) == finish


def _round_trips(backstop: Backstop) -> bool:
    codec = BACKSTOPS.value
    legacy = codec.legacy_encode(backstop)  # type: ignore[attr-defined]
    return codec.decode(codec.encode(backstop)) == backstop == codec.decode(legacy)


def test_a_backstop_round_trips_through_its_store_row_and_the_old_release_s() -> None:
    for backstop in [Backstop(), Backstop(1, None, None), Backstop(None, 5, 9)]:
        assert _round_trips(backstop)
    assert dataclasses.replace(Backstop(None, 5, 9), lease_until_ms=None).idle is False


# -- the stage in the test driver -----------------------------------------------------


def _admitted(execution_id: str) -> AdmittedStart:
    return AdmittedStart(execution_id=execution_id, workflow="flakyJob", payload=b"{}",
                         declaration_version="v", origin=Origin.event,
                         kind=AdmittedKind.start, slots=[], request_ids=["r"],
                         requested_at_ms=ADMITTED_AT, admitted_at_ms=ADMITTED_AT)


def _hand_over(d: TestDriver, admitted: AdmittedStart, value: bytes) -> None:
    """An admitting stage of the same worker sends the admission to the runs stage's
    topic with the record itself: it is handed over, `value` never read, and processed
    once the worker's loop goes on (`advance(0)`)."""
    d.context("identity").send(d.topics.stage("runs"), admitted.execution_id.encode(), value,
                               None, None, admitted)
    d.advance(0)


def _stage_sent(d: TestDriver, since: int = 0) -> list[Written]:
    """What the stages wrote from the `since`-th record on (not what the test piped)."""
    piped = {d.topics.stage("runs"), d.topics.run_events}
    return [w for w in d.sent()[since:] if w.topic not in piped]


def test_an_admission_handed_over_is_taken_as_the_record_it_carries() -> None:
    with TestDriver(lifecycle_app, start_ms=ADMITTED_AT) as d:
        read = _admitted("e-read")
        handed = _admitted("e-handed")
        # Read from its topic: the bytes are decoded. Handed over by the admitting stage in
        # the same worker: the record it carries is the admission, its bytes are not read
        # again (these are not even an admitted start).
        d.pipe(d.topics.stage("runs"), read, b"e-read")
        _hand_over(d, handed, b"not decoded")
        ctx = d.context("runs")
        assert RunsStage.load(ctx, "e-read") == admitted_row(read)
        assert RunsStage.load(ctx, "e-handed") == admitted_row(handed)
        assert _stage_sent(d) == []  # nothing dead-lettered or rejected


def test_an_admission_handed_over_without_its_record_is_decoded_as_if_read() -> None:
    with TestDriver(lifecycle_app, start_ms=ADMITTED_AT) as d:
        admitted = _admitted("e-bytes")
        # A sender that passes no record: the stage's hook processes the bytes as the
        # record read from the topic would be, and it is still never written there.
        d.context("identity").send(d.topics.stage("runs"), b"e-bytes", codec.encode(admitted))
        assert RunsStage.load(d.context("runs"), "e-bytes") is None  # after the sender
        d.advance(0)
        assert RunsStage.load(d.context("runs"), "e-bytes") == admitted_row(admitted)
        assert d.sent(d.topics.stage("runs")) == []
        assert _stage_sent(d) == []


def test_a_report_read_before_its_admission_is_applied_when_the_admission_arrives() -> None:
    with TestDriver(lifecycle_app, start_ms=ADMITTED_AT) as d:
        started = RunEvent(execution_id="e-early", workflow="flakyJob",
                           kind=RunEventKind.started, at_ms=ADMITTED_AT + 5, run_id="run-1")
        # The engine's report and the admission travel on two topics: a worker that reads
        # the admission from its topic can read the report first, and keeps it.
        d.pipe(d.topics.run_events, started, b"e-early")
        ctx = d.context("runs")
        assert RunsStage.load(ctx, "e-early") is None
        d.pipe(d.topics.stage("runs"), _admitted("e-early"), b"e-early")
        row = RunsStage.load(ctx, "e-early")
        assert row is not None
        assert (row.status, row.run_id, row.updated_at_ms) == (
            RunStatus.running, "run-1", ADMITTED_AT + 5)
        # Applied once: the kept report is gone.
        assert not any(b"e-early\x1f" in key for key, _ in ctx.store.items(b""))


def _operate(d: TestDriver, verb: str, reason: str | None) -> None:
    d.pipe(d.topics.stage("runs"), RunOperation(
        operation="op1", execution_id="e1", workflow="flakyJob", verb=verb,
        issued_at_ms=ADMITTED_AT + 6, reason=reason), b"e1")


def test_an_operation_on_a_run_that_changed_since_it_was_selected_is_skipped_and_recorded(
) -> None:
    with TestDriver(lifecycle_app, start_ms=ADMITTED_AT + 10) as d:
        _hand_over(d, _admitted("e1"), b"")
        d.pipe(d.topics.run_events, RunEvent(
            execution_id="e1", workflow="flakyJob", kind=RunEventKind.completed,
            at_ms=ADMITTED_AT + 5), b"e1")
        since = len(d.sent())

        # Selected while it ran, carried out once it had completed: nothing to cancel.
        _operate(d, "cancel", "bad deploy")
        (written,) = _stage_sent(d, since)
        assert written.topic == d.topics.ledger
        row = codec.decode(LedgerRecord, written.value)
        assert (row.request_id, row.outcome, row.execution_id) == (
            "run:e1:bulk-cancel:op1", Outcome.skipped, "e1")
        assert row.reason == "cancel not carried out, the run is completed now (bad deploy)"
        assert d.commands == []


def test_a_cancel_operation_sends_the_command_and_the_run_ends_with_its_reason() -> None:
    with TestDriver(lifecycle_app, start_ms=ADMITTED_AT + 10) as d:
        _hand_over(d, _admitted("e1"), b"")
        _operate(d, "cancel", "bad deploy")
        (command,) = d.commands
        assert (command.command_id, command.reason) == ("bulk-cancel:op1:e1", "bad deploy")
        (ledger,) = d.ledger
        assert (ledger.outcome, ledger.reason) == (Outcome.cancelled, "bad deploy")
        ctx = d.context("runs")
        assert len(list(ctx.table("cancelling").items())) == 1
        d.pipe(d.topics.run_events, RunEvent(
            execution_id="e1", workflow="flakyJob", kind=RunEventKind.cancelled,
            at_ms=ADMITTED_AT + 7), b"e1")
        row = RunsStage.load(ctx, "e1")
        assert row is not None and (row.status, row.last_reason) == (
            RunStatus.cancelled, "bad deploy")
        # The reason waited for the run's end, and is gone with it.
        assert list(ctx.table("cancelling").items()) == []
