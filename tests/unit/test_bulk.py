"""The pure parts of bulk cancel and replay: eligibility by verb, the limit, truncation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.admission.stages.runs import retry_id
from sluicegate.ops.services.bulk import ELIGIBLE, Verb, ineligible, plan, selected
from sluicegate.schemas.records import RunRow, RunStatus


def _row(i: int, status: RunStatus, workflow: str = "w") -> RunRow:
    return RunRow(execution_id=f"e{i:03}", workflow=workflow, status=status, payload=b"{}",
                  declaration_version="v", admitted_at_ms=i, updated_at_ms=i, slots=[],
                  keys={})


def test_cancel_acts_on_live_runs_and_skips_ended_ones_with_the_reason() -> None:
    assert ineligible("cancel", _row(1, RunStatus.running)) is None
    assert ineligible("cancel", _row(1, RunStatus.suspended)) is None
    why = ineligible("cancel", _row(1, RunStatus.completed))
    assert why is not None and why.startswith("the run is completed")


def test_redrive_acts_on_failed_runs_only_and_retry_on_failed_and_cancelled() -> None:
    assert ineligible("redrive", _row(1, RunStatus.failed)) is None
    assert ineligible("redrive", _row(1, RunStatus.cancelled)) is not None
    assert ineligible("retry", _row(1, RunStatus.failed)) is None
    assert ineligible("retry", _row(1, RunStatus.cancelled)) is None
    assert ineligible("retry", _row(1, RunStatus.running)) is not None


def test_more_eligible_runs_than_the_limit_is_reported_as_truncated() -> None:
    rows = [_row(i, RunStatus.running) for i in range(5)]
    chosen, result = plan(rows, "cancel", 3)
    assert [r.execution_id for r in chosen] == ["e000", "e001", "e002"]
    assert (result.truncated, result.eligible) == (True, 5)
    _, exact = plan(rows, "cancel", 5)
    assert not exact.truncated


def test_the_limit_is_required_to_be_positive() -> None:
    with pytest.raises(ValueError, match="no 'all'"):
        plan([], "cancel", 0)


def test_the_result_is_json_serialisable_per_run() -> None:
    rows = [_row(1, RunStatus.running), _row(2, RunStatus.completed)]
    _, result = plan(rows, "cancel", 10)
    data = json.loads(json.dumps(result.to_json()))
    assert data["skipped"][0]["execution_id"] == "e002"
    assert data["truncated"] is False


def test_only_restricts_the_apply_to_the_previewed_runs() -> None:
    rows = [_row(i, RunStatus.failed) for i in range(4)]
    chosen, _ = plan(rows, "redrive", 10, only={"e001", "e003"})
    assert [r.execution_id for r in chosen] == ["e001", "e003"]


def test_selection_filters_by_workflow_and_status() -> None:
    rows = [_row(1, RunStatus.failed, "a"), _row(2, RunStatus.failed, "b"),
            _row(3, RunStatus.cancelled, "a")]
    assert [r.execution_id for r in selected(rows, workflow="a")] == ["e001", "e003"]
    assert [r.execution_id for r in selected(rows, status=RunStatus.failed)] == [
        "e001", "e002"]


def test_a_retry_is_named_after_the_execution_it_retries() -> None:
    assert retry_id("e1") == "retry:e1"


VERBS: list[Verb] = ["cancel", "redrive", "retry"]


@given(statuses=st.lists(st.sampled_from(list(RunStatus)), max_size=30),
       verb=st.sampled_from(VERBS), limit=st.integers(1, 10))
def test_plan_matches_a_simple_model(statuses: list[RunStatus], verb: Verb,
                                     limit: int) -> None:
    rows = [_row(i, s) for i, s in enumerate(statuses)]
    eligible = [r for r in rows if r.status in ELIGIBLE[verb]]
    chosen, result = plan(list(reversed(rows)), verb, limit)
    assert chosen == eligible[:limit]
    assert result.truncated == (len(eligible) > limit)
    assert result.ineligible == len(rows) - len(eligible)
    assert len(result.skipped) == min(limit, result.ineligible)
