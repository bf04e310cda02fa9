"""A rejected start names the request it rejects wherever that can be read, so that a
producer waiting for its request id hears why (docs/decisions/matchable-rejections.md)."""

from __future__ import annotations

from pydantic import BaseModel

from sluicegate.declare import App, Workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Origin, Outcome, Reply, StartRequest
from sluicegate.testing import TestDriver


class Edit(BaseModel):
    rowId: str


APP = App([Workflow(name="narrate", payload=Edit)])


def _request(**changes: object) -> StartRequest:
    fields: dict[str, object] = {
        "request_id": "req-go-1", "workflow": "narrate", "payload": b'{"rowId":"r1"}',
        "origin": Origin.event, "requested_at_ms": 1_000, "reply_partition": 0, "wait": True}
    return StartRequest(**(fields | changes))  # type: ignore[arg-type]


def _rejected(driver: TestDriver) -> tuple[LedgerRecord, list[Reply]]:
    (row,) = driver.ledger
    assert row.outcome is Outcome.rejected
    assert len(driver.dead_letters) == 1
    return row, driver.replies


def test_a_start_of_an_unknown_fingerprint_is_answered_under_its_own_request_id() -> None:
    # A producer that computed another fingerprint (or a newer release's schema): the
    # body still reads as a start request.
    frame = codec.encode(_request())
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, frame[:2] + bytes(8) + frame[10:], "req-go-1")
        row, (reply,) = _rejected(driver)
    assert (row.request_id, row.workflow, row.requested_at_ms) == ("req-go-1", "narrate", 1_000)
    assert row.reason is not None and "unknown schema fingerprint 0000000000000000" in row.reason
    assert "request id, workflow, reply partition read from the record's body" in row.reason
    assert (reply.request_id, reply.outcome, reply.reason) == (
        "req-go-1", Outcome.rejected, row.reason)


def test_a_value_that_is_no_avro_is_named_by_the_producers_headers() -> None:
    headers: list[tuple[str, str | bytes | None]] = [
        ("sluicegate.request_id", b"req-go-2"), ("sluicegate.workflow", b"narrate"),
        ("sluicegate.reply_partition", b"0")]
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, b'{"request_id": "req-go-2"}', "k", headers=headers)
        row, (reply,) = _rejected(driver)
    assert (row.request_id, row.workflow) == ("req-go-2", "narrate")
    assert row.reason is not None and row.reason.startswith("not a start request")
    assert "read from the record's headers" in row.reason
    assert reply.request_id == "req-go-2"


def test_a_start_without_a_value_is_named_by_its_headers_too() -> None:
    headers: list[tuple[str, str | bytes | None]] = [
        ("sluicegate.request_id", "req-go-4"), ("sluicegate.reply_partition", "0")]
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, None, "k", headers=headers)
        row, (reply,) = _rejected(driver)
    assert (row.request_id, row.workflow, reply.request_id) == ("req-go-4", "", "req-go-4")
    assert row.reason == ("empty record: a start request needs a value (request id, reply "
                          "partition read from the record's headers)")


def test_a_damaged_body_gives_what_it_can_and_no_reply_without_a_reply_partition() -> None:
    frame = codec.encode(_request(request_id="req-go-3"))
    with TestDriver(APP) as driver:
        # Cut inside the payload: the request id and the workflow read, the rest does not.
        driver.pipe(driver.topics.starts, frame[:30], "k")
        row, replies = _rejected(driver)
    assert (row.request_id, row.workflow) == ("req-go-3", "narrate")
    assert replies == []


def test_a_record_nothing_can_be_read_of_is_named_by_where_it_was_read() -> None:
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, b"\xc3\x01 not a frame", "k")
        # Another record type's frame: its fields are not a start request's.
        driver.pipe(driver.topics.starts, codec.encode(
            Reply(request_id="not-mine", outcome=Outcome.admitted, decided_at_ms=1)), "k")
        rows = driver.ledger
        assert driver.replies == []
    assert [r.request_id for r in rows] == [
        f"{driver.topics.starts}:0:0", f"{driver.topics.starts}:0:1"]
    assert [r.workflow for r in rows] == ["", ""]


def test_a_start_that_decodes_is_answered_whatever_check_it_fails() -> None:
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, _request(request_id="a", workflow="nope"), "a")
        driver.pipe(driver.topics.starts, _request(request_id="b", payload=b'{"row":1}'), "b")
        replies = {r.request_id: r for r in driver.replies}
        rows = {r.request_id: r for r in driver.ledger}
    assert {k: r.outcome for k, r in replies.items()} == {
        "a": Outcome.rejected, "b": Outcome.rejected}
    assert (rows["a"].workflow, rows["b"].workflow) == ("nope", "narrate")
    assert "unknown workflow 'nope'" in (replies["a"].reason or "")
    assert "payload does not validate" in (replies["b"].reason or "")


def test_a_reply_partition_that_does_not_exist_is_rejected_without_an_answer() -> None:
    with TestDriver(APP) as driver:
        driver.pipe(driver.topics.starts, _request(request_id="c", reply_partition=7), "c")
        (row,) = driver.ledger
        assert driver.replies == []
        assert driver.admitted == []
    assert (row.request_id, row.outcome) == ("c", Outcome.rejected)
    assert row.reason == f"reply_partition 7 is not a partition of {driver.topics.replies} (0 to 0)"
