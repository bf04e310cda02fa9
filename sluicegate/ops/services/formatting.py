"""How operators read values, the same in every command and every JSON document: durations
(`1h02m03s`), instants (ISO 8601 UTC with milliseconds), a ledger result's cells and
blocks, a decision's one line (docs/decisions/times-in-utc.md). Text only: which terminal
colours and tables show it is the command line's business."""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sluicegate.schemas.records import LedgerRecord, Outcome

# How the text forms spell the key of an unkeyed control, and of a run holding no
# concurrency slot: the workflow's one key (as `topology show` says; the JSON has "").
ONE_KEY = "(one key)"


def clock(ms: int | None, now_ms: int) -> str:
    """An instant in UTC, as every sentence and the console give it: the time of day when
    it is today, with the date when it is not (a debounce may wait seven days)."""
    if ms is None:
        return "an unknown time"
    at = datetime.fromtimestamp(ms / 1000, UTC)
    if at.date() == datetime.fromtimestamp(now_ms / 1000, UTC).date():
        return at.strftime("%H:%M:%S UTC")
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(value: timedelta) -> str:
    """`1h02m03s`, as `waiting=` reads in `flow`: whole seconds, largest unit first."""
    seconds = int(value.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d{hours:02d}h{minutes:02d}m"
    if hours:
        return f"{sign}{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def duration_ms(ms: int) -> str:
    return duration(timedelta(milliseconds=ms))


def iso(value: Any) -> str | None:
    """A ledger instant (naive UTC) or epoch ms, as ISO 8601 UTC with milliseconds."""
    if value is None:
        return None
    if isinstance(value, int):
        value = datetime.fromtimestamp(value / 1000, UTC)
    elif isinstance(value, datetime) and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return str(value.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


def cell_text(value: Any) -> str:
    """A value of a ledger SQL result as a table or CSV cell shows it."""
    if value is None:
        return ""
    if isinstance(value, timedelta):
        return duration(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")  # payloads are JSON
        except UnicodeDecodeError:
            return value.hex()
    return str(value)


def json_value(value: Any) -> Any:
    """A value of a ledger SQL result as a JSON document holds it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return cell_text(value)


BLOCK_WIDTH = 80
_LABEL = 15


def blocks(columns: list[str], rows: list[tuple[Any, ...]], noun: str = "request") -> str:
    """One block per row, each at most BLOCK_WIDTH columns: the first three columns on
    its first line, then one line per other column that has a value (long ones wrapped
    under it), then how many rows. An empty key is the workflow's one key, as `flow` and
    `topology show` spell it."""
    out: list[str] = []
    for row in rows:
        values = dict(zip(columns, row, strict=True))
        head = "  ".join(cell_text(v) for v in row[:3])
        out.append(head if len(head) <= BLOCK_WIDTH else head[:BLOCK_WIDTH - 3] + "...")
        for column, value in list(values.items())[3:]:
            text = ONE_KEY if column == "key" and value == "" else cell_text(value)
            if not text:
                continue
            out.extend(textwrap.wrap(text, BLOCK_WIDTH, initial_indent=f"  {column:<{_LABEL - 2}}",
                                     subsequent_indent=" " * _LABEL, break_long_words=True))
        out.append("")
    n = len(rows)
    out.append(f"{n} {noun}{'' if n == 1 else 's'}")
    return "\n".join(out)


# The colour of each outcome in a decision's line (a name rich and most terminals know).
OUTCOME_COLOURS = {
    Outcome.admitted: "green", Outcome.existing: "cyan", Outcome.queued: "yellow",
    Outcome.dropped: "red", Outcome.skipped: "magenta", Outcome.rejected: "bold red",
    Outcome.collapsed: "blue", Outcome.expired: "red", Outcome.cancelled: "red",
    Outcome.failed: "bold red", Outcome.lease_expired: "red",
}


@dataclass(frozen=True, slots=True)
class DecisionLine:
    """A decision as `sluicegate demo` and `ledger tail` print it, in three parts so that a
    terminal can colour the outcome: `15:05:55 ` `admitted ` ` sendReceipt -> run 8a2128ef`."""

    head: str
    outcome: str
    rest: str
    colour: str

    def __str__(self) -> str:
        return self.head + self.outcome + self.rest


def decision_line(row: LedgerRecord) -> DecisionLine:
    when = time.strftime("%H:%M:%S", time.gmtime(row.decided_at_ms / 1000))  # UTC, as all
    execution = f" -> run {row.execution_id[:8]}" if row.execution_id else ""
    key = f" key={row.key}" if row.key else ""
    reason = f"  ({row.reason})" if row.reason else ""
    return DecisionLine(f"{when} ", f"{row.outcome.value:<9}",
                        f" {row.workflow:<14}{key}{execution}{reason}",
                        OUTCOME_COLOURS.get(row.outcome, "white"))
