"""Names an operator types are checked against the known ones, with a did-you-mean."""

from __future__ import annotations

import pytest

from sluicegate.ops.services.ledger import LedgerDb, fill
from sluicegate.ops.services.names import UnknownName, check_workflow, seen_workflows
from sluicegate.schemas.records import ControlRow, LedgerRecord, Outcome

KNOWN = {"generateReport", "sendReceipt", "indexDocument"}


def test_a_known_workflow_passes() -> None:
    check_workflow("generateReport", KNOWN)


def test_a_typo_is_refused_with_the_nearest_name() -> None:
    with pytest.raises(UnknownName) as raised:
        check_workflow("generateReprot", KNOWN, where="declared in examples.demo")
    assert str(raised.value) == ("no workflow 'generateReprot' declared in examples.demo; "
                                 "did you mean 'generateReport'?")
    assert raised.value.suggestions == ["generateReport"]
    assert isinstance(raised.value, ValueError)


def test_a_name_near_nothing_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName, match=r"no workflow 'nosuch' \(known: generateReport, "
                                          r"indexDocument, sendReceipt\)"):
        check_workflow("nosuch", KNOWN)


def test_nothing_known_says_so() -> None:
    with pytest.raises(UnknownName, match=r"^no pool 'x'; there is no pool at all yet$"):
        check_workflow("x", set(), what="pool")


def test_seen_workflows_are_the_ledgers_the_runs_and_the_control_rows() -> None:
    with LedgerDb(":memory:") as db:
        fill(db, [LedgerRecord(request_id="r1", workflow="fromLedger", outcome=Outcome.admitted,
                               requested_at_ms=1, decided_at_ms=1)])
        control = {"paused": ControlRow(workflow="paused", paused=True, at_ms=1)}
        assert seen_workflows(db, [], control) == {"fromLedger", "paused"}
