"""The pure parts of the cancelOn correlator (the window, the match, decoding), and the
sweeps a queue stage keeps for starts in transit, in the test driver."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.admission.routing import Router
from sluicegate.admission.stages.cancelon import (
    GROUP_HEADER,
    QUEUE_STAGES,
    SWEEP_GRACE_MS,
    Group,
    cancel_reason,
    decode_for,
    group_headers,
    group_reason,
    in_window,
    judge,
    let_go_by_defer,
    queued_reason,
    reason_for,
)
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Singleton,
    Throttle,
    Workflow,
)
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    CancelSweep,
    Origin,
    Outcome,
    PendingStart,
    Slot,
)
from sluicegate.testing import TestDriver
from tests.apps.operations import ISSUE_DELETED, JiraIssueDeleted, Tour, app, tour
from tests.apps.operations_queues import Tours
from tests.unit.test_concurrency import admitted_ids, outcomes, release, releases

T = 1_000_000
EVENT = {"issueKey": "K1"}


def test_a_run_started_after_the_event_is_never_cancelled() -> None:
    assert not in_window(T + 1, T, None)
    assert cancel_reason(tour, ISSUE_DELETED, EVENT, T, T + 1,
                         {"rowId": "r", "issueKey": "K1"}) is None


def test_a_run_started_at_or_before_the_event_is_cancelled_when_it_matches() -> None:
    assert in_window(T, T, None)
    payload = {"rowId": "r", "issueKey": "K1"}
    assert cancel_reason(tour, ISSUE_DELETED, EVENT, T, T - 5, payload) == (
        "cancelOn:jira.issue.deleted")


def test_a_run_whose_payload_does_not_match_is_left_alone() -> None:
    assert cancel_reason(tour, ISSUE_DELETED, EVENT, T, T - 5,
                         {"rowId": "r", "issueKey": "K2"}) is None


def test_within_limits_the_cancel_to_runs_started_in_that_window_before_the_event() -> None:
    wf = Workflow(name="w", payload=Tour, cancel_on=[CancelOn(
        event=ISSUE_DELETED, schema=JiraIssueDeleted, match="true", within="1m",
        reason="issue gone")])
    payload = {"rowId": "r", "issueKey": "K1"}
    assert cancel_reason(wf, ISSUE_DELETED, EVENT, T, T - 60_000, payload) == "issue gone"
    assert cancel_reason(wf, ISSUE_DELETED, EVENT, T, T - 60_001, payload) is None


@given(started=st.integers(0, 2 * T), event_at=st.integers(0, 2 * T),
       within=st.one_of(st.none(), st.integers(0, T)))
def test_the_window_is_started_at_or_before_the_event_and_no_older_than_within(
        started: int, event_at: int, within: int | None) -> None:
    expected = started <= event_at and (within is None or started >= event_at - within)
    assert in_window(started, event_at, within) is expected


def test_an_event_that_does_not_decode_is_reported_for_each_declaring_workflow() -> None:
    decoded = decode_for(app, ISSUE_DELETED, b'{"issue": 1}')
    assert decoded.workflows == []
    assert [wf for wf, _ in decoded.problems] == ["tourNarration", "tourEdits"]
    assert "issueKey" in decoded.problems[0][1]
    assert decode_for(app, ISSUE_DELETED, b"not json").workflows == []
    assert decode_for(app, ISSUE_DELETED, None).workflows == []


def test_an_event_that_decodes_names_every_declaring_workflow() -> None:
    decoded = decode_for(app, ISSUE_DELETED, json.dumps(EVENT).encode())
    assert decoded == type(decoded)(["tourEdits", "tourNarration"], [])


def test_a_queued_start_is_discarded_only_for_the_workflows_the_sweep_names() -> None:
    sweep = CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(), event_at_ms=T,
                        source="s:0:1", workflows=["tourEdits"])
    payload = json.dumps({"rowId": "r", "issueKey": "K1"}).encode()
    assert queued_reason(app, sweep, "tourEdits", T - 1, payload) == (
        "cancelOn:jira.issue.deleted")
    assert queued_reason(app, sweep, "tourEdits", T + 1, payload) is None
    assert queued_reason(app, sweep, "tourNarration", T - 1, payload) is None
    assert queued_reason(App([]), sweep, "tourEdits", T - 1, payload) is None


# -- starts in transit: a queue stage judges what reaches it after a sweep it kept --------

EDITS = Workflow(name="edits", payload=Tour, debounce=Debounce(key="rowId", period="1m"),
                 concurrency=Concurrency(limit=5), cancel_on=[CancelOn(
                     event=ISSUE_DELETED, schema=JiraIssueDeleted,
                     match="event.issueKey == payload.issueKey")])
SLOTS = Workflow(name="slots", payload=Tour, concurrency=Concurrency(limit=5),
                 cancel_on=EDITS.cancel_on)


def _sweep(source: str = "ev:0:7", event_at_ms: int = T) -> CancelSweep:
    return CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(),
                       event_at_ms=event_at_ms, source=source, workflows=["edits", "slots"])


def _in_transit(h: TestDriver, workflow: str, issue: str, arrived_at_ms: int, n: int,
                slots: list[Slot] | None = None) -> str:
    """A start identity sent before the sweep passed, reaching concurrency after it."""
    wf = h.app.workflows[workflow]
    execution_id = f"{workflow}-{n}"
    payload = {"rowId": f"r{n}", "issueKey": issue}
    start = PendingStart(
        execution_id=execution_id, workflow=workflow, payload=json.dumps(payload).encode(),
        origin=Origin.event, kind=AdmittedKind.start, declaration_version=wf.version,
        hop=0, request_id=f"req-{execution_id}", request_ids=[f"req-{execution_id}"],
        requested_at_ms=arrived_at_ms, arrived_at_ms=arrived_at_ms, priority=0.0,
        slots=slots or [])
    h.forward(start, payload=payload)
    return execution_id


def _take(h: TestDriver, sweep: CancelSweep) -> None:
    """The sweep the correlator sent the concurrency stage."""
    h.pipe(h.topics.stage("concurrency"), sweep, sweep.source)


def _at(h: TestDriver, ms: int) -> None:
    h.advance(ms - h.now_ms)


@pytest.fixture
def slots_stage() -> Iterator[TestDriver]:
    with TestDriver(App([SLOTS]), start_ms=T) as h:
        yield h


def test_a_start_in_transit_when_the_sweep_passed_is_discarded_even_with_a_slot_free(
        slots_stage: TestDriver) -> None:
    h = slots_stage
    _at(h, T + 1_000)
    _take(h, _sweep())
    held = Slot("singleton", "slots\x1fr0")
    before = _in_transit(h, "slots", "K1", T - 1, 0, slots=[held])
    at_the_event = _in_transit(h, "slots", "K1", T, 1)
    after = _in_transit(h, "slots", "K1", T + 1, 2)
    other = _in_transit(h, "slots", "K2", T - 1, 3)

    assert outcomes(h, before) == [Outcome.cancelled]
    assert outcomes(h, at_the_event) == [Outcome.cancelled]
    (row,) = [r for r in h.ledger if r.request_id == f"req-{before}"]
    assert row.stage == "concurrency" and row.reason is not None
    assert row.reason.startswith("cancelOn:jira.issue.deleted: event 'jira.issue.deleted' at "
                                 "ev:0:7")
    assert [(r.stage, r.key, r.execution_id) for r in releases(h)] == [
        ("singleton", "slots\x1fr0", before)], "the holds it took are given back"
    assert admitted_ids(h) == [after, other]


def test_within_bounds_what_a_kept_sweep_discards() -> None:
    wf = Workflow(name="slots", payload=Tour, concurrency=Concurrency(limit=5), cancel_on=[
        CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                 match="event.issueKey == payload.issueKey", within="1m")])
    with TestDriver(App([wf]), start_ms=T) as h:
        _at(h, T + 1_000)
        _take(h, _sweep())
        old = _in_transit(h, "slots", "K1", T - 60_001, 0)
        recent = _in_transit(h, "slots", "K1", T - 60_000, 1)
        assert admitted_ids(h) == [old]
        assert outcomes(h, recent) == [Outcome.cancelled]


def test_a_kept_sweep_survives_a_restart_and_is_forgotten_after_the_grace_period(
        slots_stage: TestDriver) -> None:
    h = slots_stage
    _at(h, T + 1_000)
    _take(h, _sweep())
    _take(h, _sweep())  # the same sweep again is kept once, and forgotten once
    h.commit()
    h.restart()
    first = _in_transit(h, "slots", "K1", T - 1, 0)
    assert outcomes(h, first) == [Outcome.cancelled]
    h.advance(SWEEP_GRACE_MS - 1)
    second = _in_transit(h, "slots", "K1", T - 1, 1)
    assert outcomes(h, second) == [Outcome.cancelled], "still within its grace"
    h.advance(1)
    late = _in_transit(h, "slots", "K1", T - 1, 2)
    assert admitted_ids(h) == [late], "in transit longer than the grace: not judged"
    store = h.store("concurrency")
    # The kept sweeps' rows and their count (beside them, the index's own rows).
    assert list(store.items(b"\x00S\x00cancelOn\x1f")) == []
    assert store.get(b"\x00S\x00cancelOn#") is None


def test_a_resume_is_never_discarded_by_a_sweep() -> None:
    payload = json.dumps({"rowId": "r", "issueKey": "K1"}).encode()
    start = PendingStart(
        execution_id="x", workflow="tourEdits", payload=payload, origin=Origin.event,
        kind=AdmittedKind.resume, declaration_version="v", hop=1, request_id="resume:x",
        request_ids=["resume:x"], requested_at_ms=T - 1, arrived_at_ms=T - 1, priority=0.0,
        slots=[])
    sweep = CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(), event_at_ms=T,
                        source="s:0:1", workflows=["tourEdits"])
    assert reason_for(app, sweep, start) is None
    assert reason_for(app, sweep, dataclasses.replace(start, kind=AdmittedKind.start)) == (
        "cancelOn:jira.issue.deleted")


def test_only_a_group_defer_let_go_is_exempt_from_the_kept_sweeps() -> None:
    router = Router(App([EDITS]), 0, None)
    hops = [hop.stage for hop in router.routes["edits"].hops]
    assert hops == ["identity", "defer", "concurrency"]
    start = PendingStart(
        execution_id="x", workflow="edits", payload=b"{}", origin=Origin.event,
        kind=AdmittedKind.start, declaration_version="v", hop=1, request_id="r",
        request_ids=["r"], requested_at_ms=T, arrived_at_ms=T, priority=0.0, slots=[])
    assert not let_go_by_defer(router, start, "defer"), "on its way to defer"
    assert let_go_by_defer(router, dataclasses.replace(start, hop=2), "concurrency")
    # At pause a start's hop is the one it stopped after.
    assert let_go_by_defer(router, start, "pause")
    assert not let_go_by_defer(router, dataclasses.replace(start, hop=0), "pause")


# -- a group defer let go: judged by defer's rules wherever it is ------------------------



def _batched(**within: str) -> Workflow:
    return Workflow(
        name="batched", payload=Tours, batch=Batch(item=Tour, key="rowId", max_size=10,
                                                   timeout="1m"),
        concurrency=Concurrency(limit=5), cancel_on=[CancelOn(
            event=ISSUE_DELETED, schema=JiraIssueDeleted,
            match="event.issueKey == payload.items[0].issueKey", **within)])


def _edits(*cancel_on: CancelOn) -> Workflow:
    return Workflow(name="edits", payload=Tour, debounce=Debounce(key="rowId", period="1m"),
                    concurrency=Concurrency(limit=5), cancel_on=list(cancel_on))


BATCHED = _batched()
GROUPS = App([EDITS, BATCHED])
DELETED = "cancelOn:jira.issue.deleted"


def _group_sweep(event_at_ms: int = T) -> CancelSweep:
    return CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(),
                       event_at_ms=event_at_ms, source="ev:0:9", workflows=["edits", "batched"])


def _group(workflow: str, payload: object, arrived_at_ms: int, hop: int = 1,
           n: int = 0, execution_id: str | None = None) -> PendingStart:
    """A group as defer lets it go (`hop` 1, defer's), its first arrival `arrived_at_ms`."""
    execution_id = execution_id or f"{workflow}-{n}"
    return PendingStart(
        execution_id=execution_id, workflow=workflow, payload=json.dumps(payload).encode(),
        origin=Origin.event, kind=AdmittedKind.start, declaration_version="v", hop=hop,
        request_id=f"req-{execution_id}", request_ids=[f"req-{execution_id}"],
        requested_at_ms=arrived_at_ms, arrived_at_ms=arrived_at_ms, priority=0.0, slots=[])


def _row(issue: str) -> dict[str, str]:
    return {"rowId": "r", "issueKey": issue}


def _items(*issues: str) -> dict[str, list[dict[str, str]]]:
    return {"items": [_row(issue) for issue in issues]}


def test_a_debounced_group_is_judged_by_its_latest_arrival_not_its_first() -> None:
    group = _group("edits", _row("K1"), T - 5_000)
    assert group_reason(GROUPS, _group_sweep(), group, Group.debounced(T)) == DELETED
    assert group_reason(GROUPS, _group_sweep(), group, Group.debounced(T + 1)) is None, (
        "its latest edit, the payload that runs, came after the event")
    other = _group("edits", _row("K2"), T - 5_000)
    assert group_reason(GROUPS, _group_sweep(), other, Group.debounced(T - 1)) is None


def test_within_is_measured_from_a_debounced_groups_latest_arrival() -> None:
    apps = App([_edits(CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                                match="event.issueKey == payload.issueKey", within="1m"))])
    group = _group("edits", _row("K1"), T - 3_600_000)
    assert group_reason(apps, _group_sweep(), group, Group.debounced(T - 60_000)) == DELETED
    assert group_reason(apps, _group_sweep(), group, Group.debounced(T - 60_001)) is None


def test_a_batch_run_is_discarded_only_when_each_of_its_items_would_be_alone() -> None:
    sweep = _group_sweep()
    every = Group.batched([T - 5, T - 1])
    assert group_reason(GROUPS, sweep, _group("batched", _items("K1", "K1"), T - 5),
                        every) == DELETED
    # K2 would run had defer judged the items: the run goes on, K1 with it.
    assert group_reason(GROUPS, sweep, _group("batched", _items("K1", "K2"), T - 5),
                        every) is None
    assert group_reason(GROUPS, sweep, _group("batched", _items("K2", "K1"), T - 5),
                        every) is None
    # An item that arrived after the event would not be discarded either.
    assert group_reason(GROUPS, sweep, _group("batched", _items("K1", "K1"), T - 5),
                        Group.batched([T - 5, T + 1])) is None


def test_within_must_hold_for_every_item_of_a_batch_run() -> None:
    apps, sweep = App([_batched(within="1m")]), _group_sweep()
    run = _group("batched", _items("K1", "K1"), T - 60_000)
    assert group_reason(apps, sweep, run, Group.batched([T - 60_000, T])) == DELETED
    assert group_reason(apps, sweep, run, Group.batched([T - 60_001, T])) is None


def test_defer_judges_a_held_batch_item_as_the_batch_of_one_it_would_be() -> None:
    item = _group("batched", _row("K1"), T - 5)
    alone = json.dumps(_items("K1")).encode()
    assert group_reason(GROUPS, _group_sweep(), item, Group.batched([T - 5]),
                        payload=alone) == DELETED
    assert group_reason(GROUPS, _group_sweep(), item, Group.batched([T + 5]),
                        payload=alone) is None


def test_every_stage_judges_a_group_defer_let_go_by_defers_rules_and_other_starts_by_arrival(
) -> None:
    router = Router(GROUPS, 0, None)
    sweep = _group_sweep()
    past_defer = _group("edits", _row("K1"), T - 5_000, hop=2)
    assert judge(GROUPS, router, "concurrency", sweep, past_defer,
                 Group.debounced(T + 1)) is None
    assert judge(GROUPS, router, "concurrency", sweep, past_defer,
                 Group.debounced(T)) == DELETED
    # Without the header (a group sent by a version before it): defer's alone.
    assert judge(GROUPS, router, "concurrency", sweep, past_defer, None) is None
    # On its way to defer: an ordinary start, by its own arrival.
    assert judge(GROUPS, router, "defer", sweep, dataclasses.replace(past_defer, hop=1),
                 None) == DELETED


def test_the_group_header_reads_back_and_one_this_version_cannot_read_is_none() -> None:
    for group in (Group.debounced(T), Group.batched([T + 3, T - 2, T])):
        assert Group.of([("other", b"x"), *group.headers()]) == group
    assert Group.batched([T + 3, T - 2, T]) == Group(True, T - 2, T + 3)
    assert Group.of(None) is None
    assert Group.of([("other", b"x")]) is None
    assert Group.of([(GROUP_HEADER, b"not json")]) is None
    assert Group.of([(GROUP_HEADER, b'{"batch":true}')]) is None
    assert group_headers(EDITS, Group.debounced(T)) == Group.debounced(T).headers()
    assert group_headers(_edits(), Group.debounced(T)) is None, (
        "a workflow without cancelOn pays nothing for it")


def _let_go(h: TestDriver, workflow: str, payload: object, first_ms: int,
            group: Group | None, n: int) -> str:
    """A group defer let go for the next hop (concurrency), with the header it gives it."""
    start = _group(workflow, payload, first_ms, n=n)
    h.forward(start, stage="defer", payload=payload,
              headers=group.headers() if group else None)
    return start.execution_id


def test_a_group_defer_let_go_before_it_took_the_sweep_is_judged_on_arrival_by_defers_rules(
) -> None:
    with TestDriver(GROUPS, start_ms=T) as h:
        _at(h, T + 1_000)
        _take(h, _group_sweep())
        stale = _let_go(h, "edits", _row("K1"), T - 5_000, Group.debounced(T - 1), 0)
        fresh = _let_go(h, "edits", _row("K1"), T - 5_000, Group.debounced(T + 1), 1)
        older = _let_go(h, "edits", _row("K1"), T - 5_000, None, 2)
        emptied = _let_go(h, "batched", _items("K1", "K1"), T - 5,
                          Group.batched([T - 5, T - 1]), 3)
        mixed = _let_go(h, "batched", _items("K1", "K2"), T - 5,
                        Group.batched([T - 5, T - 1]), 4)

        assert outcomes(h, stale) == [Outcome.cancelled]
        assert outcomes(h, emptied) == [Outcome.cancelled]
        (row,) = [r for r in h.ledger if r.request_id == f"req-{stale}"]
        assert row.stage == "concurrency"
        assert admitted_ids(h) == [fresh, older, mixed]


def test_a_group_waiting_at_a_later_stage_when_the_sweep_comes_is_judged_by_defers_rules(
) -> None:
    # The deployment cap is a second concurrency hop: the groups take a slot of their
    # own limit, go on to the cap with their header, and wait there.
    with TestDriver(App([EDITS]), Settings(partitions=1, deployment_cap=1),
                    start_ms=T) as h:
        holder = _let_go(h, "edits", _row("K0"), T - 9_000, Group.debounced(T - 9_000), 0)
        stale = _let_go(h, "edits", _row("K1"), T - 5_000, Group.debounced(T - 1), 1)
        fresh = _let_go(h, "edits", _row("K1"), T - 5_000, Group.debounced(T + 1), 2)
        assert admitted_ids(h) == [holder]
        assert outcomes(h, stale) == outcomes(h, fresh) == [Outcome.queued]
        h.commit()
        h.restart()  # the waiting groups' headers come back with the store
        _at(h, T + 1_000)
        _take(h, _sweep())

        assert outcomes(h, stale) == [Outcome.queued, Outcome.cancelled]
        assert outcomes(h, fresh) == [Outcome.queued], (
            "its latest edit came after the event, though its first came before")
        release(h, holder)
        assert admitted_ids(h) == [holder, fresh]


# -- the header goes on with the group through every stage after defer ---------------------

TOURS = Workflow(name="tours", payload=Tour, debounce=Debounce(key="rowId", period="1m"),
                 singleton=Singleton(key="rowId", mode="skip"),
                 throttle=Throttle(limit=1, period="1m"), concurrency=Concurrency(limit=5),
                 cancel_on=EDITS.cancel_on)


_AFTER_DEFER = ("singleton", "throttle", "pause", "concurrency")


def _let_go_tour(h: TestDriver, row: str, group: Group) -> str:
    """A group defer lets go, with the header defer gives it."""
    h.forward(_group("tours", {"rowId": row, "issueKey": "K1"}, T - 5_000, execution_id=row),
              stage="defer", headers=group.headers())
    return row


def _seen(h: TestDriver) -> list[tuple[str, str, Group | None]]:
    """(stage, execution id, group) of every start the stages after defer took."""
    topics = {h.topics.stage(stage): stage for stage in _AFTER_DEFER}
    seen = []
    for written in h.sent():
        if written.topic in topics:
            try:
                start = codec.decode(PendingStart, written.value)
            except codec.DecodeError:
                continue  # a release or a sweep
            seen.append((topics[written.topic], start.execution_id, Group.of(written.headers)))
    return seen


def _take_everywhere(h: TestDriver, sweep: CancelSweep) -> None:
    """The sweep the correlator sent every queue stage."""
    for stage in QUEUE_STAGES:
        h.pipe(h.topics.stage(stage), sweep, sweep.source)


def test_the_group_header_goes_on_through_every_stage_after_defer_queued_or_not(
) -> None:
    with TestDriver(App([TOURS]), start_ms=T - 200_000) as h:
        kept, discarded = Group.debounced(T + 1), Group.debounced(T - 1)
        straight = _let_go_tour(h, "r1", kept)  # singleton, a free throttle turn, a slot
        waits = _let_go_tour(h, "r2", kept)  # waits for its throttle turn
        stale = _let_go_tour(h, "r3", discarded)  # waits behind it
        assert admitted_ids(h) == [straight]
        h.pause("tours")
        h.advance(120_000)  # both turns come while paused: both wait at pause
        _at(h, T + 1_000)
        _take_everywhere(h, CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(),
                           event_at_ms=T, source="ev:0:1", workflows=["tours"]))
        h.unpause("tours")

        stages = ["singleton", "throttle", "pause", "concurrency"]
        seen = _seen(h)
        assert [(stage, group) for stage, ex, group in seen if ex == straight] == [
            ("singleton", kept), ("throttle", kept), ("concurrency", kept)]
        assert [(stage, group) for stage, ex, group in seen if ex == waits] == [
            (stage, kept) for stage in stages]
        assert [(stage, group) for stage, ex, group in seen if ex == stale] == [
            (stage, discarded) for stage in stages[:3]]
        # Both waited at pause when the sweep came, each judged by its latest arrival.
        assert [(r.request_id, r.stage) for r in h.ledger
                if r.outcome is Outcome.cancelled] == [(f"req-{stale}", "pause")]
        assert admitted_ids(h) == [straight, waits]


PACED = Workflow(name="paced", payload=Tour, throttle=[
    Throttle(limit=1, period="1m", key="rowId"), Throttle(limit=1, period="1m")],
    cancel_on=EDITS.cancel_on)


def test_starts_waiting_under_several_throttles_are_discarded_by_a_matching_sweep(
) -> None:
    with TestDriver(App([PACED]), start_ms=T) as h:
        for n, issue in enumerate(("K1", "K1", "K2", "K1")):
            h.forward(_group("paced", {"rowId": f"r{n}", "issueKey": issue}, T - 5_000, hop=0,
                             n=n))
        assert admitted_ids(h) == ["paced-0"]
        _at(h, T + 1_000)
        _take_everywhere(h, CancelSweep(event=ISSUE_DELETED, body=json.dumps(EVENT).encode(),
                           event_at_ms=T, source="ev:0:1", workflows=["paced"]))
        # The two waiting starts of issue K1 are discarded where they wait; K2's goes on.
        cancelled = [(r.request_id, r.stage, r.key) for r in h.ledger
                     if r.outcome is Outcome.cancelled]
        assert cancelled == [("req-paced-1", "throttle", "r1"), ("req-paced-3", "throttle", "r3")]
        h.advance(120_000)
        assert admitted_ids(h) == ["paced-0", "paced-2"]
