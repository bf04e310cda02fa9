"""When will a start waiting behind a concurrency limit go? Its place in line divided by
how fast that line has been moving (issue 35, point 5; docs/decisions/wait-estimate.md).

The pace is read from the ledger: the starts of the same workflow, key and control that
were `admitted` after waiting there (a `queued` row with deferral `concurrency`), over the
last `WINDOW_MS`. Behind a full limit each such admission is a run that ended and gave
its slot to the next in line, so this is the key's completion rate as the line sees it,
slots freed by runs of other workflows of a pool included. The span is the time from the
first of them to now (at most the window), so a line that formed two minutes ago is paced
over two minutes, and one that stopped moving slows down as the minutes pass.

Throttle, debounce, batch and delayed starts need no estimate: their ledger rows carry the
time they go (`due_at`), which the why-waiting sentence gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sluicegate.ops.services.formatting import duration_ms

if TYPE_CHECKING:
    from sluicegate.ops.services.ledger import LedgerDb

WINDOW_MS = 10 * 60_000
# A pace measured over less than this is not a pace yet (one admission a moment ago).
_SHORTEST_SPAN_MS = 1_000

# Admissions of the line's own key and control, of starts that had waited in a
# concurrency queue, decided in the window: how many, and the first one's time.
PACE_SQL = """
SELECT count(*) AS left_line, min(a.decided_at) AS first_at
FROM ledger a
WHERE a.outcome = 'admitted' AND a.workflow = $workflow
  AND a.key IS NOT DISTINCT FROM $key AND a.control IS NOT DISTINCT FROM $control
  AND a.decided_at > $since AND a.decided_at <= $now
  AND EXISTS (SELECT 1 FROM ledger q
              WHERE q.request_id = a.request_id AND q.outcome = 'queued'
                AND q.deferral = 'concurrency')
"""


@dataclass(frozen=True, slots=True)
class Pace:
    """`left` starts left the line over the last `span_ms`."""

    left: int
    span_ms: int

    @property
    def per_minute(self) -> float:
        return self.left * 60_000 / self.span_ms

    def text(self) -> str:
        """`9 runs a minute over the last 10 min`."""
        rate = self.per_minute
        if rate >= 1:
            every = f"{_figure(rate)} runs a minute"
        else:
            every = f"1 run every {_about(round(60_000 / rate))}"
        return f"{every} over the last {_about(self.span_ms)}"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A start with `ahead` starts before it in a line moving at `pace`."""

    ahead: int
    pace: Pace

    @property
    def wait_ms(self) -> int:
        # It goes with the (ahead + 1)th slot that frees.
        return round((self.ahead + 1) * self.pace.span_ms / self.pace.left)

    def text(self) -> str:
        """`about 4 min: 37 ahead, 9 runs a minute over the last 10 min`."""
        return f"about {_about(self.wait_ms)}: {self.ahead} ahead, {self.pace.text()}"


def pace_from(left: int, first_ms: int | None, now_ms: int,
              window_ms: int = WINDOW_MS) -> Pace | None:
    """The pace of `left` departures since `first_ms` (None: nobody left the line in the
    window, so there is no pace to go by)."""
    if left <= 0 or first_ms is None:
        return None
    span = min(window_ms, max(_SHORTEST_SPAN_MS, now_ms - first_ms))
    return Pace(left, span)


def no_estimate(window_ms: int = WINDOW_MS) -> str:
    return f"no estimate yet: no start has left this line in the last {_about(window_ms)}"


def read_pace(db: LedgerDb, workflow: str, key: str | None, control: str | None,
              now_ms: int, window_ms: int = WINDOW_MS) -> Pace | None:
    """The pace of the line at `workflow`'s `key` and `control`, up to `now_ms`."""
    result = db.query(PACE_SQL, {
        "workflow": workflow, "key": key, "control": control,
        "since": _naive(now_ms - window_ms), "now": _naive(now_ms)})
    left, first = result.rows[0] if result.rows else (0, None)
    first_ms = None if first is None else int(first.replace(tzinfo=UTC).timestamp() * 1000)
    return pace_from(int(left or 0), first_ms, now_ms, window_ms)


def _naive(ms: int) -> datetime:
    """An instant as the ledger copy holds it: a naive UTC timestamp."""
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None)


def _figure(value: float) -> str:
    """A rate as a person says it: whole above ten, one decimal below."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}".removesuffix(".0")


def _about(ms: int) -> str:
    """A rough duration: `40 s`, `4 min`, `2 h 10 min`, then `duration_ms`'s days."""
    seconds = round(ms / 1000)
    if seconds < 60:
        return f"{max(seconds, 1)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 24 * 60:
        hours, rest = divmod(minutes, 60)
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    return duration_ms(ms)
