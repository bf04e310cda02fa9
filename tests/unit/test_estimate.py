"""When will a waiting start go (issue 35, point 5): behind a concurrency limit, its place
in line over the pace its line has been moving at, with the basis said; for the controls
that know the time, that time, with its date and zone when it is not today."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Workflow
from sluicegate.ops.services.estimate import (
    WINDOW_MS,
    Estimate,
    Line,
    Pace,
    no_estimate,
    pace_from,
    read_line,
    read_pace,
)
from sluicegate.ops.services.ledger import LedgerDb, fill
from sluicegate.ops.services.runs import RunsIndex, lookup, text
from sluicegate.ops.services.waiting import waiting_starts
from sluicegate.schemas.records import LedgerRecord, Outcome


class Job(BaseModel):
    tenant: str


T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S = 1000
MIN = 60 * S


def _row(request_id: str, outcome: Outcome, at_ms: int, *, key: str | None = "acme",
         control: str | None = "concurrency", workflow: str = "perTenant",
         **more: object) -> LedgerRecord:
    return LedgerRecord(request_id=request_id, workflow=workflow, outcome=outcome,
                        requested_at_ms=at_ms, decided_at_ms=at_ms, key=key,
                        control=control, **more)  # type: ignore[arg-type]


def _queued(request_id: str, at_ms: int, **more: object) -> LedgerRecord:
    return _row(request_id, Outcome.queued, at_ms, deferral="concurrency", **more)


def _left_line(request_id: str, queued_ms: int, admitted_ms: int,
               **more: object) -> list[LedgerRecord]:
    """A start that waited in the line and then was admitted from it."""
    return [_queued(request_id, queued_ms, **more),
            _row(request_id, Outcome.admitted, admitted_ms, execution_id=f"e-{request_id}",
                 **more)]


# -- the arithmetic and its words ---------------------------------------------------------


def test_the_issues_example_reads_about_4_min_with_its_basis() -> None:
    estimate = Estimate(ahead=37, pace=Pace(left=90, span_ms=10 * MIN))
    assert estimate.wait_ms == round(38 * 10 * MIN / 90)  # it goes with the 38th slot
    assert estimate.text() == "about 4 min: 37 ahead, 9 runs a minute over the last 10 min"


def test_the_next_in_line_waits_for_one_slot() -> None:
    assert Estimate(ahead=0, pace=Pace(left=30, span_ms=MIN)).wait_ms == 2 * S
    assert Estimate(ahead=0, pace=Pace(left=30, span_ms=MIN)).text() == (
        "about 2 s: 0 ahead, 30 runs a minute over the last 1 min")


@pytest.mark.parametrize(("pace", "said"), [
    (Pace(25, 10 * MIN), "2.5 runs a minute over the last 10 min"),
    (Pace(3, 10 * MIN), "1 run every 3 min over the last 10 min"),
    (Pace(1, 2 * 3600 * S), "1 run every 2 h over the last 2 h"),
    (Pace(12, 45 * S), "16 runs a minute over the last 45 s"),
])
def test_a_pace_is_said_as_a_person_says_it(pace: Pace, said: str) -> None:
    assert pace.text() == said


@pytest.mark.parametrize(("ahead", "pace", "about"), [
    (9, Pace(60, MIN), "about 10 s"),
    (599, Pace(10, MIN), "about 1 h"),
    (779, Pace(6, MIN), "about 2 h 10 min"),
    (14_399, Pace(1, 10 * MIN), "about 100d00h00m"),
])
def test_a_long_wait_is_given_in_hours_then_days(ahead: int, pace: Pace, about: str) -> None:
    assert Estimate(ahead, pace).text().startswith(about + ":")


def test_a_pace_is_measured_from_the_first_departure_to_now_within_the_window() -> None:
    now = T0 + 30 * MIN
    assert pace_from(0, None, now) is None
    # A line that formed two minutes ago is paced over two minutes, not ten.
    assert pace_from(20, now - 2 * MIN, now) == Pace(20, 2 * MIN)
    # A line that stopped moving slows down as time passes: now, not the last departure.
    assert pace_from(20, now - 9 * MIN, now).per_minute == pytest.approx(20 / 9)  # type: ignore[union-attr]
    assert pace_from(20, now - 20 * MIN, now) == Pace(20, WINDOW_MS)
    # One departure a moment ago is paced over a second at the least.
    assert pace_from(1, now, now) == Pace(1, S)


# -- read from the ledger ------------------------------------------------------------------


def test_the_pace_counts_only_starts_that_left_this_line_in_the_window() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    fill(db, [
        # Left this line: 3 in the window, from 4 minutes ago.
        *_left_line("w1", now - 5 * MIN, now - 4 * MIN),
        *_left_line("w2", now - 5 * MIN, now - 3 * MIN),
        *_left_line("w3", now - 5 * MIN, now - MIN),
        # Left it before the window.
        *_left_line("old", now - 15 * MIN, now - 11 * MIN),
        # Admitted at once: it never waited, so it says nothing of the line.
        _row("fast", Outcome.admitted, now - 2 * MIN, execution_id="e-fast"),
        # Another key's line, another control's, another workflow's.
        *_left_line("k2", now - 5 * MIN, now - 2 * MIN, key="bolt"),
        *_left_line("c2", now - 5 * MIN, now - 2 * MIN, control="concurrency[1]"),
        *_left_line("o2", now - 5 * MIN, now - 2 * MIN, workflow="other"),
        # Decided after `now`: not yet.
        *_left_line("later", now - 5 * MIN, now + MIN),
    ])
    assert read_pace(db, "perTenant", "acme", "concurrency", now) == Pace(3, 4 * MIN)
    assert read_pace(db, "perTenant", "none", "concurrency", now) is None


def test_a_start_behind_a_limit_is_told_its_estimate_in_the_why_sentence_and_json() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    # Ten left the line over the last 5 minutes: 2 a minute.
    rows = [r for i in range(10)
            for r in _left_line(f"w{i}", now - 6 * MIN, now - 5 * MIN + i * 30 * S)]
    rows += [_queued(f"q{i}", now - MIN + i * S) for i in range(7)]
    fill(db, rows)
    starts = {w.request_id: w for w in waiting_starts(db, {}, now_ms=now)}
    last = starts["q6"]
    assert last.why == ("concurrency on key 'acme': position 7 of 7; about 4 min: 6 ahead, "
                        "2 runs a minute over the last 5 min")
    assert last.estimate_ms == round(7 * 5 * MIN / 10)
    assert last.to_json()["estimate_ms"] == last.estimate_ms
    assert starts["q0"].estimate_ms == 30 * S


def test_a_line_that_has_not_moved_says_there_is_no_estimate_yet() -> None:
    db = LedgerDb(":memory:")
    fill(db, [_queued("q1", T0)])
    (only,) = waiting_starts(db, {}, now_ms=T0 + MIN)
    assert only.why.endswith("; " + no_estimate())
    assert only.estimate_ms is None


# -- a limit followed by another ------------------------------------------------------------

FIRST, POOL = "concurrency[0]", "concurrency[1] pool:wide"


def _left_for_the_pool(request_id: str, queued_ms: int, left_ms: int,
                       admitted_ms: int | None = None) -> list[LedgerRecord]:
    """A start that waited at the first of two limits and then took its slot: admitted by
    the pool after it at once (no `admitted_ms`: at `left_ms`), or queued there first."""
    rows = [_queued(request_id, queued_ms, control=FIRST)]
    if admitted_ms is None:
        return [*rows, _row(request_id, Outcome.admitted, left_ms, key="", control=POOL,
                            execution_id=f"e-{request_id}")]
    return [*rows, _queued(request_id, left_ms, key="", control=POOL),
            _row(request_id, Outcome.admitted, admitted_ms, key="", control=POOL,
                 execution_id=f"e-{request_id}")]


def test_a_start_leaves_a_line_before_another_limit_when_its_next_row_is_written() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    fill(db, [
        # Admitted by the pool at once, from 4 minutes ago; and one that waited there too,
        # which left the first line when it was queued by the pool, not when admitted.
        *_left_for_the_pool("p1", now - 5 * MIN, now - 4 * MIN),
        *_left_for_the_pool("p2", now - 5 * MIN, now - 3 * MIN),
        *_left_for_the_pool("p3", now - 5 * MIN, now - 2 * MIN, admitted_ms=now - MIN),
        *_left_for_the_pool("gone", now - 30 * MIN, now - 15 * MIN, admitted_ms=now - MIN),
        # Waited at the pool only: it never stood in the first line.
        _queued("p4", now - 3 * MIN, key="", control=POOL),
        _row("p4", Outcome.admitted, now - 2 * MIN, key="", control=POOL, execution_id="e4"),
        # Expired in the first line: it gave up its place without a slot.
        _queued("x1", now - 5 * MIN, control=FIRST),
        _row("x1", Outcome.expired, now - 2 * MIN, control=FIRST),
    ])
    line = read_line(db, "perTenant", "acme", FIRST, now)
    assert line == Line(Pace(3, 4 * MIN), went_on=(POOL,), admitted_here=False)
    assert line.then() == (POOL,)
    # The pool's own line: the starts that waited there (p3, gone, p4), admitted by it.
    assert read_line(db, "perTenant", "", POOL, now) == Line(
        Pace(3, 2 * MIN), went_on=(), admitted_here=True)


def test_before_another_limit_the_estimate_is_for_this_limits_slot_and_says_so() -> None:
    estimate = Estimate(ahead=37, pace=Pace(left=90, span_ms=10 * MIN), then=(POOL,))
    assert estimate.text() == (
        "about 4 min for a slot of this limit: 37 ahead, 9 runs a minute over the last "
        "10 min; then it needs a slot of concurrency[1] pool:wide, which may add to the wait")
    assert Estimate(0, Pace(30, MIN), then=None).text() == (
        "about 2 s for a slot of this limit: 0 ahead, 30 runs a minute over the last 1 min; "
        "a limit after it, if any, may add to the wait")


def test_a_start_before_another_limit_is_told_the_wait_for_its_slot_and_the_limit_after() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    rows = [r for i in range(10)
            for r in _left_for_the_pool(f"w{i}", now - 6 * MIN, now - 5 * MIN + i * 30 * S)]
    rows += [_queued(f"q{i}", now - MIN + i * S, control=FIRST) for i in range(3)]
    fill(db, rows)
    # Without the declarations (runs show), from where the starts that left went.
    last = {w.request_id: w for w in waiting_starts(db, {}, now_ms=now)}["q2"]
    assert last.why == (
        "concurrency on key 'acme': position 3 of 3; about 2 min for a slot of this limit: "
        "2 ahead, 2 runs a minute over the last 5 min; then it needs a slot of "
        "concurrency[1] pool:wide, which may add to the wait")
    assert last.estimate_ms == round(3 * 5 * MIN / 10)
    assert last.to_json()["estimate_then"] == [POOL]
    # With them, from the route: the deployment cap after the pool too.
    app = App([Workflow(name="perTenant", payload=Job, concurrency=[
        Concurrency(limit=5, key="tenant"), Concurrency(limit=50, pool="wide")])])
    (last,) = waiting_starts(db, {}, app=app, deployment_cap=100, now_ms=now,
                             request_id="q2")
    assert last.estimate_then == (POOL, "deployment cap")
    assert last.why.endswith("then it needs a slot of concurrency[1] pool:wide and "
                             "deployment cap, which may add to the wait")


def test_the_last_limit_of_a_route_is_told_when_the_start_runs() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    rows = [r for i in range(10)
            for r in _left_line(f"w{i}", now - 6 * MIN, now - 5 * MIN + i * 30 * S)]
    fill(db, [*rows, _queued("q0", now - MIN)])
    (only,) = waiting_starts(db, {}, now_ms=now, request_id="q0")
    assert only.estimate_then == ()
    assert only.to_json()["estimate_then"] == []


# -- the times the controls know: with the date and zone when not today ---------------------


@pytest.mark.parametrize(("now", "said"), [
    (T0, "throttle: its slot is at 00:00:05 UTC"),
    # One millisecond before midnight, UTC: the slot is tomorrow, so it has its date.
    (T0 - 1, "throttle: its slot is at 2026-01-01 00:00:05 UTC"),
    (T0 + 24 * 3600 * S, "throttle: its slot is at 2026-01-01 00:00:05 UTC"),
])
def test_a_known_time_has_its_date_when_it_is_not_today_in_utc(now: int, said: str) -> None:
    db = LedgerDb(":memory:")
    fill(db, [_row("t1", Outcome.queued, T0 - MIN, key="", control="throttle",
                   deferral="throttle", due_at_ms=T0 + 5 * S)])
    (only,) = waiting_starts(db, {}, now_ms=now)
    assert only.why == said
    assert only.estimate_ms is None


def test_a_throttle_slot_worked_out_before_its_pace_changed_is_said_to_be_stale() -> None:
    from sluicegate.admission.limits import LimitChange
    from sluicegate.declare import Throttle
    from sluicegate.schemas.records import OverrideRow

    db = LedgerDb(":memory:")
    fill(db, [_row("t1", Outcome.queued, T0, key="", control="throttle", workflow="sync",
                   deferral="throttle", due_at_ms=T0 + 30 * S),
              _row("p1", Outcome.queued, T0, key="acme", control="throttle pool:partner",
                   workflow="member", deferral="throttle", due_at_ms=T0 + 40 * S),
              _row("k1", Outcome.queued, T0, key="acme", control="throttle",
                   workflow="tiered", deferral="throttle", due_at_ms=T0 + 50 * S)])
    app = App([Workflow(name="tiered", payload=Job, throttle=Throttle(
        limit=1, period="10s", key="tenant", per_key="tiers"))])
    overrides = {
        "throttle:sync": OverrideRow(control="throttle", budget="sync", at_ms=T0 + 5 * S,
                                     limit=10, period_ms=10_000),
        # Cleared before the start queued: its slot time was worked out at the new pace.
        "throttle:pool:partner": OverrideRow(control="throttle", budget="pool:partner",
                                             at_ms=T0 - S)}
    tiers = {("tiers", "acme"): LimitChange("tiers", "acme", 5, T0 + 7 * S)}
    why = {w.request_id: w.why for w in waiting_starts(
        db, {}, app=app, overrides=overrides, key_limits=tiers, now_ms=T0 + 10 * S)}
    assert why["t1"] == ("throttle: its slot was at 00:00:30 UTC when it queued; the pace "
                         "changed at 00:00:05 UTC (an operator's override), so it may come "
                         "sooner or later")
    assert why["p1"] == "throttle on key 'acme': its slot is at 00:00:40 UTC"
    assert why["k1"].endswith("the pace changed at 00:00:07 UTC (the key's row of the limits "
                              "table), so it may come sooner or later")


@pytest.mark.parametrize("deferral", ["debounce", "batch", "delayed"])
def test_a_debounce_batch_or_delayed_start_a_week_out_is_given_its_exact_date(
        deferral: str) -> None:
    week = 7 * 24 * 3600 * S
    db = LedgerDb(":memory:")
    fill(db, [_row("d1", Outcome.queued, T0, key="k", control=deferral, deferral=deferral,
                   due_at_ms=T0 + week + 90 * S)])
    (only,) = waiting_starts(db, {}, now_ms=T0)
    assert "until 2026-01-08 00:01:30 UTC" in only.why


# -- runs show ---------------------------------------------------------------------------


def test_runs_show_gives_a_waiting_request_its_why_sentence_with_the_estimate() -> None:
    now = T0 + 20 * MIN
    db = LedgerDb(":memory:")
    rows = [r for i in range(10)
            for r in _left_line(f"w{i}", now - 6 * MIN, now - 5 * MIN + i * 30 * S)]
    fill(db, [*rows, _queued("q0", now - MIN), _queued("q1", now - MIN + S)])
    doc = lookup(db, RunsIndex(Settings()), "q1", now_ms=now)
    (waiting,) = doc["waiting"]
    assert waiting["request_id"] == "q1"
    assert waiting["estimate_ms"] == round(2 * 5 * MIN / 10)
    assert waiting["why"].endswith("about 1 min: 1 ahead, 2 runs a minute over the last 5 min")
    assert f"waiting: request=q1: {waiting['why']}" in text(doc)
    # Once admitted, nothing waits.
    fill(db, [_row("q1", Outcome.admitted, now, execution_id="e-q1")])
    assert lookup(db, RunsIndex(Settings()), "q1", now_ms=now)["waiting"] == []
