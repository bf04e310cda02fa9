"""The batch core: batches against a reference model of SPEC.md section 3, step 3."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.admission.stages.batch import (
    EMPTY_BATCH_BYTES,
    BatchRule,
    OpenBatch,
    add_item,
    batch_payload,
)

SECOND = 1000


@dataclass(frozen=True)
class Run:
    kind: str  # "run" or "expire"
    at_ms: int
    members: tuple[int, ...]


def reference(items: list[tuple[int, bytes]], rule: BatchRule) -> list[Run]:
    """Greedy, on the real payload bytes: an item joins the open batch unless the batch is
    owed its deadline (or expiry) by then, or the item would take the payload past
    max_bytes; a batch runs as soon as it has max_size items or no byte of room."""
    out: list[Run] = []
    open_: list[int] = []

    def payload(members: list[int]) -> bytes:
        return batch_payload([items[m][1] for m in members])

    def end(members: list[int]) -> tuple[str, int]:
        first = items[members[0]][0]
        run_at = first + rule.timeout_ms
        if rule.expire_ms is not None and first + rule.expire_ms < run_at:
            return "expire", first + rule.expire_ms
        return "run", run_at

    for i, (t, _) in enumerate(items):
        if open_ and t >= end(open_)[1]:
            out.append(Run(*end(open_), tuple(open_)))
            open_ = []
        if open_ and len(payload([*open_, i])) > rule.max_bytes:
            out.append(Run("run", t, tuple(open_)))
            open_ = []
        open_.append(i)
        if len(open_) >= rule.max_size or len(payload(open_)) >= rule.max_bytes:
            out.append(Run("run", t, tuple(open_)))
            open_ = []
    if open_:
        out.append(Run(*end(open_), tuple(open_)))
    return out


def simulate(items: list[tuple[int, bytes]], rule: BatchRule) -> list[Run]:
    """Drive the core as the stage does (an arrival settles a batch already due)."""
    out: list[Run] = []
    batch: OpenBatch | None = None
    members: list[int] = []

    def owed(b: OpenBatch, verdict: str) -> int:
        expires = b.expires_ms(rule)
        return b.due_ms(rule) if verdict == "run" or expires is None else expires

    for i, (t, body) in enumerate(items):
        if batch is not None:
            verdict = batch.settle(rule, t)
            if verdict is not None:
                out.append(Run(verdict, owed(batch, verdict), tuple(members)))
                batch, members = None, []
        added = add_item(batch, rule, f"e{i}", len(body), t)
        if added.flush_open:
            out.append(Run("run", t, tuple(members)))
            members = []
        members.append(i)
        assert added.batch.execution_id == f"e{members[0]}"  # the oldest item's id
        assert added.batch.size == len(batch_payload([items[m][1] for m in members]))
        batch = added.batch
        if added.full:
            out.append(Run("run", t, tuple(members)))
            batch, members = None, []
    if batch is not None:
        verdict = batch.settle(rule, batch.wake_ms(rule))
        assert verdict is not None
        out.append(Run(verdict, owed(batch, verdict), tuple(members)))
    return out


rules = st.builds(
    BatchRule,
    max_size=st.integers(1, 10),
    max_bytes=st.integers(EMPTY_BATCH_BYTES + 1, 200),
    timeout_ms=st.integers(1, 60).map(lambda n: n * SECOND),
    expire_ms=st.none() | st.integers(1, 90).map(lambda n: n * SECOND),
)


@st.composite
def stream(draw: st.DrawFn) -> list[tuple[int, bytes]]:
    out, now = [], 1_700_000_000_000
    for gap, text in draw(st.lists(st.tuples(st.integers(0, 20 * SECOND), st.text(max_size=30)),
                                   max_size=60)):
        now += gap
        out.append((now, json.dumps({"v": text}, separators=(",", ":")).encode()))
    return out


@given(rules, stream())
def test_batches_form_as_the_reference_model_says(rule: BatchRule,
                                                  items: list[tuple[int, bytes]]) -> None:
    assert simulate(items, rule) == reference(items, rule)


@given(rules, stream())
def test_every_item_runs_once_in_order_and_no_batch_breaks_its_caps(
        rule: BatchRule, items: list[tuple[int, bytes]]) -> None:
    runs = simulate(items, rule)
    assert [m for r in runs for m in r.members] == list(range(len(items)))
    for run in runs:
        assert 1 <= len(run.members) <= rule.max_size
        payload = batch_payload([items[m][1] for m in run.members])
        # Only an item too big on its own makes a payload past max_bytes, and it runs alone.
        assert len(payload) <= rule.max_bytes or len(run.members) == 1
        first = items[run.members[0]][0]
        assert run.at_ms <= first + rule.timeout_ms  # a deadline, never reset
        assert json.loads(payload) == {"items": [json.loads(items[m][1]) for m in run.members]}


def test_three_clicks_run_together_ten_seconds_after_the_first() -> None:
    rule = BatchRule(max_size=100, max_bytes=4 * 1024 * 1024, timeout_ms=10 * SECOND)
    clicks = [(0, b'{"siteId":"s1"}'), (2 * SECOND, b'{"siteId":"s1"}'),
              (9 * SECOND, b'{"siteId":"s1"}')]
    assert simulate(clicks, rule) == [Run("run", 10 * SECOND, (0, 1, 2))]


def test_two_hundred_and_fifty_items_make_batches_of_100_100_and_50() -> None:
    rule = BatchRule(max_size=100, max_bytes=4 * 1024 * 1024, timeout_ms=10 * SECOND)
    items = [(0, b'{"n":%d}' % i) for i in range(250)]
    assert [len(r.members) for r in simulate(items, rule)] == [100, 100, 50]


def test_an_item_that_does_not_fit_runs_the_open_batch_first() -> None:
    rule = BatchRule(max_size=100, max_bytes=EMPTY_BATCH_BYTES + 21, timeout_ms=10 * SECOND)
    ten = b'"xxxxxxxx"'  # 10 bytes: two fit with their comma (21), a third does not
    added = add_item(None, rule, "e0", len(ten), 0)
    added = add_item(added.batch, rule, "e1", len(ten), 0)
    assert added.full and added.batch.count == 2
    first = add_item(None, rule, "e2", 15, 0)
    second = add_item(first.batch, rule, "e3", 10, 0)
    assert second.flush_open and second.batch == OpenBatch("e3", 0, 1, EMPTY_BATCH_BYTES + 10)


def test_a_window_of_events_runs_after_its_quiet_time_within_its_timeout() -> None:
    # A debounce handing over every event: the deadline moves with each arrival, capped
    # by the timeout from the first.
    rule = BatchRule(max_size=100, max_bytes=4 * 1024 * 1024, timeout_ms=60 * SECOND,
                     quiet_ms=10 * SECOND, field=b"events")
    window = None
    for at in (0, 5 * SECOND, 12 * SECOND):
        window = add_item(window, rule, f"e{at}", 10, at).batch
        assert window.due_ms(rule) == at + 10 * SECOND
    assert window is not None and window.execution_id == "e0"
    for at in range(20 * SECOND, 70 * SECOND, 9 * SECOND):
        window = add_item(window, rule, f"e{at}", 10, at).batch
    assert window.due_ms(rule) == 60 * SECOND  # the timeout from the first event
    uncapped = BatchRule(max_size=100, max_bytes=4 * 1024 * 1024, timeout_ms=None,
                         quiet_ms=10 * SECOND, field=b"events")
    assert window.due_ms(uncapped) == window.last_ms + 10 * SECOND
    assert batch_payload([b"1", b"2"], b"events") == b'{"events":[1,2]}'
    assert uncapped.empty_bytes == len(b'{"events":[]}')
