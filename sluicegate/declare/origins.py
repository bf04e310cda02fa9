"""Which controls judge which kind of start (seed 003, "How they work together").

rateLimit, debounce and batch are about streams of events, and a direct start dedupes by the
id its caller passes rather than by the idempotency expression, so those four apply to event
starts only. A child started by `invoke` is part of its parent's work: only concurrency and
priority (which bound and order work in flight) hold it back.
"""

from __future__ import annotations

# One enum for the concept: the start-request record's own (event, direct, cron, invoke).
from sluicegate.schemas.records import Origin

__all__ = ["CONTROLS", "Origin", "applies"]

_ALL = frozenset(Origin)
_MATRIX: dict[str, frozenset[Origin]] = {
    "concurrency": _ALL,
    "priority": _ALL,
    "throttle": _ALL - {Origin.invoke},
    "singleton": _ALL - {Origin.invoke},
    "rate_limit": frozenset({Origin.event}),
    "debounce": frozenset({Origin.event}),
    "batch": frozenset({Origin.event}),
    "idempotency": frozenset({Origin.event}),
}
CONTROLS = tuple(_MATRIX)


def applies(control: str, origin: Origin | str) -> bool:
    """Whether `control` (an option name: "rate_limit", "debounce", ...) judges a start of
    this origin. Unknown names and origins raise ValueError rather than answer no."""
    try:
        origins = _MATRIX[control]
    except KeyError:
        raise ValueError(
            f"unknown control {control!r}; expected one of {', '.join(CONTROLS)}"
        ) from None
    return Origin(origin) in origins
