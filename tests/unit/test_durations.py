"""Durations: both seeds' text forms, read once into milliseconds."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.declare import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("30s", 30_000),
        ("1m", 60_000),
        ("24h", 86_400_000),
        ("7d", 604_800_000),
        ("500ms", 500),
        ("15 minutes", 900_000),
        ("1 hour", 3_600_000),
        ("2 days", 172_800_000),
        ("1h30m", 5_400_000),
        ("10 seconds", 10_000),
        ("4h", 14_400_000),
        ("1 hour 30 minutes", 5_400_000),
        ("1h 30m", 5_400_000),
        ("1.5h", 5_400_000),
        ("1 week", 604_800_000),
        ("  5 Minutes ", 300_000),
        ("0s", 0),
    ],
)
def test_seed_duration_forms_parse_to_milliseconds(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


def test_a_timedelta_is_accepted() -> None:
    assert parse_duration(timedelta(minutes=15)) == 900_000


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "not a duration"),
        ("30", "cannot read '30'"),
        ("15 minuts", "unknown unit 'minuts'"),
        ("-1s", "cannot read"),
        ("1h1h", "appears twice"),
        ("0.5ms", "whole number of milliseconds"),
        ("soon", "cannot read 'soon'"),
        (30, "bare number"),
        (1.5, "bare number"),
        (timedelta(microseconds=1), "whole number of milliseconds"),
    ],
)
def test_anything_else_is_refused_with_the_reason(value: object, fragment: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(value)  # type: ignore[arg-type]
    assert fragment in str(caught.value)


@pytest.mark.parametrize(("ms", "text"), [(0, "0s"), (500, "500ms"), (5_400_000, "1h30m"),
                                          (604_800_000, "7d"), (90_061_001, "1d1h1m1s1ms")])
def test_format_gives_the_compact_form(ms: int, text: str) -> None:
    assert format_duration(ms) == text


@given(st.integers(min_value=0, max_value=10**13))
def test_formatting_then_parsing_round_trips(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms


_UNIT_WORDS = {"ms": 1, "seconds": 1_000, "minutes": 60_000, "hours": 3_600_000, "days": 86_400_000}


@given(st.integers(min_value=0, max_value=10_000), st.sampled_from(sorted(_UNIT_WORDS)),
       st.booleans())
def test_a_count_and_a_spelled_unit_parse_as_their_product(
    count: int, unit: str, spaced: bool
) -> None:
    text = f"{count} {unit}" if spaced else f"{count}{unit}"
    assert parse_duration(text) == count * _UNIT_WORDS[unit]


@given(st.text(max_size=20))
def test_random_text_gives_a_number_or_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        assert parse_duration(text) >= 0
