"""Which controls judge which kind of start (seed 003, "How they work together").

rateLimit, debounce and batch are about streams of events, and a direct start dedupes by the
id its caller passes rather than by the idempotency expression, so those four apply to event
starts only. A child started by `invoke` is part of its parent's work: only concurrency and
priority (which bound and order work in flight) hold it back.
"""

from __future__ import annotations

from enum import StrEnum

from sluicegate.declare.controls import Control

__all__ = ["CONTROLS", "Origin", "applies"]


class Origin(StrEnum):
    """How a start was asked for; decides which controls apply (SPEC 2). One enum for the
    concept: the start-request record carries it."""

    event = "event"
    direct = "direct"
    cron = "cron"
    invoke = "invoke"


_ALL = frozenset(Origin)
_MATRIX: dict[Control, frozenset[Origin]] = {
    Control.concurrency: _ALL,
    Control.priority: _ALL,
    Control.throttle: _ALL - {Origin.invoke},
    Control.singleton: _ALL - {Origin.invoke},
    Control.rate_limit: frozenset({Origin.event}),
    Control.debounce: frozenset({Origin.event}),
    Control.batch: frozenset({Origin.event}),
    Control.idempotency: frozenset({Origin.event}),
}
# The option names, as declarations spell them.
CONTROLS = tuple(control.option for control in _MATRIX)


def applies(control: Control | str, origin: Origin | str) -> bool:
    """Whether `control` (a Control, or any of its names: "rate_limit", "rateLimit",
    "debounce", ...) judges a start of this origin. Unknown names and origins raise
    ValueError rather than answer no."""
    return Origin(origin) in _MATRIX[Control.of(control)]
