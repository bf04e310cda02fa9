"""rateLimit: at most `limit` starts per key in any sliding window of `period`; the
excess is dropped (SPEC.md section 3, step 2; seed 000 "throttle vs rateLimit").

The window is exact, not an estimate: a key's row keeps the admission times of its last
`limit` admissions. A start is admitted when the oldest of them has left the window
(`period` ago or more); otherwise it is `dropped`, with `retry_after_ms` the time until
that oldest admission leaves. A drop writes nothing to the store. Only event starts are
judged (seed 003's matrix; the router skips this hop for the other origins).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sluicegate.admission import overrides
from sluicegate.admission.decisions import reject
from sluicegate.admission.limits import key_limit
from sluicegate.admission.routing import ControlStage
from sluicegate.admission.stage import StageContext
from sluicegate.declare import RateLimit, format_duration
from sluicegate.engine.stage import InputRecord
from sluicegate.engine.tables import RAW, Coded, TableSpec
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.records import Outcome, PendingStart
from sluicegate.topology.keys import ControlKey, key_text

NAME = "ratelimit"
# The timer that deletes a key's row once every admission in it has left the window.
_FORGET = b"F"

# -- the pure core -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """The admission times (epoch ms, ascending) of a key's last `limit` admissions."""

    admitted: tuple[int, ...] = ()

    def encode(self) -> bytes:
        return struct.pack(f">{len(self.admitted)}Q", *self.admitted)

    @classmethod
    def decode(cls, raw: bytes) -> Window:
        return cls(struct.unpack(f">{len(raw) // 8}Q", raw))

    def live(self, period_ms: int, now_ms: int) -> tuple[int, ...]:
        """The admissions still inside the window that ends at `now_ms`."""
        return tuple(t for t in self.admitted if t > now_ms - period_ms)

    def forget_at(self, period_ms: int) -> int:
        """When the newest admission leaves the window: the row says nothing after that."""
        return self.admitted[-1] + period_ms


@dataclass(frozen=True, slots=True)
class Admit:
    window: Window
    at_ms: int


@dataclass(frozen=True, slots=True)
class Drop:
    retry_after_ms: int


def decide(window: Window, limit: int, period_ms: int, now_ms: int) -> Admit | Drop:
    """Admit at `now_ms` unless `limit` admissions already lie in the last `period_ms`."""
    # A clock that stepped back (another worker's, after a rebalance) must not let a start
    # slip in before the newest recorded admission: time here never goes backwards.
    now = max(now_ms, window.admitted[-1]) if window.admitted else now_ms
    live = window.live(period_ms, now)
    if len(live) >= limit:
        # The oldest of the last `limit` admissions leaves the window at +period.
        return Drop(live[-limit] + period_ms - now_ms)
    return Admit(Window((*live, now)[-limit:]), now)


# -- the stage -----------------------------------------------------------------------


# A rate key -> its window.
WINDOWS = TableSpec("windows", STATE_PREFIX + b"W", RAW, Coded[Window](Window))


class RateLimitStage(ControlStage):
    name = NAME
    tables = (WINDOWS,)

    def process(self, ctx: StageContext, record: InputRecord) -> None:
        if record.key is None or record.value is None:
            reject(ctx, record, "a rate-limited start needs its rate key and a value")
            return
        try:
            start = codec.decode(PendingStart, record.value)
        except codec.DecodeError as exc:
            reject(ctx, record, f"not a pending start: {exc}")
            return
        text = key_text(record.key)
        wf = self.app.get(start.workflow)
        option = wf.rate_limit if wf is not None else None
        if option is None:
            # Redeclared without a rateLimit (or removed) while this start was on its way:
            # nothing here judges it any more, the router takes it on.
            self.router.forward(ctx, start, headers=record.headers)
            return
        windows = ctx.table("windows")
        found = windows.get(record.key)
        window = found or Window()
        limit, period_ms = self._rate(start.workflow, option, text)
        decision = decide(window, limit, period_ms, ctx.now_ms)
        if isinstance(decision, Drop):
            self.router.decide(ctx, start, Outcome.dropped, key=text,
                               reason=_reason(limit, option.period if period_ms ==
                                              option.period_ms else format_duration(period_ms),
                                              text, decision.retry_after_ms),
                               retry_after_ms=decision.retry_after_ms, headers=record.headers)
            return
        windows.put(record.key, decision.window)
        if found is None:
            # One timer per row's life, not per admission: it moves itself on when it fires.
            ctx.timers.schedule(decision.window.forget_at(period_ms), _FORGET + record.key)
        self.router.forward(ctx, start, headers=record.headers, key=text)

    def fire(self, ctx: StageContext, due_ms: int, key: bytes, value: bytes) -> None:
        if not key.startswith(_FORGET):
            return
        kafka_key = key[len(_FORGET):]
        windows = ctx.table("windows")
        window = windows.get(kafka_key)
        if window is None:
            return
        workflow = _workflow(kafka_key)
        wf = self.app.get(workflow)
        option = wf.rate_limit if wf is not None else None
        period_ms = self._rate(workflow, option, None)[1] if option is not None else 0
        if option is None or window.forget_at(period_ms) <= ctx.now_ms:
            windows.delete(kafka_key)
        else:
            # Admissions came after the row was made: forget it after the newest one.
            ctx.timers.schedule(window.forget_at(period_ms), key)

    def _rate(self, workflow: str, option: RateLimit, key: str | None) -> tuple[int, int]:
        """The limit and period in force: an operator's override's, else the declared
        period and the declared limit, or the limits table's for `key` when the limit
        declares per_key (admission/limits.py)."""
        control = self.router.control
        row = (control.override(overrides.RATE_LIMIT, workflow)
               if control is not None and control.overrides else None)
        if row is not None:
            return (overrides.effective(option.limit, row),
                    overrides.effective_period(option.period_ms, row))
        limit = (option.limit if key is None
                 else key_limit(self.router.limits, option.per_key, key, option.limit))
        return limit, option.period_ms



def _workflow(kafka_key: bytes) -> str:
    # A rateLimit hop's budget is its workflow's name.
    return ControlKey.parse(kafka_key).budget


def _reason(limit: int, period: object, key: str, retry_after_ms: int) -> str:
    return (f"rateLimit: {limit} per {period} for key {key!r} already started; "
            f"the oldest of them leaves the window in {format_duration(retry_after_ms)}")
