"""The throttle: its GCRA core against a textbook reference, and the stage's queue, turns,
expiries and removed workflows in the test driver (no broker)."""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from collections.abc import Iterator
from fractions import Fraction
from itertools import pairwise
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sluicegate.admission.pending import COUNTED
from sluicegate.admission.stages.throttle import (
    REMOVED,
    Pace,
    Rate,
    due_ms,
    forget_ms,
    take,
)
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    AdmittedStart,
    LedgerRecord,
    Origin,
    Outcome,
    PendingStart,
    Record,
)
from sluicegate.testing import TestDriver
from sluicegate.topology.route import route_for
from tests.apps import rates

T = TypeVar("T", bound=Record)

# -- the reference -------------------------------------------------------------------


def reference_gcra(limit: int, period_ms: int, burst: int, arrivals: list[int]) -> list[int]:
    """Textbook GCRA (virtual scheduling) in exact rational time, FIFO, none dropped.

    Time is a grid of instants 1/limit ms apart; a start arriving at millisecond t is
    presented from the first instant of t, (t - 1) + 1/limit, and then at every instant
    until it conforms (x >= TAT - tau); admitting it at x sets TAT = max(TAT, x) + T. It
    is admitted at millisecond ceil(x). Returns each arrival's admission millisecond.
    """
    interval = Fraction(period_ms, limit)
    tau = burst * interval
    step = Fraction(1, limit)
    tat: Fraction | None = None
    queue: deque[int] = deque()
    out: dict[int, int] = {}
    pending = deque(sorted(enumerate(arrivals), key=lambda pair: pair[1]))
    x = Fraction(0)
    while pending or queue:
        if not queue:
            x = max(x, pending[0][1] - 1 + step)
        while pending and pending[0][1] - 1 + step <= x:
            queue.append(pending.popleft()[0])
        if tat is not None and x < tat - tau:
            # The next grid instant at which the head conforms, or an arrival before it.
            conforms = math.ceil((tat - tau) / step) * step
            x = min(conforms, pending[0][1] - 1 + step) if pending else conforms
            continue
        out[queue.popleft()] = math.ceil(x)
        tat = (x if tat is None else max(tat, x)) + interval
    return [out[i] for i in range(len(arrivals))]


def drive(rate: Rate, arrivals: list[int], late_by: list[int] | None = None
          ) -> tuple[list[int], dict[int, int]]:
    """Run the core the way the stage does: at each arrival, and whenever the key's turn
    timer fires (at the head's due time, `late_by` ms late when given). Returns each
    arrival's admission ms and the due time promised when it was queued."""
    lateness = deque(late_by or [])
    pace = Pace()
    queue: deque[int] = deque()
    admitted: dict[int, int] = {}
    promised: dict[int, int] = {}
    pending = deque(enumerate(arrivals))
    while pending or queue:
        turn = due_ms(pace, rate) + (lateness.popleft() if lateness else 0) if queue else None
        now = min(t for t in (pending[0][1] if pending else None, turn) if t is not None)
        drained = 0
        while queue and (taken := take(pace, rate, now)) is not None:
            pace = taken
            admitted[queue.popleft()] = now
            drained += 1
        if turn is not None and now >= turn:
            assert drained, "the turn timer fired before the head's turn"
        while pending and pending[0][1] == now:
            i, _ = pending.popleft()
            if not queue and (taken := take(pace, rate, now)) is not None:
                pace = taken
                admitted[i] = now
            else:
                promised[i] = due_ms(pace, rate, len(queue))
                queue.append(i)
    return [admitted[i] for i in range(len(arrivals))], promised


# -- the core ------------------------------------------------------------------------

limits = st.integers(min_value=1, max_value=5)
periods = st.integers(min_value=1, max_value=40)
bursts = st.integers(min_value=0, max_value=4)
arrival_times = st.lists(st.integers(min_value=1, max_value=120), max_size=40).map(sorted)


@given(limits, periods, bursts, arrival_times)
def test_admissions_follow_the_textbook_gcra_exactly(
        limit: int, period: int, burst: int, arrivals: list[int]) -> None:
    admitted, _ = drive(Rate(limit, period, burst), arrivals)
    assert admitted == reference_gcra(limit, period, burst, arrivals)


@given(limits, periods, bursts, arrival_times)
def test_a_queued_start_is_admitted_at_the_time_its_queued_row_promised(
        limit: int, period: int, burst: int, arrivals: list[int]) -> None:
    admitted, promised = drive(Rate(limit, period, burst), arrivals)
    for i, due in promised.items():
        assert admitted[i] == due


@given(limits, periods, arrival_times, st.lists(st.integers(min_value=0, max_value=30)))
def test_with_no_burst_no_window_of_period_holds_more_than_limit_even_with_late_timers(
        limit: int, period: int, arrivals: list[int], late: list[int]) -> None:
    admitted, _ = drive(Rate(limit, period, 0), arrivals, late_by=late)
    # Every start ran, in arrival order, never before it arrived.
    assert all(a >= t for a, t in zip(admitted, arrivals, strict=True))
    assert admitted == sorted(admitted)
    for i in range(len(admitted) - limit):
        assert admitted[i + limit] - admitted[i] >= period


def test_sixty_a_minute_with_burst_ten_lets_eleven_go_then_one_a_second() -> None:
    admitted, promised = drive(Rate(60, 60_000, 10), [0] * 20)
    assert admitted == [0] * 11 + [1000 * k for k in range(1, 10)]
    assert promised == {10 + k: 1000 * k for k in range(1, 10)}


def test_after_a_quiet_time_the_burst_is_back() -> None:
    arrivals = [0] * 12 + [60_000] * 12
    admitted, _ = drive(Rate(60, 60_000, 10), arrivals)
    assert admitted[12:] == [60_000] * 11 + [61_000]


def test_a_fast_limit_is_not_rounded_to_one_a_millisecond() -> None:
    admitted, _ = drive(Rate(100_000, 1000, 0), [5] * 250)
    assert Counter(admitted) == {5: 100, 6: 100, 7: 50}


def test_an_interval_of_a_fraction_of_a_millisecond_keeps_the_exact_rate() -> None:
    # 7 a second is one each 142.857 ms: seven a second, not seven every 1001 ms.
    admitted, _ = drive(Rate(7, 1000, 0), [1] * 15)
    assert admitted == reference_gcra(7, 1000, 0, [1] * 15)
    assert admitted[7] - admitted[0] == 1000
    assert admitted[14] - admitted[7] == 1000


def test_a_redeclared_limit_rescales_the_pace() -> None:
    pace = take(Pace(), Rate(60, 60_000), 1000)
    assert pace is not None
    # The next turn is where the old rate put it; the new interval counts from there.
    assert [due_ms(pace, Rate(60, 60_000), p) for p in (0, 1)] == [2000, 3000]
    assert [due_ms(pace, Rate(120, 60_000), p) for p in (0, 1)] == [2000, 2500]


@given(limits, periods, bursts, arrival_times, st.integers(min_value=0, max_value=200))
def test_a_key_past_its_forget_time_behaves_as_a_fresh_one(
        limit: int, period: int, burst: int, arrivals: list[int], later: int) -> None:
    rate = Rate(limit, period, burst)
    pace = Pace()
    for now in arrivals:
        pace = take(pace, rate, now) or pace
    forget = forget_ms(pace, rate)
    if forget is None:
        return
    assert take(pace, rate, forget + later) == take(Pace(), rate, forget + later)


class ThrottleKey(RuleBasedStateMachine):
    """One key, starts arriving and time passing in any pattern; the stage's way of
    working (admit or queue on arrival, drain on the turn timer) stays the textbook GCRA."""

    @initialize(limit=limits, period=periods, burst=bursts)
    def setup(self, limit: int, period: int, burst: int) -> None:
        self.rate = Rate(limit, period, burst)
        self.now = 1
        self.pace = Pace()
        self.queue: deque[int] = deque()
        self.arrivals: list[int] = []
        self.admitted: dict[int, int] = {}

    def _drain_until(self, end: int) -> None:
        # Every turn timer due up to `end` fires at its due time.
        while self.queue and (turn := due_ms(self.pace, self.rate)) <= end:
            while self.queue and (taken := take(self.pace, self.rate, turn)) is not None:
                self.pace = taken
                self.admitted[self.queue.popleft()] = turn

    @rule(ms=st.integers(min_value=0, max_value=25))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self._drain_until(self.now)

    @rule(count=st.integers(min_value=1, max_value=4))
    def starts_arrive(self, count: int) -> None:
        self._drain_until(self.now)
        for _ in range(count):
            i = len(self.arrivals)
            self.arrivals.append(self.now)
            if not self.queue and (taken := take(self.pace, self.rate, self.now)) is not None:
                self.pace = taken
                self.admitted[i] = self.now
            else:
                self.queue.append(i)

    @invariant()
    def every_admission_so_far_is_the_references(self) -> None:
        expected = reference_gcra(self.rate.limit, self.rate.period_ms, self.rate.burst,
                                  self.arrivals)
        for i, at in self.admitted.items():
            assert at == expected[i]
        for i in self.queue:
            assert expected[i] > self.now


TestThrottleKey = ThrottleKey.TestCase
TestThrottleKey.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


# -- the stage in the test driver: starts come in as the hop before lets them go ---------

# The onFailure workflow of syncCrm and callPartner: its runs are not the throttle's.
HANDLER = "throttleFailed"


@pytest.fixture
def harness() -> Iterator[TestDriver]:
    with TestDriver(rates.app) as d:
        yield d


def start(d: TestDriver, workflow: str, user: str = "u1", urgent: bool = False,
          request_id: str | None = None) -> str:
    request_id = request_id or f"r{len(d.sent())}-{d.now_ms}"
    payload = json.dumps({"userId": user, "imageId": "i", "urgent": urgent}).encode()
    pending = PendingStart(
        execution_id=f"x-{request_id}", workflow=workflow, payload=payload,
        origin=Origin.event, kind=AdmittedKind.start, declaration_version="v", hop=1,
        request_id=request_id, request_ids=[request_id], requested_at_ms=d.now_ms,
        arrived_at_ms=d.now_ms, priority=100.0 if urgent else 0.0, slots=[],
        on_failure=HANDLER if workflow == "syncCrm" else None)
    budget = "pool:partner" if workflow.startswith("partner") else workflow
    key = f"{budget}\x1f{user if workflow != 'pushPartner' else ''}"
    router = d.pipeline.router
    wf = router.app.workflows[workflow]
    if len(wf.throttle) > 1:
        # Keyed as the route says: by the workflow alone under several throttles.
        (hop,) = (h for h in router.routes[workflow].hops if h.stage == "throttle")
        key = router.key_for(wf, hop, json.loads(payload))
    d.pipe(d.topics.stage("throttle"), pending, key)
    return request_id


def ledger(d: TestDriver) -> list[LedgerRecord]:
    """The throttled workflows' ledger rows (not those of their onFailure runs)."""
    return [r for r in d.ledger if r.workflow != HANDLER]


def admissions(d: TestDriver) -> list[AdmittedStart]:
    return [a for a in d.admitted if a.workflow != HANDLER]


def stored(d: TestDriver, prefix: bytes) -> list[bytes]:
    return [k for k, _ in d.store("throttle").items(prefix)]


def test_a_start_ranked_far_from_the_head_is_told_so_rather_than_given_a_slot(
        harness: TestDriver) -> None:
    """Past COUNTED starts ahead of it, its place is not counted: no position, no slot
    time, and a reason that says why (docs/decisions/queue-position-bound.md)."""
    start(harness, "syncCrm")
    for _ in range(COUNTED + 5):
        start(harness, "syncCrm", urgent=True)
    start(harness, "syncCrm")
    late = start(harness, "syncCrm", urgent=True)  # behind every urgent one, ahead of one
    row = [r for r in ledger(harness) if r.outcome is Outcome.queued][-1]
    assert (row.request_id, row.position, row.due_at_ms) == (late, None, None)
    assert row.reason == (f"throttle: more than {COUNTED} starts of key 'u1' wait ahead of "
                          "it; its slot comes after theirs")


def test_urgent_starts_leave_the_queue_first_and_equals_in_arrival_order(
        harness: TestDriver) -> None:
    t0 = harness.now_ms
    first = start(harness, "syncCrm")
    plain = [start(harness, "syncCrm") for _ in range(2)]
    urgent = start(harness, "syncCrm", urgent=True)
    queued = [r for r in ledger(harness) if r.outcome is Outcome.queued]
    assert [(r.request_id, r.position, r.due_at_ms, r.deferral, r.key) for r in queued] == [
        (plain[0], 0, t0 + 5000, "throttle", "u1"), (plain[1], 1, t0 + 10_000, "throttle", "u1"),
        (urgent, 0, t0 + 5000, "throttle", "u1")]
    harness.advance(5000)
    harness.advance(5000)
    assert [(a.execution_id, a.admitted_at_ms) for a in admissions(harness)] == [
        (f"x-{first}", t0), (f"x-{urgent}", t0 + 5000), (f"x-{plain[0]}", t0 + 10_000)]


def test_a_start_that_waits_past_timeouts_start_expires_into_its_on_failure_workflow(
        harness: TestDriver) -> None:
    t0 = harness.now_ms
    for _ in range(3):
        start(harness, "syncCrm")
    late = start(harness, "syncCrm")  # its turn would be at 15 s, past the 12 s it may wait
    harness.advance(11_999)
    assert [r.outcome for r in ledger(harness)] == [
        Outcome.admitted, Outcome.queued, Outcome.queued, Outcome.queued,
        Outcome.admitted, Outcome.admitted]
    harness.advance(1)
    expired = ledger(harness)[-1]
    assert (expired.request_id, expired.outcome, expired.key) == (late, Outcome.expired, "u1")
    assert expired.decided_at_ms == t0 + 12_000
    assert "timeouts.start" in (expired.reason or "")
    (report,) = harness.starts
    assert report.workflow == "throttleFailed"
    assert "timeouts.start" in json.loads(report.payload)["reason"]
    # Nobody waits any more: the next turn admits nobody.
    harness.advance(10_000)
    assert len(admissions(harness)) == 3


def test_queued_starts_are_admitted_in_arrival_order_one_each_interval(
        harness: TestDriver) -> None:
    h = harness
    for i in range(11):
        start(h, "resizeImage", request_id=f"a{i}")  # the burst: eleven at once
    start(h, "resizeImage", request_id="slow")
    start(h, "resizeImage", request_id="slower")
    assert len(admissions(h)) == 11
    h.advance(999)
    assert len(admissions(h)) == 11
    h.advance(1)
    h.advance(1000)
    assert [a.execution_id for a in admissions(h)[11:]] == ["x-slow", "x-slower"]
    assert [a.admitted_at_ms for a in admissions(h)[11:]] == [h.now_ms - 1000, h.now_ms]


def test_over_max_queued_a_start_is_dropped_as_queue_full_with_when_a_place_frees(
        harness: TestDriver) -> None:
    for _ in range(4):
        start(harness, "pushPartner")
    outcomes = [r.outcome for r in ledger(harness)]
    assert outcomes == [Outcome.admitted, Outcome.queued, Outcome.queued, Outcome.dropped]
    dropped = ledger(harness)[-1]
    assert "queue-full" in (dropped.reason or "")
    assert dropped.retry_after_ms == 3_600_000


def test_starts_of_a_workflow_removed_from_the_declarations_fail_when_a_worker_loads_them(
        harness: TestDriver) -> None:
    start(harness, "syncCrm", user="u1")
    waiting = [start(harness, "syncCrm", user="u1")]
    start(harness, "syncCrm", user="u2")
    waiting.append(start(harness, "syncCrm", user="u2"))
    harness.commit()
    before = len(ledger(harness))
    harness.restart(rates.without_sync_crm)
    harness.advance(0)
    failed = ledger(harness)[before:]
    assert sorted((r.request_id, r.outcome, r.reason) for r in failed) == sorted(
        (request_id, Outcome.failed, REMOVED) for request_id in waiting)
    reports = harness.starts
    assert [json.loads(r.payload)["reason"] for r in reports] == [REMOVED, REMOVED]
    # Their keys are gone with them.
    harness.commit()
    assert stored(harness, b"\x00SK") == []
    assert stored(harness, b"\x00SQ") == []


def test_a_fresh_key_admits_and_an_idle_key_leaves_no_row_behind(harness: TestDriver) -> None:
    start(harness, "resizeImage")
    harness.commit()
    harness.advance(61_000)
    harness.commit()
    assert stored(harness, b"") == []


def test_a_throttle_pool_paces_its_members_together_per_key(harness: TestDriver) -> None:
    t0 = harness.now_ms
    push = start(harness, "partnerPush", user="u1")
    pull = start(harness, "partnerPull", user="u1")  # the same pool and user: waits
    other = start(harness, "partnerPull", user="u2")  # another user of the pool: at once
    queued = [r for r in ledger(harness) if r.outcome is Outcome.queued]
    assert [(r.request_id, r.due_at_ms, r.key) for r in queued] == [(pull, t0 + 60_000, "u1")]
    harness.advance(59_999)
    assert [a.execution_id for a in admissions(harness)] == [f"x-{push}", f"x-{other}"]
    harness.advance(1)
    assert [(a.execution_id, a.admitted_at_ms) for a in admissions(harness)][2:] == [
        (f"x-{pull}", t0 + 60_000)]


def test_a_pool_key_paced_by_a_member_since_removed_goes_on_with_the_others(
        harness: TestDriver) -> None:
    t0 = harness.now_ms
    start(harness, "partnerPush", user="u1")
    waiting = start(harness, "partnerPull", user="u1")
    harness.commit()
    harness.restart(rates.without_partner_push)
    harness.advance(0)
    later = start(harness, "partnerPull", user="u1")
    harness.advance(120_000)
    assert [(a.execution_id, a.admitted_at_ms) for a in admissions(harness)][1:] == [
        (f"x-{waiting}", t0 + 60_000), (f"x-{later}", t0 + 120_000)]
    assert not [r for r in ledger(harness) if r.outcome is Outcome.failed]


# -- several throttles on one workflow ---------------------------------------------------


def _admitted_at(h: TestDriver) -> list[tuple[str, int]]:
    return [(a.execution_id, a.admitted_at_ms - T0) for a in admissions(h)]


T0 = 1_700_000_000_000  # the harness clock at its start


def test_under_several_throttles_a_start_goes_when_every_pace_has_room(
        harness: TestDriver) -> None:
    first = start(harness, "callPartner", user="u1")
    harness.advance(1)
    again = start(harness, "callPartner", user="u1")  # u1's own pace: 10 s
    harness.advance(1)
    other = start(harness, "callPartner", user="u2")  # room for u2, not in all: 5 s
    harness.advance(1)
    third = start(harness, "callPartner", user="u3")
    queued = {r.request_id: r for r in ledger(harness) if r.outcome is Outcome.queued}
    assert (queued[again].key, queued[again].deferral) == ("u1", "throttle")
    assert queued[again].due_at_ms == T0 + 10_000
    harness.advance(30_000)
    # Both paces hold: one per user each 10 s, two in all each 10 s, and at 10 s u1's
    # second start (waiting since 1 ms) goes before u3's (since 3 ms).
    assert _admitted_at(harness) == [
        (f"x-{first}", 0), (f"x-{other}", 5_000), (f"x-{again}", 10_000),
        (f"x-{third}", 15_000)]
    admitted = [r for r in ledger(harness) if r.outcome is Outcome.admitted]
    assert [r.key for r in admitted] == ["u1", "u2", "u1", "u3"]


def test_a_user_at_its_own_pace_does_not_hold_back_the_others(harness: TestDriver) -> None:
    start(harness, "callPartner", user="u1")
    harness.advance(5_000)
    slow = start(harness, "callPartner", user="u1")   # u1 waits until 10 s
    quick = start(harness, "callPartner", user="u2")  # the global pace has room at 5 s
    assert _admitted_at(harness)[1:] == [(f"x-{quick}", 5_000)]
    harness.advance(5_000)
    assert _admitted_at(harness)[2:] == [(f"x-{slow}", 10_000)]


def test_over_a_throttles_max_queued_a_start_is_dropped_naming_that_throttle(
        harness: TestDriver) -> None:
    for user in ("u1", "u2", "u3", "u4", "u5", "u6"):
        start(harness, "callPartner", user=user)
    outcomes = [r.outcome for r in ledger(harness)]
    # One goes at once (two each 10 s in all is one each 5 s), three wait, the fifth and
    # sixth find the global queue full.
    assert outcomes == [Outcome.admitted, *[Outcome.queued] * 3, *[Outcome.dropped] * 2]
    dropped = next(r for r in ledger(harness) if r.outcome is Outcome.dropped)
    assert "throttle[1]" in (dropped.reason or "") and "max_queued 3" in (dropped.reason or "")


def test_several_throttles_expire_a_start_past_timeouts_start(harness: TestDriver) -> None:
    for i in range(4):
        start(harness, "callPartner", user=f"u{i}")
    harness.commit()
    harness.advance(60_000)
    outcomes = [r.outcome for r in ledger(harness) if r.outcome is not Outcome.queued]
    assert outcomes.count(Outcome.admitted) == 4
    for _ in range(4):
        start(harness, "callPartner", user="u9")  # one each 10 s for u9: the fourth waits 30 s
    harness.advance(60_000)
    assert [r.outcome for r in ledger(harness)].count(Outcome.expired) == 0
    assert len(admissions(harness)) == 8
    # Everything idle is forgotten: no row is left.
    harness.advance(60_000)
    harness.commit()
    assert stored(harness, b"") == []


def test_redeclared_throttles_judge_their_waiting_starts_again(harness: TestDriver) -> None:
    start(harness, "callPartner", user="u1")
    waiting = [start(harness, "callPartner", user="u1"), start(harness, "callPartner", user="u2")]
    harness.commit()
    before = len(harness.sent(harness.topics.stage("throttle")))
    harness.restart(rates.call_partner_per_user)
    harness.advance(0)
    resent = [(w.key, codec.decode(PendingStart, w.value).request_id)
              for w in harness.sent(harness.topics.stage("throttle"))[before:]]
    # Sent back to the throttle hop, keyed by the one throttle's key now.
    assert sorted(resent) == sorted([(b"callPartner\x1fu1", waiting[0]),
                                     (b"callPartner\x1fu2", waiting[1])])
    harness.commit()
    assert stored(harness, b"\x00St") == []


def test_several_throttles_of_a_removed_workflow_fail_their_waiting_starts(
        harness: TestDriver) -> None:
    start(harness, "callPartner", user="u1")
    waiting = start(harness, "callPartner", user="u1")
    harness.commit()
    before = len(ledger(harness))
    harness.restart(rates.without_call_partner)
    harness.advance(0)
    (failed,) = ledger(harness)[before:]
    assert (failed.request_id, failed.outcome, failed.reason, failed.key) == (
        waiting, Outcome.failed, REMOVED, "u1")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.integers(0, 7_000)),
                min_size=1, max_size=20))
def test_several_throttles_admit_every_start_and_never_break_either_pace(
        arrivals: list[tuple[str, int]]) -> None:
    with TestDriver(rates.app) as h:
        users = {}
        for user, gap in arrivals:
            h.advance(gap)
            users[f"x-{start(h, 'pacedTwice', user=user)}"] = user
        h.advance(len(arrivals) * 10_000)
        admitted = [(a.admitted_at_ms, users[a.execution_id]) for a in admissions(h)]
        assert len(admitted) == len(arrivals)
        times = [t for t, _ in admitted]
        assert times == sorted(times)
        # Two each 10 s in all: the start two places later is 10 s later at least.
        assert all(later - earlier >= 10_000
                   for earlier, later in zip(times, times[2:], strict=False))
        for user in set(users.values()):
            own = [t for t, u in admitted if u == user]
            assert all(b - a >= 10_000 for a, b in pairwise(own))
        # In each user's order of arrival.
        order = [users[a.execution_id] + a.execution_id for a in admissions(h)]
        for user in set(users.values()):
            arrived = [f"{user}{x}" for x, u in users.items() if u == user]
            assert [o for o in order if o.startswith(user)] == arrived


def test_a_key_that_queued_leaves_no_row_behind_once_idle(harness: TestDriver) -> None:
    for _ in range(3):
        start(harness, "syncCrm")
    harness.advance(60_000)
    harness.commit()
    assert len(admissions(harness)) == 3
    assert stored(harness, b"") == []


def test_the_route_of_several_throttles_keys_them_by_the_workflow_and_says_so() -> None:
    route = route_for(rates.paced_twice)
    (hop,) = (h for h in route.hops if h.stage == "throttle")
    assert (hop.budget, hop.key) == ("pacedTwice", None)
    assert "throttle[throttle pacedTwice by (one key), pacing together by userId, (one key)]" \
        in route.describe()


def test_several_throttles_read_their_indexes_from_their_floors(harness: TestDriver) -> None:
    """Each admission moves its key's entry in the idle index (and a waiting lane's in the
    others): the cycle's deleted entries must not be walked again at every start, so the
    indexes are read from their floors, past the front rows deleted before."""
    reads: list[tuple[bytes, bytes | None]] = []
    tx = harness.store("throttle")
    original = tx.items

    def recording(prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        reads.append((prefix, start))
        return original(prefix, start)

    tx.items = recording  # type: ignore[method-assign]
    for i in range(200):
        start(harness, "pacedTwice", user=f"u{i % 3}")
        harness.advance(1)
    index_reads = [(prefix, start) for prefix, start in reads
                   if prefix.startswith((b"\x00StI", b"\x00StY", b"\x00StV"))]
    assert len(index_reads) > 200
    # After the first few, every one starts past the front of its index.
    assert all(start is not None and start > prefix for prefix, start in index_reads[50:])
