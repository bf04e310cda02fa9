"""Identity, rateLimit, debounce, batch and cancelOn as the worker runs them, through the
test driver: each a state machine whose expected outcome is the control's pure core run
on the same inputs (the cores have property tests of their own), checked against what
the stage wrote: admissions, ledger rows, engine commands, store rows."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pydantic import BaseModel

from sluicegate.admission.stages.batch import OpenBatch, add_item, batch_payload, batch_rule
from sluicegate.admission.stages.cancelon import SWEEP_GRACE_MS, in_window
from sluicegate.admission.stages.debounce import Burst, arrive, debounce_rule
from sluicegate.admission.stages.identity import IdentityRow, Spent
from sluicegate.admission.stages.identity import decide as identity_decide
from sluicegate.admission.stages.identity import ended as identity_ended
from sluicegate.admission.stages.ratelimit import Admit, Window
from sluicegate.admission.stages.ratelimit import decide as rate_decide
from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Debounce,
    Idempotency,
    RateLimit,
    Workflow,
)
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.records import Outcome, RunEventKind
from sluicegate.testing import TestDriver

KEYS = ("a", "b")
MACHINE = settings(max_examples=25, stateful_step_count=25, deadline=None)


class Order(BaseModel):
    orderId: str


class Click(BaseModel):
    siteId: str
    n: int = 0


class Clicks(BaseModel):
    items: list[Click]


class Edit(BaseModel):
    rowId: str
    text: str = ""


class Tour(BaseModel):
    rowId: str
    issueKey: str


class IssueDeleted(BaseModel):
    issueKey: str


class DriverMachine(RuleBasedStateMachine):
    """A driver over one workflow, closed at the end of the run."""

    driver: TestDriver | None = None

    def open(self, *workflows: Workflow) -> TestDriver:
        self.driver = TestDriver(App(list(workflows)))
        return self.driver

    @property
    def d(self) -> TestDriver:
        assert self.driver is not None
        return self.driver

    def teardown(self) -> None:
        if self.driver is not None:
            self.driver.close()


# -- identity: idempotency keys, with a ttl after the run ends ------------------------


class IdentityKeys(DriverMachine):
    """A start takes its key or answers `existing` with the run that holds it, as
    `identity.decide` says; a run's end starts its key's ttl (`identity.ended`)."""

    TTL_MS = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.open(Workflow(name="order", payload=Order,
                           idempotency=Idempotency(key="orderId", ttl="10s")))
        self.rows: dict[str, IdentityRow] = {}
        self.live: dict[str, str] = {}  # execution id -> its key
        self.admitted: list[str] = []

    @rule(key=st.sampled_from(KEYS))
    def a_start_arrives(self, key: str) -> None:
        started = self.d.start("order", {"orderId": key})
        decision = identity_decide(self.rows.get(key), started.execution_id,
                                   started.request_id, self.d.now_ms)
        (row,) = [r for r in self.d.ledger if r.request_id == started.request_id]
        if isinstance(decision, Spent):
            assert (row.outcome, row.execution_id) == (Outcome.existing,
                                                        decision.execution_id)
            return
        assert (row.outcome, row.execution_id) == (Outcome.admitted, started.execution_id)
        self.rows[key] = decision.row
        self.live[started.execution_id] = key
        self.admitted.append(started.execution_id)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def a_run_ends(self, data: st.DataObject) -> None:
        execution_id = data.draw(st.sampled_from(sorted(self.live)))
        key = self.live.pop(execution_id)
        self.d.report(execution_id, RunEventKind.completed)
        self.rows[key] = identity_ended(self.rows[key], execution_id, self.d.now_ms,
                                        self.TTL_MS)

    @rule(ms=st.integers(0, 15_000))
    def time_passes(self, ms: int) -> None:
        self.d.advance(ms)

    @rule()
    def a_worker_takes_over(self) -> None:
        self.d.commit()
        self.d.restart()

    @invariant()
    def every_fresh_key_was_admitted_once(self) -> None:
        assert [a.execution_id for a in self.d.admitted] == self.admitted


TestIdentityKeys = IdentityKeys.TestCase
TestIdentityKeys.settings = MACHINE


# -- rateLimit: an exact sliding window per key ------------------------------------------


class RateLimitWindows(DriverMachine):
    """Each start is admitted or dropped (with its retry_after) as `ratelimit.decide`
    says; a key's row is the core's window, and is gone once its newest admission left
    the window."""

    @initialize(limit=st.integers(1, 3), period_s=st.integers(1, 5))
    def declare(self, limit: int, period_s: int) -> None:
        self.limit, self.period_ms = limit, period_s * 1000
        self.open(Workflow(name="alert", payload=Order, rate_limit=RateLimit(
            limit=limit, period=f"{period_s}s", key="orderId")))
        self.windows: dict[str, Window] = {}

    @rule(key=st.sampled_from(KEYS))
    def a_start_arrives(self, key: str) -> None:
        started = self.d.start("alert", {"orderId": key})
        decision = rate_decide(self.windows.get(key, Window()), self.limit, self.period_ms,
                               self.d.now_ms)
        (row,) = [r for r in self.d.ledger if r.request_id == started.request_id]
        if isinstance(decision, Admit):
            assert row.outcome is Outcome.admitted
            assert self.d.admitted[-1].execution_id == started.execution_id
            self.windows[key] = decision.window
        else:
            assert (row.outcome, row.retry_after_ms) == (Outcome.dropped,
                                                         decision.retry_after_ms)

    @rule(ms=st.integers(0, 4_000))
    def time_passes(self, ms: int) -> None:
        self.d.advance(ms)

    @rule()
    def a_worker_takes_over(self) -> None:
        self.d.commit()
        self.d.restart()

    @invariant()
    def each_row_is_the_cores_window_while_it_says_something(self) -> None:
        if self.driver is None:
            return
        stored = {key: Window.decode(raw) for key, raw
                  in self.d.store("ratelimit").items(STATE_PREFIX + b"W")}
        expected = {
            STATE_PREFIX + b"W" + f"alert\x1f{key}".encode(): window
            for key, window in self.windows.items()
            if window.admitted and window.forget_at(self.period_ms) > self.d.now_ms}
        assert stored == expected


TestRateLimitWindows = RateLimitWindows.TestCase
TestRateLimitWindows.settings = MACHINE


# -- debounce: the latest payload runs once the key is quiet ----------------------------


def _admissions(d: TestDriver) -> Counter[tuple[str, int, bytes]]:
    return Counter((a.execution_id, a.admitted_at_ms, a.payload) for a in d.admitted)


class Debouncing(DriverMachine):
    """Bursts per key as `defer.arrive` builds them: each start a later one supersedes is
    collapsed into the burst's run, and the burst runs with its latest payload when its
    quiet time (or its cap) comes, as `Burst.due_ms` says."""

    def __init__(self) -> None:
        super().__init__()
        wf = Workflow(name="edit", payload=Edit,
                      debounce=Debounce(key="rowId", period="10s", timeout="25s"))
        self.open(wf)
        rule_ = debounce_rule(wf)
        assert rule_ is not None
        self.rule = rule_
        self.bursts: dict[str, tuple[Burst, bytes]] = {}
        self.runs: Counter[tuple[str, int, bytes]] = Counter()
        self.collapsed: set[tuple[str, str]] = set()

    def _run_due(self, until: int) -> None:
        for key, (burst, payload) in list(self.bursts.items()):
            due = burst.due_ms(self.rule)
            if due <= until:
                self.runs[(burst.execution_id, due, payload)] += 1
                del self.bursts[key]

    @rule(key=st.sampled_from(KEYS), text=st.sampled_from(("x", "y", "z")))
    def an_edit_arrives(self, key: str, text: str) -> None:
        payload = {"rowId": key, "text": text}
        started = self.d.start("edit", payload)
        held = self.bursts.get(key)
        arrival = arrive(held[0] if held else None, started.execution_id, started.request_id,
                         self.d.now_ms, self.d.now_ms)
        if arrival.superseded is not None:
            self.collapsed.add((arrival.superseded, arrival.burst.execution_id))
        self.bursts[key] = (arrival.burst, codec.dump_payload(payload))

    @rule(ms=st.integers(0, 12_000))
    def time_passes(self, ms: int) -> None:
        self.d.advance(ms)
        self._run_due(self.d.now_ms)

    @rule()
    def a_worker_takes_over(self) -> None:
        self.d.commit()
        self.d.restart()

    @invariant()
    def the_runs_and_the_collapsed_are_the_cores(self) -> None:
        assert _admissions(self.d) == self.runs
        assert {(r.request_id, r.execution_id) for r in self.d.ledger
                if r.outcome is Outcome.collapsed} == self.collapsed


TestDebouncing = Debouncing.TestCase
TestDebouncing.settings = MACHINE


# -- batch: items collected per key, run full, over size, or at the deadline ------------


class Batching(DriverMachine):
    """Batches per key as `defer.add_item` fills them: one runs at once when full or when
    the next item would take it past max_bytes, else at its oldest item's deadline
    (`OpenBatch.due_ms`), with the items' payload in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        wf = Workflow(name="clicks", payload=Clicks, batch=Batch(
            item=Click, key="siteId", max_size=3, max_bytes=80, timeout="10s"))
        self.open(wf)
        rule_ = batch_rule(wf, self.d.settings.max_payload_bytes)
        assert rule_ is not None
        self.rule = rule_
        self.batches: dict[str, tuple[OpenBatch, list[bytes]]] = {}
        self.runs: Counter[tuple[str, int, bytes]] = Counter()

    def _run(self, batch: OpenBatch, items: list[bytes], at: int) -> None:
        self.runs[(batch.execution_id, at, batch_payload(items))] += 1

    @rule(key=st.sampled_from(KEYS), n=st.sampled_from((1, 22, 333_333)))
    def an_item_arrives(self, key: str, n: int) -> None:
        item = {"siteId": key, "n": n}
        started = self.d.start("clicks", item)
        now = self.d.now_ms
        held = self.batches.pop(key, None)
        raw = codec.dump_payload(item)
        added = add_item(held[0] if held else None, self.rule, started.execution_id,
                         len(raw), now)
        items = [raw]
        if held is not None and added.flush_open:
            self._run(*held, now)
        elif held is not None:
            items = [*held[1], raw]
        if added.full:
            self._run(added.batch, items, now)
        else:
            self.batches[key] = (added.batch, items)

    @rule(ms=st.integers(0, 12_000))
    def time_passes(self, ms: int) -> None:
        self.d.advance(ms)
        for key, (batch, items) in list(self.batches.items()):
            if batch.due_ms(self.rule) <= self.d.now_ms:
                self._run(batch, items, batch.due_ms(self.rule))
                del self.batches[key]

    @rule()
    def a_worker_takes_over(self) -> None:
        self.d.commit()
        self.d.restart()

    @invariant()
    def the_runs_are_the_cores(self) -> None:
        assert _admissions(self.d) == self.runs


TestBatching = Batching.TestCase
TestBatching.settings = MACHINE


# -- cancelOn: an event cancels the live runs it matches, once ---------------------------


class CancellingOnEvents(DriverMachine):
    """Runs admitted at once, ended by their engine; an event cancels every live run of
    its issue that began in its window (`cancelon.in_window`), each once: an engine
    command and a `cancelled` ledger row."""

    WITHIN_MS = 20_000

    def __init__(self) -> None:
        super().__init__()
        self.open(Workflow(name="tour", payload=Tour, cancel_on=[CancelOn(
            event="issue.deleted", schema=IssueDeleted,
            match="event.issueKey == payload.issueKey", within="20s")]))
        self.live: dict[str, tuple[str, int]] = {}  # execution id -> (issue, admitted at)
        self.cancelled: list[str] = []
        self.events: list[tuple[str, int]] = []  # (issue, at)
        self.n = 0

    def _matches(self, issue: str, began: int, event: tuple[str, int]) -> bool:
        return event[0] == issue and in_window(began, event[1], self.WITHIN_MS)

    @rule(issue=st.sampled_from(("K1", "K2")))
    def a_run_starts(self, issue: str) -> None:
        self.n += 1
        started = self.d.start("tour", {"rowId": f"r{self.n}", "issueKey": issue})
        now = self.d.now_ms
        # The runs table reaches the correlator when the cycle commits; a row that comes
        # after an event is judged against it while it is kept (an event at the same
        # instant as the run's start cancels it: at or before).
        self.d.commit()
        kept = [e for e in self.events if now < e[1] + SWEEP_GRACE_MS]
        if any(self._matches(issue, now, event) for event in kept):
            self.cancelled.append(started.execution_id)
        else:
            self.live[started.execution_id] = (issue, now)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def a_run_ends(self, data: st.DataObject) -> None:
        execution_id = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[execution_id]
        self.d.report(execution_id, RunEventKind.completed)
        self.d.commit()

    @rule(issue=st.sampled_from(("K1", "K2")))
    def the_issue_is_deleted(self, issue: str) -> None:
        now = self.d.now_ms
        self.d.event("issue.deleted", {"issueKey": issue})
        self.events.append((issue, now))
        for execution_id, (run_issue, began) in sorted(self.live.items()):
            if self._matches(run_issue, began, (issue, now)):
                del self.live[execution_id]
                self.cancelled.append(execution_id)
        self.d.commit()

    @rule(ms=st.integers(0, 15_000))
    def time_passes(self, ms: int) -> None:
        self.d.advance(ms)

    @rule()
    def a_worker_takes_over(self) -> None:
        self.d.commit()
        self.d.restart()

    @invariant()
    def each_matching_live_run_is_cancelled_once(self) -> None:
        assert sorted(c.execution_id for c in self.d.commands) == sorted(self.cancelled)
        assert sorted(r.execution_id or "" for r in self.d.ledger
                      if r.outcome is Outcome.cancelled) == sorted(self.cancelled)


TestCancellingOnEvents = CancellingOnEvents.TestCase
TestCancellingOnEvents.settings = MACHINE
