"""When will a start waiting behind a concurrency limit go? Its place in line divided by
how fast that line has been moving (issue 35, point 5; docs/decisions/wait-estimate.md).

The pace is read from the ledger: the starts of the same workflow that waited at that
key and control (a `queued` row with deferral `concurrency`) and left the line over the
last `WINDOW_MS`, admitted or on to the limit after it. Behind a full limit each such
departure is a run that ended and gave its slot to the next in line, so this is the
key's completion rate as the line sees it, slots freed by runs of other workflows of a
pool included. Before another limit (a workflow's second, a pool, the deployment cap) the
estimate is of the wait for this limit's slot, and says so: the wait at the next limit is
not counted (docs/decisions/wait-estimate.md). The span is the time from the
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

# The starts that left the line at the workflow's key and control in the window, and where
# they went. A start leaves a line when it takes a slot there: its next row is `admitted`
# (the limit was the last step of its route, or every limit after it had room), or
# `queued` or `dropped` by another control (a limit after this one, or the pause).
# Its first such row after its `queued` row here is when it left. Rows of other
# outcomes (expired, cancelled, failed) are starts that gave up their place without a
# slot: they shorten the line but say nothing of its pace. `went_on`: the controls those
# rows name other than this one and the pause (the limits after this one); `admitted_here`:
# some were admitted by this control, so it was the last step of their route.
PACE_SQL = """
WITH recent AS (
    -- Only a request with a row in the window can have left the line in it.
    SELECT DISTINCT request_id FROM ledger
    WHERE workflow = $workflow AND decided_at > $since AND decided_at <= $now
), line AS (
    SELECT request_id, min(decided_at) AS queued_at
    FROM ledger
    WHERE outcome = 'queued' AND deferral = 'concurrency' AND workflow = $workflow
      AND key IS NOT DISTINCT FROM $key AND control IS NOT DISTINCT FROM $control
      AND decided_at <= $now AND request_id IN (SELECT request_id FROM recent)
    GROUP BY ALL
), moved AS (
    SELECT l.request_id, a.decided_at, a.outcome, a.control
    FROM line l JOIN ledger a ON a.request_id = l.request_id
    WHERE a.decided_at >= l.queued_at AND a.decided_at <= $now
      AND (a.outcome = 'admitted'
           OR (a.outcome IN ('queued', 'dropped')
               AND a.control IS DISTINCT FROM $control))
), departed AS (
    SELECT * FROM moved
    QUALIFY row_number() OVER (PARTITION BY request_id ORDER BY decided_at) = 1
)
SELECT count(*) AS left_line, min(decided_at) AS first_at,
       list(DISTINCT control ORDER BY control) FILTER (
           WHERE control IS DISTINCT FROM $control AND control <> 'pause') AS went_on,
       coalesce(bool_or(outcome = 'admitted' AND control IS NOT DISTINCT FROM $control),
                false) AS admitted_here
FROM departed
WHERE decided_at > $since
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
    """A start with `ahead` starts before it in a line moving at `pace`. `then`: the
    limits of its route after this one, whose waits the estimate does not count (empty:
    this limit is its last step, it runs once it has the slot; None: not known)."""

    ahead: int
    pace: Pace
    then: tuple[str, ...] | None = ()

    @property
    def wait_ms(self) -> int:
        # It goes with the (ahead + 1)th slot that frees.
        return round((self.ahead + 1) * self.pace.span_ms / self.pace.left)

    def text(self) -> str:
        """`about 4 min: 37 ahead, 9 runs a minute over the last 10 min`; before another
        limit, `about 4 min for a slot of this limit: ...; then it needs a slot of
        concurrency[1] pool:gpu, which may add to the wait`."""
        basis = f"{self.ahead} ahead, {self.pace.text()}"
        if self.then == ():
            return f"about {_about(self.wait_ms)}: {basis}"
        after = ("a limit after it, if any," if self.then is None
                 else f"then it needs a slot of {' and '.join(self.then)}, which")
        return (f"about {_about(self.wait_ms)} for a slot of this limit: {basis}; {after} "
                "may add to the wait")


@dataclass(frozen=True, slots=True)
class Line:
    """What the ledger says of a line: its pace (None: nobody left it in the window), the
    controls the starts that left it went on to (the limits after it), and whether some
    were admitted by it (it was the last step of their route)."""

    pace: Pace | None
    went_on: tuple[str, ...] = ()
    admitted_here: bool = False

    def then(self) -> tuple[str, ...] | None:
        """The limits after this one, as far as the starts that left it show them."""
        if self.went_on:
            return self.went_on
        return () if self.admitted_here else None


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


def read_line(db: LedgerDb, workflow: str, key: str | None, control: str | None,
              now_ms: int, window_ms: int = WINDOW_MS) -> Line:
    """The line at `workflow`'s `key` and `control`, up to `now_ms`."""
    result = db.query(PACE_SQL, {
        "workflow": workflow, "key": key, "control": control,
        "since": _naive(now_ms - window_ms), "now": _naive(now_ms)})
    left, first, went_on, here = result.rows[0] if result.rows else (0, None, None, False)
    first_ms = None if first is None else int(first.replace(tzinfo=UTC).timestamp() * 1000)
    return Line(pace_from(int(left or 0), first_ms, now_ms, window_ms),
                tuple(str(c) for c in went_on or ()), bool(here))


def read_pace(db: LedgerDb, workflow: str, key: str | None, control: str | None,
              now_ms: int, window_ms: int = WINDOW_MS) -> Pace | None:
    """The pace of the line at `workflow`'s `key` and `control`, up to `now_ms`."""
    return read_line(db, workflow, key, control, now_ms, window_ms).pace


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
