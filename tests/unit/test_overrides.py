"""Operators' overrides of a concurrency limit, in the test driver (no broker): raised,
lowered, cleared, a pool's, the nth limit of a workflow with two, and what is refused."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from sluicegate.admission.overrides import (
    OverrideError,
    Target,
    concurrency_target,
    effective,
    override_key,
)
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Workflow
from sluicegate.schemas.records import Outcome, OverrideRow, RunEventKind
from sluicegate.testing import TestDriver


class Job(BaseModel):
    tenant: str = "t"


@pytest.fixture
def make() -> Iterator[Callable[..., TestDriver]]:
    made: list[TestDriver] = []

    def build(*workflows: Workflow, partitions: int = 1) -> TestDriver:
        driver = TestDriver(App(list(workflows)), Settings(partitions=partitions))
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


def starts(d: TestDriver, workflow: str, n: int, tenant: str = "t") -> list[str]:
    return [d.start(workflow, Job(tenant=tenant)).execution_id for _ in range(n)]


def admitted(d: TestDriver) -> list[str]:
    return [a.execution_id for a in d.admitted]


def complete(d: TestDriver, execution_id: str) -> None:
    d.report(execution_id, RunEventKind.completed)


# -- the pure part -----------------------------------------------------------------------


def test_the_limit_in_force_is_the_overrides_while_set_else_the_declared_one() -> None:
    row = OverrideRow(control="concurrency", budget="w", at_ms=1, limit=3)
    assert effective(10, row) == 3
    assert effective(10, None) == 10
    assert effective(10, OverrideRow(control="concurrency", budget="w", at_ms=2)) == 10


def test_an_override_is_keyed_by_its_limit_so_the_latest_per_limit_wins_compaction() -> None:
    assert override_key("concurrency", "pool:gpu") == b"override:concurrency:pool:gpu"
    assert override_key("concurrency", "orders#1") == b"override:concurrency:orders#1"


def test_the_nth_limit_and_a_pool_are_named_by_their_budgets() -> None:
    app = App([
        Workflow(name="a", payload=Job, concurrency=[
            Concurrency(limit=5, key="tenant"), Concurrency(limit=20, pool="gpu")]),
        Workflow(name="b", payload=Job, concurrency=Concurrency(limit=20, pool="gpu")),
        Workflow(name="c", payload=Job, concurrency=[
            Concurrency(limit=5, key="tenant"), Concurrency(limit=7)]),
    ])
    assert concurrency_target(app, "a") == Target("concurrency", "a", 5, ("a",))
    assert concurrency_target(app, "c", nth=2) == Target("concurrency", "c#1", 7, ("c",))
    assert concurrency_target(app, pool="gpu") == Target(
        "concurrency", "pool:gpu", 20, ("a", "b"))
    assert concurrency_target(app, "c", nth=2).describe() == "concurrency limit 2 of c"
    with pytest.raises(OverrideError, match="pool 'gpu', shared with other workflows: "
                                            "name it with --pool gpu"):
        concurrency_target(app, "a", nth=2)
    with pytest.raises(OverrideError, match="--nth must be between 1 and 2"):
        concurrency_target(app, "c", nth=3)
    with pytest.raises(OverrideError, match=r"no workflow declares a concurrency limit in "
                                            r"pool 'cpu' \(pools declared: gpu\)"):
        concurrency_target(app, pool="cpu")
    with pytest.raises(OverrideError, match="not declared"):
        concurrency_target(app, "nope")


def test_a_workflow_without_a_concurrency_limit_has_none_to_override() -> None:
    app = App([Workflow(name="w", payload=Job)])
    with pytest.raises(OverrideError, match="workflow w declares no concurrency limit"):
        concurrency_target(app, "w")


# -- the stage ---------------------------------------------------------------------------


def test_a_raised_override_admits_waiting_starts_at_once(make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=2))
    ids = starts(d, "w", 6)
    assert admitted(d) == ids[:2]
    d.limit("w", concurrency=5, reason="partner is back", by="ops")
    assert admitted(d) == ids[:5], "three more at once, in arrival order, none ended"
    assert [r.outcome for r in d.ledger if r.request_id == d.ledger[-1].request_id] == [
        Outcome.queued, Outcome.admitted]


def test_a_lowered_override_cancels_nothing_and_the_key_drains_down_to_it(make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=4))
    ids = starts(d, "w", 8)
    assert admitted(d) == ids[:4]
    d.limit("w", concurrency=1, reason="partner 503s")
    assert d.commands == [], "no run is cancelled"
    assert admitted(d) == ids[:4]
    for done in ids[:3]:
        complete(d, done)
        assert admitted(d) == ids[:4], "nothing admitted while over the new limit"
    complete(d, ids[3])
    assert admitted(d) == ids[:5], "at the new limit: one runs"
    complete(d, ids[4])
    assert admitted(d) == ids[:6]


def test_a_start_arriving_under_a_lowered_override_waits_for_the_override(make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=3, key="tenant")))
    d.limit("w", concurrency=1)
    first, second = starts(d, "w", 2)
    assert admitted(d) == [first]
    queued = next(r for r in d.ledger if r.outcome is Outcome.queued)
    assert queued.reason is not None and "1 of 1 slots of workflow w key 't'" in queued.reason
    assert "in use (an operator's override; declared 3);" in queued.reason
    complete(d, first)
    assert admitted(d) == [first, second]


def test_clearing_an_override_returns_to_the_declared_limit_and_admits_up_to_it(
        make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=3))
    d.limit("w", concurrency=1)
    ids = starts(d, "w", 5)
    assert admitted(d) == ids[:1]
    d.limit("w", concurrency=None, reason="all clear")
    assert admitted(d) == ids[:3]


def test_a_pools_override_applies_to_every_member(make: Any) -> None:
    a = Workflow(name="a", payload=Job, concurrency=Concurrency(limit=2, pool="gpu"))
    b = Workflow(name="b", payload=Job, concurrency=Concurrency(limit=2, pool="gpu"))
    d = make(a, b)
    ids = [*starts(d, "a", 3), *starts(d, "b", 3)]
    assert admitted(d) == ids[:2]
    d.limit(pool="gpu", concurrency=4)
    assert sorted(admitted(d)) == sorted([*ids[:3], ids[3]]), "the pool's four slots"
    d.limit(pool="gpu", concurrency=1)
    for e in list(admitted(d)):
        complete(d, e)
    assert len(admitted(d)) == 5, "one slot of the pool now: one more, not two"


def test_an_override_of_the_second_limit_leaves_the_first_in_force(make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=[
        Concurrency(limit=2, key="tenant"), Concurrency(limit=3)]))
    a = starts(d, "w", 3, tenant="a")
    b = starts(d, "w", 3, tenant="b")
    assert sorted(admitted(d)) == sorted([*a[:2], b[0]])
    d.limit("w", concurrency=10, nth=2)
    assert sorted(admitted(d)) == sorted([*a[:2], *b[:2]]), "each tenant still holds two"


def test_an_override_reaches_every_partition(make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, key="tenant")),
             partitions=4)
    waiting = [starts(d, "w", 3, tenant=t) for t in "abcdefgh"]
    assert len(admitted(d)) == 8
    d.limit("w", concurrency=3)
    assert len(admitted(d)) == 24, "every tenant on every partition: three each"
    assert {e for ids in waiting for e in ids} == set(admitted(d))


def test_an_override_set_while_the_partition_was_away_is_in_force_at_restore(
        make: Any) -> None:
    d = make(Workflow(name="w", payload=Job, concurrency=1))
    ids = starts(d, "w", 3)
    d.commit()
    # Written while no worker had the partition: only the table holds it when it restores.
    d.control.overrides["concurrency:w"] = OverrideRow(
        control="concurrency", budget="w", at_ms=d.now_ms, limit=3)
    d.restart()
    assert admitted(d) == ids


# -- the ledger rows `workflows limit` writes --------------------------------------------


def test_every_change_is_a_ledger_row_per_workflow_the_limit_judges_with_who_and_why() -> None:
    from sluicegate.ops.services.overrides import Change, ledger_rows

    pool = Target("concurrency", "pool:gpu", 20, ("a", "b"))
    row = OverrideRow(control="concurrency", budget="pool:gpu", at_ms=5, limit=4,
                      declared=20, reason="partner 503s", by="ana")
    rows = ledger_rows(Change(pool, 20, 4, row))
    assert [(r.workflow, r.outcome, r.control) for r in rows] == [
        ("a", Outcome.overridden, "override"), ("b", Outcome.overridden, "override")]
    assert rows[0].request_id == "override:concurrency:pool:gpu:5:a"
    assert rows[0].reason == ("override of the concurrency limit of pool:gpu: 20 -> 4 "
                              "(declared 20) by ana: partner 503s")
    cleared = OverrideRow(control="concurrency", budget="pool:gpu", at_ms=9, declared=20,
                          reason="all clear", by="bo")
    (first, _) = ledger_rows(Change(pool, 4, 20, cleared))
    assert first.reason == ("override of the concurrency limit of pool:gpu: 4 -> 20 "
                            "(cleared, the declared limit again) by bo: all clear")
    assert Change(pool, 4, 20, cleared).text() == (
        "cleared the override of the concurrency limit of pool:gpu: 4 -> 20 (the declared "
        "limit)")


# -- the console's preview -----------------------------------------------------------------


def test_a_preview_counts_the_starts_a_raise_admits_at_once_and_the_runs_a_lowering_drains(
) -> None:
    from sluicegate.ops.services.overrides import preview

    target = Target("concurrency", "w", 4, ("w",))
    held, waiting = {"a": 4, "b": 1, "c": 4}, {"a": 10, "b": 0, "c": 1}
    raised = preview(target, {}, 6, held, waiting)
    assert (raised.before, raised.after, raised.waiting, raised.admitted_now,
            raised.draining) == (4, 6, 11, 3, 0)
    lowered = preview(target, {}, 2, held, waiting)
    assert (lowered.admitted_now, lowered.draining) == (0, 4)
    now = {"concurrency:w": OverrideRow(control="concurrency", budget="w", at_ms=1, limit=2)}
    cleared = preview(target, now, None, {"a": 2}, {"a": 5})
    assert (cleared.before, cleared.after, cleared.admitted_now) == (2, 4, 2)


def test_a_cleared_override_of_a_per_key_limit_previews_each_key_back_at_its_own_limit(
) -> None:
    from sluicegate.ops.services.overrides import preview

    target = Target("concurrency", "w", 2, ("w",), per_key="tiers")
    now = {"concurrency:w": OverrideRow(control="concurrency", budget="w", at_ms=1, limit=1)}
    held, waiting = {"acme": 1, "free": 1}, {"acme": 9, "free": 9}
    # acme's row says 20: it admits 9 at once; free has none, so the declared 2: one more.
    cleared = preview(target, now, None, held, waiting, key_limits={"acme": 20})
    assert (cleared.before, cleared.after, cleared.admitted_now) == (1, 2, 10)
    # An override is every key's limit, whatever its row.
    assert preview(target, {}, 3, held, waiting, key_limits={"acme": 20}).admitted_now == 4


def test_the_starts_waiting_for_a_pool_are_counted_per_key_across_its_members() -> None:
    from sluicegate.ops.services.ledger import LedgerDb, fill
    from sluicegate.ops.services.overrides import waiting_by_key

    app = App([
        Workflow(name="a", payload=Job, concurrency=[
            Concurrency(limit=5, key="tenant"), Concurrency(limit=20, pool="gpu")]),
        Workflow(name="b", payload=Job, concurrency=Concurrency(limit=20, pool="gpu")),
    ])

    def queued(request_id: str, workflow: str, control: str, key: str) -> Any:
        from sluicegate.schemas.records import LedgerRecord

        return LedgerRecord(request_id=request_id, workflow=workflow, outcome=Outcome.queued,
                            requested_at_ms=1, decided_at_ms=1, key=key,
                            deferral="concurrency", control=control)

    db = LedgerDb(":memory:")
    fill(db, [queued("1", "a", "concurrency[1] pool:gpu", ""),
              queued("2", "b", "concurrency pool:gpu", ""),
              queued("3", "a", "concurrency[0]", "t1")])  # waits for its tenant's limit
    assert waiting_by_key(concurrency_target(app, pool="gpu"), app, db) == {"": 2}
    assert waiting_by_key(concurrency_target(app, "a"), app, db) == {"t1": 1}


def test_a_throttle_preview_keeps_the_turns_due_and_says_the_pace_after_them() -> None:
    from sluicegate.ops.services.overrides import preview

    target = Target("throttle", "pool:partner", 1, ("a", "b"), 2_000)
    doc = preview(target, {}, 10, {}, {"t1": 4, "t2": 2}, period_ms=2_000).to_json()
    assert doc == {
        "control": "throttle", "limit": "throttle of pool:partner", "budget": "pool:partner",
        "declared": 1, "declared_text": "1 per 2s", "before": 1, "after": 10,
        "old": "1 per 2s", "new": "10 per 2s", "waiting": 6, "admitted_now": 0,
        "draining": 0, "note": "each key's turn already due stands; the turns after it come "
                               "one each 200ms instead of one each 2s"}
    now = {"throttle:pool:partner": OverrideRow(control="throttle", budget="pool:partner",
                                                at_ms=1, limit=10, period_ms=2_000)}
    cleared = preview(target, now, None, {}, {}).to_json()
    assert (cleared["old"], cleared["new"]) == ("10 per 2s", "1 per 2s")


def test_a_rate_limit_preview_says_nothing_waits_there() -> None:
    from sluicegate.ops.services.ledger import LedgerDb
    from sluicegate.ops.services.overrides import preview, waiting_by_key

    target = Target("rateLimit", "alert", 2, ("alert",), 60_000)
    assert waiting_by_key(target, App([]), LedgerDb(":memory:")) == {}
    doc = preview(target, {}, 5, {}, {}, period_ms=60_000).to_json()
    assert (doc["old"], doc["new"], doc["waiting"], doc["admitted_now"]) == (
        "2 per 1m", "5 per 1m", 0, 0)
    assert doc["note"] == ("nothing waits at a rateLimit: the change decides the starts that "
                           "arrive after it")


def test_the_starts_waiting_for_a_throttles_turn_are_counted_per_key() -> None:
    from sluicegate.admission.overrides import target_of
    from sluicegate.declare import Throttle
    from sluicegate.ops.services.ledger import LedgerDb, fill
    from sluicegate.ops.services.overrides import waiting_by_key
    from sluicegate.schemas.records import LedgerRecord

    pace = Throttle(limit=1, period="2s", key="tenant", pool="partner")
    app = App([Workflow(name="a", payload=Job, throttle=pace, concurrency=3),
               Workflow(name="b", payload=Job, throttle=pace)])

    def queued(request_id: str, workflow: str, deferral: str, control: str) -> Any:
        return LedgerRecord(request_id=request_id, workflow=workflow, outcome=Outcome.queued,
                            requested_at_ms=1, decided_at_ms=1, key="t1", deferral=deferral,
                            control=control)

    db = LedgerDb(":memory:")
    fill(db, [queued("1", "a", "throttle", "throttle pool:partner"),
              queued("2", "b", "throttle", "throttle pool:partner"),
              queued("3", "a", "concurrency", "concurrency")])
    assert waiting_by_key(target_of(app, None, "throttle", pool="partner"), app, db) == {
        "t1": 2}


# -- the console's request -----------------------------------------------------------------


def test_the_console_asks_for_any_limit_the_command_line_changes() -> None:
    from sluicegate.ops.inspect import LimitRequest, check_limit

    assert check_limit({"workflow": "w", "concurrency": 3, "reason": " why "}) == LimitRequest(
        "w", None, 1, 3, "why", "dashboard")
    assert check_limit({"pool": "gpu", "nth": 1, "clear": True, "by": "ana"}) == LimitRequest(
        None, "gpu", 1, None, None, "ana")
    assert check_limit({"workflow": "w", "nth": 2, "concurrency": 9}).nth == 2
    assert check_limit({"control": "throttle", "pool": "partner", "rate": "30/1m"}) == (
        LimitRequest(None, "partner", 1, None, None, "dashboard", "throttle", "30/1m"))
    assert check_limit({"control": "rateLimit", "workflow": "alert", "clear": True}) == (
        LimitRequest("alert", None, 1, None, None, "dashboard", "rateLimit", None))


@pytest.mark.parametrize(("body", "says"), [
    ({"workflow": "w"}, "give concurrency (a positive number), or clear: true"),
    ({"workflow": "w", "concurrency": 0}, "concurrency must be a positive number"),
    ({"workflow": "w", "concurrency": 2, "clear": True}, "give concurrency"),
    ({"workflow": "w", "rate": "2/1m"}, "a concurrency limit is a number"),
    ({"control": "throttle", "workflow": "w"}, "give the throttle's rate (LIMIT/PERIOD"),
    ({"control": "rateLimit", "workflow": "w", "concurrency": 3}, "a rateLimit is a rate"),
    ({"control": "rateLimit", "workflow": "w", "rate": "2/1m", "clear": True},
     "give the rateLimit's rate"),
    ({"control": "pause", "workflow": "w"}, "control must be one of concurrency, throttle, "
                                            "rateLimit"),
    ({"workflow": "w", "concurrency": 2, "nth": 3}, "nth must be 1 or 2"),
])
def test_the_console_refuses_a_request_that_names_no_change(body: dict[str, Any],
                                                            says: str) -> None:
    from sluicegate.ops.inspect import RequestError, check_limit

    with pytest.raises(RequestError, match=re.escape(says)):
        check_limit(body)


# -- a rateLimit ---------------------------------------------------------------------------


def test_a_rate_limit_override_decides_the_starts_after_it_and_clearing_returns_to_the_declared(
        make: Any) -> None:
    from sluicegate.declare import RateLimit

    d = make(Workflow(name="alert", payload=Job, rate_limit=RateLimit(limit=2, period="1m")))
    starts(d, "alert", 3)
    assert len(d.admitted) == 2
    dropped = [r for r in d.ledger if r.outcome is Outcome.dropped]
    assert dropped[-1].reason is not None and dropped[-1].reason.startswith(
        "rateLimit: 2 per 1m for key '' already started")
    d.limit("alert", rate_limit=(4, 10_000), reason="storm is over")
    starts(d, "alert", 3)
    assert len(d.admitted) == 4, "two more under 4 per 10s, the third dropped"
    last = [r for r in d.ledger if r.outcome is Outcome.dropped][-1]
    assert last.reason is not None and last.reason.startswith("rateLimit: 4 per 10s")
    d.advance(10_000)
    starts(d, "alert", 1)
    assert len(d.admitted) == 5, "the overridden period has passed"
    d.limit("alert", control="rateLimit", reason="back to normal")
    starts(d, "alert", 2)
    assert len(d.admitted) == 6, "2 per minute again: one admitted since the last minute began"


def test_a_rate_limit_override_names_a_workflow_that_declares_one() -> None:
    from sluicegate.admission.overrides import target_of
    from sluicegate.declare import RateLimit

    app = App([Workflow(name="alert", payload=Job, rate_limit=RateLimit(limit=2, period="1m")),
               Workflow(name="w", payload=Job, concurrency=2)])
    assert target_of(app, "alert", "rateLimit") == Target("rateLimit", "alert", 2, ("alert",),
                                                          60_000)
    with pytest.raises(OverrideError, match="workflow w declares no rateLimit"):
        target_of(app, "w", "rateLimit")
    with pytest.raises(OverrideError, match="no --pool, no --nth"):
        target_of(app, "alert", "rateLimit", nth=2)


def test_a_rate_limit_change_says_the_limit_and_the_period_before_and_after() -> None:
    from sluicegate.ops.services.overrides import Change, ledger_rows

    target = Target("rateLimit", "alert", 2, ("alert",), 60_000)
    row = OverrideRow(control="rateLimit", budget="alert", at_ms=5, limit=4, period_ms=10_000,
                      declared=2, reason="storm is over", by="ana")
    change = Change(target, 2, 4, row, 60_000, 10_000)
    assert change.text() == "rateLimit of alert: 2 per 1m -> 4 per 10s (declared 2 per 1m)"
    (ledger,) = ledger_rows(change)
    assert ledger.reason == ("override of the rateLimit of alert: 2 per 1m -> 4 per 10s "
                             "(declared 2 per 1m) by ana: storm is over")


def test_a_rate_is_a_limit_per_a_period_as_declared() -> None:
    from sluicegate.ops.services.overrides import parse_rate

    assert parse_rate("10/1m") == (10, 60_000)
    assert parse_rate("100 / 1 hour") == (100, 3_600_000)
    for bad in ("10", "ten/1m", "10/soon"):
        with pytest.raises(OverrideError, match="a rate is LIMIT/PERIOD"):
            parse_rate(bad)


# -- a throttle ----------------------------------------------------------------------------


def test_a_throttle_override_paces_the_turns_after_the_one_already_due(make: Any) -> None:
    from sluicegate.declare import Throttle

    d = make(Workflow(name="sync", payload=Job, throttle=Throttle(limit=1, period="10s")))
    starts(d, "sync", 6)
    assert len(d.admitted) == 1
    d.limit("sync", throttle=(10, 10_000), reason="partner raised our quota")
    d.advance(9_999)
    assert len(d.admitted) == 1, "the turn already due stands"
    d.advance(1)
    assert len(d.admitted) == 2
    d.advance(2_000)
    assert len(d.admitted) == 4, "then one a second"
    d.limit("sync", control="throttle", reason="back to the declared pace")
    d.advance(1_000)
    assert len(d.admitted) == 5, "the turn already due stands"
    d.advance(9_999)
    assert len(d.admitted) == 5
    d.advance(1)
    assert len(d.admitted) == 6, "then one each 10s"


def test_a_throttle_pool_is_overridden_as_a_pool_and_several_throttles_are_refused() -> None:
    from sluicegate.admission.overrides import target_of
    from sluicegate.declare import Throttle

    pace = Throttle(limit=60, period="1m", pool="partner")
    app = App([Workflow(name="a", payload=Job, throttle=pace),
               Workflow(name="b", payload=Job, throttle=pace),
               Workflow(name="c", payload=Job, throttle=[
                   Throttle(limit=1, period="1s", key="tenant"),
                   Throttle(limit=10, period="1s")])])
    assert target_of(app, None, "throttle", pool="partner") == Target(
        "throttle", "pool:partner", 60, ("a", "b"), 60_000)
    with pytest.raises(OverrideError, match="name it with --pool partner"):
        target_of(app, "a", "throttle")
    with pytest.raises(OverrideError, match="declares 2 throttles"):
        target_of(app, "c", "throttle")


def test_a_throttle_overridden_while_the_partition_was_away_paces_it_at_restore(
        make: Any) -> None:
    from sluicegate.declare import Throttle

    d = make(Workflow(name="sync", payload=Job, throttle=Throttle(limit=1, period="10s")))
    starts(d, "sync", 4)
    d.commit()
    d.control.overrides["throttle:sync"] = OverrideRow(
        control="throttle", budget="sync", at_ms=d.now_ms, limit=10, period_ms=10_000)
    d.restart()
    d.advance(12_000)
    assert len(d.admitted) == 4, "the turn due at 10s, then one a second"
