"""The pure parts of the cancelOn correlator: the window, the match, decoding."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.declare import App, CancelOn, Workflow
from sluicegate.schemas.records import CancelSweep
from sluicegate.streams.stages.cancelon import (
    cancel_reason,
    decode_for,
    in_window,
    queued_reason,
)
from tests.apps.operations import ISSUE_DELETED, JiraIssueDeleted, Tour, app, tour

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
