"""The singleton control: one active run per key; `skip` stands the newcomer down, `cancel`
evicts the incumbent once the replacement is admitted."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from sluicegate.admission.stages.singleton import (
    HOLDS,
    Cancel,
    Claim,
    Hold,
    Mode,
    Skip,
    admitted,
    arrive,
    hold_key,
    holder,
    released,
)
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    CommandKind,
    Origin,
    Outcome,
    PendingStart,
    Record,
    Release,
    ReleaseKind,
    Slot,
)
from sluicegate.testing import TestDriver
from tests.apps.singleton import app as singleton_app

# -- the pure core -------------------------------------------------------------------


def test_skip_the_first_start_takes_the_key_and_the_next_is_told_who_holds_it() -> None:
    hold, first = arrive(Hold(), "ex-1", "skip", admitted_now=False)
    assert first is None
    hold, second = arrive(hold, "ex-2", "skip", admitted_now=True)
    assert second == Skip("ex-1")
    assert hold.holder is not None and hold.holder.execution_id == "ex-1"


def test_skip_a_run_that_ends_frees_the_key_for_the_next_start() -> None:
    hold, _ = arrive(Hold(), "ex-1", "skip", admitted_now=True)
    hold = released(hold, "ex-1")
    assert hold.empty
    hold, decision = arrive(hold, "ex-2", "skip", admitted_now=True)
    assert decision is None
    assert hold.holder is not None and hold.holder.execution_id == "ex-2"


def test_a_release_of_a_run_that_does_not_hold_the_key_changes_nothing() -> None:
    hold, _ = arrive(Hold(), "ex-1", "skip", admitted_now=True)
    assert released(hold, "ex-other") == hold


def test_cancel_a_replacement_admitted_at_once_evicts_the_incumbent_in_the_same_decision() -> None:
    hold, _ = arrive(Hold(), "ex-1", "cancel", admitted_now=True)
    hold, decision = arrive(hold, "ex-2", "cancel", admitted_now=True)
    assert decision == Cancel("ex-1", replaced_by="ex-2")
    assert hold.holder == Claim("ex-2", 1)
    assert hold.claims == ()


def test_cancel_a_queued_replacement_leaves_the_incumbent_running_until_it_is_admitted() -> None:
    hold, _ = arrive(Hold(), "ex-1", "cancel", admitted_now=True)
    hold, decision = arrive(hold, "ex-2", "cancel", admitted_now=False)
    assert decision is None
    assert hold.holder == Claim("ex-1", 0)
    hold, cancel = admitted(hold, "ex-2")
    assert cancel == Cancel("ex-1", replaced_by="ex-2")
    assert hold.holder == Claim("ex-2", 1)


def test_cancel_the_latest_replacement_wins_whatever_order_admissions_are_reported_in() -> None:
    hold, _ = arrive(Hold(), "ex-1", "cancel", admitted_now=True)
    hold, _ = arrive(hold, "ex-2", "cancel", admitted_now=False)
    hold, _ = arrive(hold, "ex-3", "cancel", admitted_now=False)
    hold, first = admitted(hold, "ex-3")
    assert first == Cancel("ex-1", replaced_by="ex-3")
    hold, second = admitted(hold, "ex-2")
    assert second == Cancel("ex-2", replaced_by="ex-3")
    assert hold.holder == Claim("ex-3", 2)
    assert hold.claims == ()


def test_an_admission_report_of_a_run_that_is_not_waiting_changes_nothing() -> None:
    hold, _ = arrive(Hold(), "ex-1", "skip", admitted_now=False)
    assert admitted(hold, "ex-1") == (hold, None)


ROW = HOLDS.value


def _round_trips(hold: Hold) -> bool:
    old = ROW.legacy_encode(hold)  # type: ignore[attr-defined]
    return ROW.decode(ROW.encode(hold)) == hold == ROW.decode(old)


def test_holds_round_trip_through_their_bytes_and_the_text_rows_of_the_release_before() -> None:
    assert _round_trips(Hold(Claim("ex-1", 3), (Claim("ex-2", 4), Claim("ex-3", 5)), 6))
    assert _round_trips(Hold())
    assert _round_trips(Hold(None, (Claim("ex-2", 4),), 5))


def test_a_hold_row_written_by_an_earlier_release_is_still_read() -> None:
    """Rows in a store, or in its changelog, from before typed tables: the text row, and
    the JSON before it (docs/decisions/singleton-hold-row.md), read as they were written."""
    assert ROW.decode(b'{"holder":["ex-1",3],"claims":[["ex-2",4]],"next":5}') == Hold(
        Claim("ex-1", 3), (Claim("ex-2", 4),), 5)
    assert ROW.decode(b'{"holder":null,"claims":[],"next":2}') == Hold(None, (), 2)
    assert ROW.decode(b"4\x1f3\x1fex-1") == Hold(Claim("ex-1", 3), (), 4)
    # The rows of this release are neither: their first byte is the layout's, 0x01.
    assert ROW.encode(Hold(Claim("ex-1", 3), (), 4))[:1] == b"\x01"


# -- the property: against a reference model ------------------------------------------


class SingletonMachine(RuleBasedStateMachine):
    """A run is *live* from passing (skip) or admission (cancel) until its release; a live
    run that was sent a cancel is on its way out. Never two live runs that were not told
    to stop; skips name the one there is; cancels name the run being replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = Hold()
        self.mode: Mode = "skip"
        self.arrivals = 0
        self.seq: dict[str, int] = {}
        self.waiting: set[str] = set()
        self.live: set[str] = set()
        self.told_to_stop: set[str] = set()

    @initialize(mode=st.sampled_from(["skip", "cancel"]))
    def choose_mode(self, mode: Mode) -> None:
        self.mode = mode

    def expected_holder(self) -> str | None:
        holders = self.live - self.told_to_stop
        assert len(holders) <= 1, f"two holders: {holders}"
        return next(iter(holders), None)

    def model_admit(self, execution_id: str) -> Cancel | None:
        self.waiting.discard(execution_id)
        incumbent = self.expected_holder()
        self.live.add(execution_id)
        if incumbent is None:
            return None
        if self.seq[incumbent] > self.seq[execution_id]:
            self.told_to_stop.add(execution_id)
            return Cancel(execution_id, incumbent)
        self.told_to_stop.add(incumbent)
        return Cancel(incumbent, execution_id)

    @rule(admitted_now=st.booleans())
    def a_start_arrives(self, admitted_now: bool) -> None:
        execution_id = f"ex-{self.arrivals}"
        self.arrivals += 1
        incumbent = self.expected_holder()
        self.hold, decision = arrive(self.hold, execution_id, self.mode, admitted_now)
        self.seq[execution_id] = self.arrivals
        if self.mode == "skip":
            if incumbent is not None:
                assert decision == Skip(incumbent)
                return
            assert decision is None
            self.live.add(execution_id)
            return
        assert not isinstance(decision, Skip)
        if admitted_now:
            assert decision == self.model_admit(execution_id)
        else:
            assert decision is None
            self.waiting.add(execution_id)

    @precondition(lambda self: self.waiting)
    @rule(data=st.data())
    def a_waiting_replacement_is_admitted(self, data: st.DataObject) -> None:
        execution_id = data.draw(st.sampled_from(sorted(self.waiting)))
        self.hold, cancel = admitted(self.hold, execution_id)
        assert cancel == self.model_admit(execution_id)

    @precondition(lambda self: self.arrivals)
    @rule(data=st.data())
    def an_admission_is_reported_again(self, data: st.DataObject) -> None:
        execution_id = f"ex-{data.draw(st.integers(0, self.arrivals - 1))}"
        if execution_id in self.waiting:
            return
        before = self.hold
        assert admitted(self.hold, execution_id) == (before, None)

    @precondition(lambda self: self.arrivals)
    @rule(data=st.data())
    def a_run_ends(self, data: st.DataObject) -> None:
        # Any run, holder or not, and a waiting one too (its start failed in a queue).
        execution_id = f"ex-{data.draw(st.integers(0, self.arrivals))}"
        self.hold = released(self.hold, execution_id)
        self.live.discard(execution_id)
        self.waiting.discard(execution_id)

    @invariant()
    def the_hold_names_the_one_live_run(self) -> None:
        expected = self.expected_holder()
        got = self.hold.holder.execution_id if self.hold.holder is not None else None
        assert got == expected
        assert {c.execution_id for c in self.hold.claims} == self.waiting

    @invariant()
    def survives_its_bytes(self) -> None:
        assert _round_trips(self.hold)


TestSingletonModel = SingletonMachine.TestCase


# -- the stage in the test driver: starts come in as the hop before lets them go ---------


@pytest.fixture
def driver() -> Iterator[TestDriver]:
    with TestDriver(singleton_app, start_ms=1000) as d:
        yield d


def feed(d: TestDriver, key: str, value: Record | bytes) -> None:
    d.pipe(d.topics.stage("singleton"), value, key)


def start(d: TestDriver, workflow: str, execution_id: str, site: str = "s1") -> None:
    feed(d, hold_key(workflow, site), PendingStart(
        execution_id=execution_id, workflow=workflow,
        payload=codec.dump_payload({"siteId": site}),
        origin=Origin.event, kind=AdmittedKind.start, declaration_version="v", hop=1,
        request_id=f"r-{execution_id}", request_ids=[f"r-{execution_id}"],
        requested_at_ms=0, arrived_at_ms=0, priority=0.0, slots=[],
        reply_partition=None))


def release(d: TestDriver, workflow: str, execution_id: str, kind: ReleaseKind,
            site: str = "s1") -> None:
    key = hold_key(workflow, site)
    feed(d, key, Release(stage="singleton", key=key, execution_id=execution_id,
                         workflow=workflow, kind=kind, at_ms=1000))


def held_by(d: TestDriver, workflow: str, site: str) -> str | None:
    return holder(d.store("singleton"), workflow, site)


def test_a_start_that_passes_carries_a_hold_on_its_key_into_admission(driver: TestDriver) -> None:
    start(driver, "rebuildSearch", "ex-1")
    (admitted_start,) = driver.admitted
    assert admitted_start.slots == [Slot("singleton", hold_key("rebuildSearch", "s1"))]
    assert held_by(driver, "rebuildSearch", "s1") == "ex-1"
    assert held_by(driver, "rebuildSearch", "s2") is None


def test_a_skipped_start_is_a_ledger_row_naming_the_incumbent(driver: TestDriver) -> None:
    start(driver, "rebuildSearch", "ex-1")
    start(driver, "rebuildSearch", "ex-2")
    skipped = [r for r in driver.ledger
               if r.outcome is Outcome.skipped]
    assert [(r.request_id, r.execution_id, r.key) for r in skipped] == [("r-ex-2", "ex-1", "s1")]
    assert "held by run ex-1" in (skipped[0].reason or "")
    assert len(driver.admitted) == 1


def test_a_suspended_run_keeps_the_key_and_an_ended_one_gives_it_back(driver: TestDriver) -> None:
    start(driver, "rebuildSearch", "ex-1")
    release(driver, "rebuildSearch", "ex-1", ReleaseKind.suspended)
    assert held_by(driver, "rebuildSearch", "s1") == "ex-1"
    release(driver, "rebuildSearch", "ex-1", ReleaseKind.ended)
    assert held_by(driver, "rebuildSearch", "s1") is None
    start(driver, "rebuildSearch", "ex-2")
    assert held_by(driver, "rebuildSearch", "s1") == "ex-2"


def test_cancel_with_no_control_after_it_evicts_the_incumbent_as_the_newcomer_is_admitted(
        driver: TestDriver) -> None:
    start(driver, "latestOnly", "ex-1")
    start(driver, "latestOnly", "ex-2")
    (command,) = driver.commands
    assert (command.execution_id, command.kind) == ("ex-1", CommandKind.cancel)
    assert command.command_id == "singleton:ex-1:ex-2"
    assert "replaced by run ex-2" in (command.reason or "")
    assert [a.execution_id for a in driver.admitted] == [
        "ex-1", "ex-2"]


def test_cancel_behind_a_queueing_control_waits_for_the_admission_report(
        driver: TestDriver) -> None:
    start(driver, "spacedLatest", "ex-1")  # admitted: a throttle turn is free
    start(driver, "spacedLatest", "ex-2")  # waits 10 s for the next turn
    assert driver.commands == []
    assert held_by(driver, "spacedLatest", "s1") == "ex-1"
    driver.advance(10_000)  # its turn: admitted, and the runs stage reports it here
    (command,) = driver.commands
    assert command.execution_id == "ex-1"
    assert held_by(driver, "spacedLatest", "s1") == "ex-2"


def test_a_record_that_is_not_a_singleton_message_is_dead_lettered(driver: TestDriver) -> None:
    feed(driver, "k", b"\x00nonsense")
    (row,) = driver.ledger
    assert row.outcome is Outcome.rejected
    assert len(driver.dead_letters) == 1
