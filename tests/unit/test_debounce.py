"""The debounce core: bursts against a reference model of SPEC.md section 3, step 3."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.admission.stages.debounce import Burst, DebounceRule, arrive

MINUTE = 60_000


@dataclass(frozen=True)
class Outcome:
    kind: str  # "run" or "expire"
    at_ms: int  # when it is owed
    members: tuple[int, ...]  # arrivals folded in, in order; the last one's payload runs


def reference(times: list[int], rule: DebounceRule) -> list[Outcome]:
    """Walk the arrivals: a burst takes every arrival before it is owed a run (a quiet
    period after its last arrival, or the cap after its first) or an expiry."""
    out: list[Outcome] = []
    i = 0
    while i < len(times):
        first = last = times[i]
        members = [i]
        i += 1
        while True:
            run_at = last + rule.period_ms
            if rule.timeout_ms is not None:
                run_at = min(run_at, first + rule.timeout_ms)
            expire_at = first + rule.expire_ms if rule.expire_ms is not None else None
            kind, end = ("expire", expire_at) if expire_at is not None and expire_at < run_at \
                else ("run", run_at)
            assert end is not None
            if i < len(times) and times[i] < end:
                members.append(i)
                last = times[i]
                i += 1
                continue
            out.append(Outcome(kind, end, tuple(members)))
            break
    return out


def owed(burst: Burst, rule: DebounceRule, verdict: str) -> int:
    if verdict == "run":
        return burst.due_ms(rule)
    expires = burst.expires_ms(rule)
    assert expires is not None
    return expires


def simulate(times: list[int], late: list[bool], rule: DebounceRule) -> list[Outcome]:
    """Drive the core as the stage does: a timer at `wake_ms`, which may fire late (after
    a later arrival was processed), in which case the arrival settles the burst first."""
    out: list[Outcome] = []
    burst: Burst | None = None
    members: list[int] = []
    collapsed: list[int] = []
    requests = {f"r{i}": i for i in range(len(times))}

    def settle(now: int) -> None:
        nonlocal burst, members
        assert burst is not None
        verdict = burst.settle(rule, now)
        assert verdict is not None
        assert requests[burst.carrier] == members[-1]  # the latest payload wins
        out.append(Outcome(verdict, owed(burst, rule, verdict), tuple(members)))
        burst, members = None, []

    for i, (t, is_late) in enumerate(zip(times, late, strict=True)):
        if burst is not None and burst.wake_ms(rule) <= t:
            # On time, the timer fired at its due time; late, the arrival finds it due.
            settle(t if is_late else burst.wake_ms(rule))
        assert burst is None or burst.settle(rule, t) is None
        arrival = arrive(burst, f"e{i}", f"r{i}", t, t)
        if arrival.superseded is not None:
            collapsed.append(requests[arrival.superseded])
            assert arrival.burst.execution_id == burst.execution_id  # type: ignore[union-attr]
        burst = arrival.burst
        members.append(i)
    if burst is not None:
        settle(burst.wake_ms(rule))
    # Every arrival but each burst's last is collapsed, exactly once, in order.
    assert collapsed == [m for o in out for m in o.members[:-1]]
    return out


rules = st.builds(
    DebounceRule,
    period_ms=st.integers(1, 10) .map(lambda n: n * MINUTE),
    timeout_ms=st.none() | st.integers(1, 60).map(lambda n: n * MINUTE),
    expire_ms=st.none() | st.integers(1, 120).map(lambda n: n * MINUTE),
)


@st.composite
def arrivals(draw: st.DrawFn) -> tuple[list[int], list[bool]]:
    gaps = draw(st.lists(st.integers(0, 12 * MINUTE), max_size=40))
    times, now = [], 1_700_000_000_000
    for gap in gaps:
        now += gap
        times.append(now)
    return times, draw(st.lists(st.booleans(), min_size=len(times), max_size=len(times)))


@given(rules, arrivals())
def test_bursts_run_as_the_reference_model_says(rule: DebounceRule,
                                                data: tuple[list[int], list[bool]]) -> None:
    times, late = data
    assert simulate(times, late, rule) == reference(times, rule)


@given(rules, arrivals())
def test_a_capped_burst_never_waits_longer_than_its_timeout(
        rule: DebounceRule, data: tuple[list[int], list[bool]]) -> None:
    times, late = data
    for outcome in simulate(times, late, rule):
        first = times[outcome.members[0]]
        if rule.timeout_ms is not None:
            assert outcome.at_ms <= first + rule.timeout_ms
        if rule.expire_ms is not None:
            assert outcome.at_ms <= first + rule.expire_ms
        assert outcome.at_ms <= times[outcome.members[-1]] + rule.period_ms


def test_twenty_edits_within_the_period_make_one_run_with_the_twentieth_payload() -> None:
    rule = DebounceRule(period_ms=15 * MINUTE)
    times = [1_000_000 + i * MINUTE for i in range(20)]
    (only,) = simulate(times, [False] * 20, rule)
    assert only == Outcome("run", times[-1] + 15 * MINUTE, tuple(range(20)))


def test_an_unbroken_stream_still_runs_at_the_timeout_cap() -> None:
    rule = DebounceRule(period_ms=5 * MINUTE, timeout_ms=30 * MINUTE)
    times = [i * MINUTE for i in range(45)]  # one a minute, never quiet for five
    outcomes = simulate(times, [False] * 45, rule)
    assert [(o.kind, o.at_ms, len(o.members)) for o in outcomes] == [
        ("run", 30 * MINUTE, 30), ("run", 44 * MINUTE + 5 * MINUTE, 15)]


def test_without_a_cap_timeouts_start_expires_a_starving_burst() -> None:
    rule = DebounceRule(period_ms=5 * MINUTE, expire_ms=60 * MINUTE)
    times = [i * MINUTE for i in range(90)]
    outcomes = simulate(times, [False] * 90, rule)
    assert (outcomes[0].kind, outcomes[0].at_ms, len(outcomes[0].members)) == (
        "expire", 60 * MINUTE, 60)


def test_a_run_and_an_expiry_owed_at_the_same_instant_run() -> None:
    rule = DebounceRule(period_ms=MINUTE, timeout_ms=10 * MINUTE, expire_ms=10 * MINUTE)
    burst = Burst("e", "r", 0, 9 * MINUTE + 30_000, 5)
    assert burst.settle(rule, 10 * MINUTE) == "run"
    assert burst.settle(rule, 10 * MINUTE - 1) is None
