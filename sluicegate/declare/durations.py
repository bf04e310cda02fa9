"""Durations as text: `"30s"`, `"1m"`, `"24h"`, `"7d"`, `"500ms"`, `"15 minutes"`, `"1h30m"`.

Both seeds' forms are accepted: compact units that may be chained (`1h30m`, as Go prints
them) and spelled-out units (`15 minutes`, `1 hour 30 minutes`). A `datetime.timedelta` is
accepted too. Bare numbers are refused on purpose: `30` reads as seconds in Python, as
milliseconds in JavaScript and as nanoseconds in Go, and a declaration is shared by all three.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation

# Milliseconds per unit, under every spelling a user of either seed would write.
_UNITS: dict[str, int] = {}
for _ms, _names in (
    (1, ("ms", "msec", "msecs", "millisecond", "milliseconds")),
    (1_000, ("s", "sec", "secs", "second", "seconds")),
    (60_000, ("m", "min", "mins", "minute", "minutes")),
    (3_600_000, ("h", "hr", "hrs", "hour", "hours")),
    (86_400_000, ("d", "day", "days")),
    (604_800_000, ("w", "week", "weeks")),
):
    for _name in _names:
        _UNITS[_name] = _ms

_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*,?")
_MAX_TEXT = 100

Duration = str | timedelta
"""What a duration field accepts."""


def parse_duration(value: Duration) -> int:
    """Milliseconds in `value`; raises ValueError saying what was expected."""
    if isinstance(value, timedelta):
        return _from_timedelta(value)
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(
            f"{value!r} is not a duration: write it as text with a unit, like '30s', "
            "'15 minutes' or '1h30m' (a bare number is ambiguous between languages)"
        )
    text = value.strip().lower()
    if not text or len(text) > _MAX_TEXT:
        raise ValueError(f"{value!r} is not a duration: expected text like '30s' or '15 minutes'")
    total = Decimal(0)
    position = 0
    seen: set[int] = set()
    while position < len(text):
        match = _PART.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(_bad(value, f"cannot read {text[position:]!r}"))
        number, unit = match.groups()
        if unit not in _UNITS:
            raise ValueError(_bad(value, f"unknown unit {unit!r}; units are ms, s, m, h, d, w"))
        if _UNITS[unit] in seen:
            raise ValueError(_bad(value, f"the unit {unit!r} appears twice"))
        seen.add(_UNITS[unit])
        try:
            total += Decimal(number) * _UNITS[unit]
        except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
            raise ValueError(_bad(value, str(exc))) from exc
        position = match.end()
    if total != total.to_integral_value():
        raise ValueError(_bad(value, "it is not a whole number of milliseconds"))
    return int(total)


def format_duration(ms: int) -> str:
    """The compact text of `ms` (`7d`, `1h30m`, `500ms`, `0s`); parse_duration reads it back."""
    if ms < 0:
        raise ValueError(f"a duration cannot be negative: {ms}")
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def _from_timedelta(value: timedelta) -> int:
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if micros % 1_000:
        raise ValueError(f"{value!r} is not a whole number of milliseconds")
    if micros < 0:
        raise ValueError(f"{value!r} is negative; a duration cannot be")
    return micros // 1_000


def _bad(value: str, why: str) -> str:
    return f"{value!r} is not a duration ({why}): write e.g. '30s', '15 minutes' or '1h30m'"
