"""The rateLimit core: an exact sliding window, against a reference that keeps every
admission ever made."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sluicegate.admission.stages.ratelimit import Admit, Drop, Window, decide

HOUR = 3_600_000


def reference_admits(history: list[int], limit: int, period_ms: int, now_ms: int) -> bool:
    """Admit when fewer than `limit` of all admissions so far lie in (now - period, now]."""
    return sum(1 for t in history if now_ms - period_ms < t <= now_ms) < limit


def run(arrivals: list[int], limit: int, period_ms: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Feed arrival times through the core: (admitted times, (drop time, retry_after))."""
    window = Window()
    admitted: list[int] = []
    dropped: list[tuple[int, int]] = []
    for now in arrivals:
        decision = decide(window, limit, period_ms, now)
        if isinstance(decision, Admit):
            window = decision.window
            admitted.append(now)
        else:
            dropped.append((now, decision.retry_after_ms))
    return admitted, dropped


limits = st.integers(min_value=1, max_value=6)
periods = st.integers(min_value=1, max_value=50)
arrival_times = st.lists(st.integers(min_value=0, max_value=200), max_size=60).map(sorted)


@given(limits, periods, arrival_times)
def test_no_window_of_period_ever_holds_more_than_limit_admissions(
        limit: int, period: int, arrivals: list[int]) -> None:
    admitted, _ = run(arrivals, limit, period)
    for i in range(len(admitted) - limit):
        assert admitted[i + limit] - admitted[i] >= period


@given(limits, periods, arrival_times)
def test_it_admits_exactly_when_the_reference_would(
        limit: int, period: int, arrivals: list[int]) -> None:
    window = Window()
    history: list[int] = []
    for now in arrivals:
        decision = decide(window, limit, period, now)
        assert isinstance(decision, Admit) == reference_admits(history, limit, period, now)
        if isinstance(decision, Admit):
            window = decision.window
            history.append(now)
        assert len(window.admitted) <= limit


@given(limits, periods, arrival_times)
def test_every_drops_retry_after_is_the_first_moment_a_start_would_be_admitted(
        limit: int, period: int, arrivals: list[int]) -> None:
    window = Window()
    for now in arrivals:
        decision = decide(window, limit, period, now)
        if isinstance(decision, Admit):
            window = decision.window
            continue
        assert decision.retry_after_ms > 0
        # A drop changes nothing, so the same window answers the retry.
        assert isinstance(decide(window, limit, period, now + decision.retry_after_ms), Admit)
        assert isinstance(decide(window, limit, period, now + decision.retry_after_ms - 1), Drop)


def test_one_per_four_hours_drops_the_second_alert_with_the_time_left() -> None:
    admitted, dropped = run([0, 60_000, 4 * HOUR - 1, 4 * HOUR], 1, 4 * HOUR)
    assert admitted == [0, 4 * HOUR]
    assert dropped == [(60_000, 4 * HOUR - 60_000), (4 * HOUR - 1, 1)]


def test_a_clock_that_steps_back_does_not_open_the_window_early() -> None:
    first = decide(Window(), 1, 1000, 5000)
    assert isinstance(first, Admit)
    # Another worker's clock, a second behind: the admission at 5000 still counts.
    assert decide(first.window, 1, 1000, 4500) == Drop(1500)
    assert isinstance(decide(first.window, 1, 1000, 6000), Admit)


def test_a_lowered_limit_counts_only_the_newest_admissions() -> None:
    window = Window((100, 200, 300))
    assert decide(window, 1, 1000, 400) == Drop(900)
    admit = decide(window, 1, 1000, 1300)
    assert admit == Admit(Window((1300,)), 1300)


@given(st.lists(st.integers(min_value=0, max_value=2**63), max_size=8))
def test_a_window_survives_its_store_row(times: list[int]) -> None:
    window = Window(tuple(sorted(times)))
    assert Window.decode(window.encode()) == window


class RateLimitPerKey(RuleBasedStateMachine):
    """Several keys, time moving on: each key's window is judged on its own, exactly."""

    @initialize(limit=limits, period=periods)
    def setup(self, limit: int, period: int) -> None:
        self.limit = limit
        self.period = period
        self.now = 0
        self.windows: dict[str, Window] = {}
        self.history: dict[str, list[int]] = {}

    @rule(ms=st.integers(min_value=0, max_value=30))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(key=st.sampled_from(["p1", "p2", "p3"]))
    def a_start_arrives(self, key: str) -> None:
        history = self.history.setdefault(key, [])
        decision = decide(self.windows.get(key, Window()), self.limit, self.period, self.now)
        expected = reference_admits(history, self.limit, self.period, self.now)
        assert isinstance(decision, Admit) == expected
        if isinstance(decision, Admit):
            self.windows[key] = decision.window
            history.append(self.now)
        else:
            oldest = [t for t in history if t > self.now - self.period][-self.limit]
            assert decision.retry_after_ms == oldest + self.period - self.now

    @invariant()
    def a_window_is_the_last_admissions_within_a_period_of_the_newest(self) -> None:
        for key, window in self.windows.items():
            history = self.history[key]
            assert window.admitted == tuple(
                t for t in history[-self.limit:] if t > history[-1] - self.period)


TestRateLimitPerKey = RateLimitPerKey.TestCase
TestRateLimitPerKey.settings = settings(max_examples=200, stateful_step_count=60)
