"""The identity stage's pure core: a spent key answers with the first run, for good or
until its ttl runs out after the run ended."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from sluicegate.admission.stages.identity import SPENT, IdentityRow, Spent, decide, ended
from sluicegate.declare import App, Idempotency, Workflow
from sluicegate.schemas.records import Origin, StartRequest
from sluicegate.topology.keys import identity_key


class Paid(BaseModel):
    orderId: str
    customer: str | None = None


def _start(origin: Origin = Origin.event, idempotency_id: str | None = None) -> StartRequest:
    return StartRequest(request_id="r1", workflow="w", payload=b"{}", origin=origin,
                        requested_at_ms=0, idempotency_id=idempotency_id)


def test_a_fresh_key_is_taken_by_the_first_request() -> None:
    decision = decide(None, "ex-1", "r1", now_ms=10)
    assert not isinstance(decision, Spent)
    assert decision.row == IdentityRow("ex-1", "r1", None)


def test_a_spent_key_answers_with_the_first_execution_forever_by_default() -> None:
    row = IdentityRow("ex-1", "r1", None)
    assert decide(row, "ex-2", "r2", now_ms=10**15) == Spent("ex-1")


def test_a_ttl_key_is_free_again_once_its_time_after_the_end_has_passed() -> None:
    row = ended(IdentityRow("ex-1", "r1"), "ex-1", ended_at_ms=1000, ttl_ms=500)
    assert row.expires_at_ms == 1500
    assert decide(row, "ex-2", "r2", now_ms=1499) == Spent("ex-1")
    assert not isinstance(decide(row, "ex-2", "r2", now_ms=1500), Spent)


def test_only_the_end_of_the_run_that_holds_the_key_starts_its_countdown() -> None:
    row = IdentityRow("ex-1", "r1")
    assert ended(row, "ex-other", ended_at_ms=1000, ttl_ms=500) == row


@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**60) | st.none())
def test_rows_round_trip_through_their_bytes(execution_id: str, request_id: str,
                                             expires: int | None) -> None:
    codec = SPENT.value
    row = IdentityRow(execution_id, request_id, expires)
    assert codec.decode(codec.encode(row)) == row
    # As the releases before wrote it (text joined by 0x1f), read back the same, for ids
    # such as they made (no 0x1f in them, and none starting with the layout byte 0x01).
    old = IdentityRow(execution_id.replace("\x1f", "").lstrip("\x01"),
                      request_id.replace("\x1f", ""), expires)
    assert codec.decode(codec.legacy_encode(old)) == old  # type: ignore[attr-defined]


def _wf() -> Workflow:
    wf = Workflow(name="w", payload=Paid, idempotency=Idempotency(key="orderId"))
    App([wf])
    return wf


def test_the_key_expression_names_an_event_start() -> None:
    assert identity_key(_wf(), _start(), {"orderId": "o1"}) == "o1"


def test_a_direct_start_dedupes_by_its_explicit_id_not_the_expression() -> None:
    wf = _wf()
    assert identity_key(wf, _start(Origin.direct), {"orderId": "o1"}) is None
    assert identity_key(wf, _start(Origin.direct, "job-7"), {"orderId": "o1"}) == "job-7"


def test_no_key_and_no_explicit_id_means_no_identity_state() -> None:
    wf = Workflow(name="plain", payload=Paid)
    App([wf])
    assert identity_key(wf, _start(), {"orderId": "o1"}) is None
