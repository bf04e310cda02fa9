"""The concurrency stage: its pure core, and the stage itself in the test driver (no
broker): slots, queues, fairness, priority, modes, queue caps, timeouts, removed
workflows."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pydantic import BaseModel

from sluicegate.admission import pending
from sluicegate.admission.pending import COUNTED
from sluicegate.admission.stages.concurrency import (
    NAME,
    REMOVED,
    WAITING,
    ConcurrencyStage,
    Limit,
    Occupancy,
    Verdict,
    Where,
    arrive,
    expires_at,
    frees,
    lane_hop,
    waiter,
)
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    CancelOn,
    Concurrency,
    Priority,
    Throttle,
    Timeouts,
    Workflow,
)
from sluicegate.engine.timers import STATE_PREFIX
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    AdmittedKind,
    Origin,
    Outcome,
    PendingStart,
    Record,
    Release,
    ReleaseKind,
    RunEventKind,
    RunStatus,
    Slot,
)
from sluicegate.testing import TestDriver
from sluicegate.topology.keys import key_text
from sluicegate.topology.route import control_name, route_for
from sluicegate.topology.topics import STATEFUL_STAGES

R = TypeVar("R", bound=Record)


class Job(BaseModel):
    tenant: str
    p: int = 0


class TenantGone(BaseModel):
    tenant: str


# Declared by the state machines' workflows, so cancelOn's index of the waiting starts by
# workflow is among the derived rows they check (no event is ever sent).
ON_TENANT_GONE = [CancelOn(event="tenant.gone", schema=TenantGone,
                           match="event.tenant == payload.tenant")]


def _pending(kind: AdmittedKind = AdmittedKind.start, arrived: int = 1000) -> PendingStart:
    return PendingStart(
        execution_id="e", workflow="w", payload=b"{}", origin=Origin.event, kind=kind,
        declaration_version="v", hop=1, request_id="r", request_ids=["r"],
        requested_at_ms=arrived, arrived_at_ms=arrived, priority=0.0, slots=[])


# -- the pure core -------------------------------------------------------------------


@pytest.mark.parametrize("execution_id,workflow", [
    ("e", "w"), ("x" * 63, "w"), ("x" * 64, "wf"), ("é" * 300, "wörk\x1fflow"), ("", "")])
def test_a_waiting_starts_id_and_workflow_read_in_place_are_what_a_decode_gives(
        execution_id: str, workflow: str) -> None:
    value = codec.encode(replace(_pending(), execution_id=execution_id, workflow=workflow))
    header = codec.default().header_of(PendingStart)
    assert waiter(value, header) == (execution_id.encode(), workflow)
    # Not this release's layout (another header): decoded whole, the same answer.
    assert waiter(value, b"\xc3\x01" + b"\x00" * 8) == (execution_id.encode(), workflow)
    # Cut short, it is not read in place: the decode says what is wrong.
    with pytest.raises(codec.DecodeError):
        waiter(value[:len(header) + 1], header)


def test_the_waiting_index_keeps_the_queue_row_and_reads_the_layout_before_too() -> None:
    key, lane = "pool\x1ftenant\x1fa", "w\x1fb"  # 0x1f in both
    row = pending.ROW_PREFIX + pending.queue_name(f"{key}\x1f{lane}".encode()) + b"\x00" * 16
    where = Where()
    assert where.encode((lane, row)) is row  # no copy: the queue's own key
    assert where.decode(row) == (None, row)
    assert Where.lane(key, row) == lane
    before = where.legacy_encode((lane, row))
    assert before == len(lane).to_bytes(4, "big") + lane.encode() + row
    assert where.decode(before) == (lane, row)


def test_a_start_takes_a_free_slot_when_nobody_waits() -> None:
    assert arrive(Occupancy(2, 0), Limit(3), holding=False, queued=False,
                  resume=False) is Verdict.take


def test_a_start_waits_when_the_key_is_full_or_others_wait_before_it() -> None:
    assert arrive(Occupancy(3, 0), Limit(3), holding=False, queued=False,
                  resume=False) is Verdict.wait
    assert arrive(Occupancy(1, 4), Limit(3), holding=False, queued=False,
                  resume=False) is Verdict.wait


def test_over_max_queued_a_start_is_dropped_but_a_resume_still_waits() -> None:
    full = Occupancy(3, 2)
    assert arrive(full, Limit(3, max_queued=2), holding=False, queued=False,
                  resume=False) is Verdict.full
    assert arrive(full, Limit(3, max_queued=2), holding=False, queued=False,
                  resume=True) is Verdict.wait


def test_a_holder_keeps_its_slot_and_a_waiting_start_is_not_queued_twice() -> None:
    assert arrive(Occupancy(3, 0), Limit(3), holding=True, queued=False,
                  resume=True) is Verdict.keep
    assert arrive(Occupancy(3, 1), Limit(3), holding=False, queued=True,
                  resume=True) is Verdict.repeat


def test_a_suspension_frees_a_slot_only_in_steps_mode() -> None:
    assert frees(ReleaseKind.suspended, "steps")
    assert not frees(ReleaseKind.suspended, "runs")
    for mode in ("runs", "steps"):
        assert frees(ReleaseKind.ended, mode) and frees(ReleaseKind.expired, mode)


def test_timeouts_start_counts_from_the_first_arrival_and_never_expires_a_resume() -> None:
    assert expires_at(_pending(arrived=1000), 60_000) == 61_000
    assert expires_at(_pending(arrived=1000), None) is None
    assert expires_at(_pending(AdmittedKind.resume), 60_000) is None


def test_the_lane_is_the_narrower_limits_key_else_the_throttle_key_else_the_workflow() -> None:
    two = Workflow(name="two", payload=Job, concurrency=[
        Concurrency(limit=9, pool="p"), Concurrency(limit=2, key="tenant")])
    route = route_for(two)
    assert route.hops[2].budget == "pool:p"
    assert lane_hop(route, 2) == route.hops[1]
    throttled = Workflow(name="t", payload=Job, throttle=Throttle(
        limit=5, period="1m", key="tenant"), concurrency=Concurrency(limit=2, pool="p"))
    route = route_for(throttled, deployment_cap=10)
    assert lane_hop(route, 2) == route.hops[1] and route.hops[1].control == "throttle"
    assert lane_hop(route, 3) == route.hops[2]
    alone = Workflow(name="a", payload=Job, concurrency=Concurrency(limit=2, pool="p"))
    assert lane_hop(route_for(alone), 1) is None


def test_the_ledger_shows_a_key_as_its_text_and_names_the_limit_it_belongs_to() -> None:
    assert key_text("w\x1facme") == "acme"
    assert key_text("pool:openai\x1facme") == "acme"
    assert key_text("w#1\x1facme") == "acme"
    assert key_text("deployment\x1f") == ""
    one = Workflow(name="one", payload=Job, concurrency=Concurrency(limit=2, key="tenant"))
    assert [control_name(one, h) for h in route_for(one, deployment_cap=10).hops] == [
        "idempotency", "concurrency", "deployment cap"]
    two = Workflow(name="two", payload=Job, concurrency=[
        Concurrency(limit=9, pool="p"), Concurrency(limit=2, key="tenant"),
    ])
    # The keyed limit is taken first; each is named by its place in the declaration.
    assert [control_name(two, h) for h in route_for(two).hops] == [
        "idempotency", "concurrency[1]", "concurrency[0] pool:p"]
    shared = Workflow(name="s", payload=Job, concurrency=Concurrency(
        limit=2, key="tenant", scope="account"))
    assert control_name(shared, route_for(shared).hops[1]) == "concurrency scope:account"
    paced = Workflow(name="paced", payload=Job, throttle=Throttle(
        limit=5, period="1m", key="tenant", pool="partner-api"))
    assert control_name(paced, route_for(paced).hops[1]) == "throttle pool:partner-api"


# -- the stage, in the test driver ------------------------------------------------------
#
# Starts come in as identity lets them go (its hop), so a test can give one the slots it
# took before or make it a resume; releases come in as the runs stage sends them.

T0 = 1_000_000
_ids = itertools.count()


@pytest.fixture
def make() -> Iterator[Callable[..., TestDriver]]:
    made: list[TestDriver] = []

    def build(*workflows: Workflow, deployment_cap: int = 0) -> TestDriver:
        driver = TestDriver(App(list(workflows)), Settings(partitions=1,
                                                           deployment_cap=deployment_cap),
                            start_ms=T0)
        made.append(driver)
        return driver

    yield build
    for driver in made:
        driver.close()


def start(d: TestDriver, workflow: str, payload: dict[str, Any], *,
          slots: list[Slot] | None = None, kind: AdmittedKind = AdmittedKind.start,
          execution_id: str | None = None) -> str:
    """A start leaving identity (hop 0) for the workflow's first control."""
    wf = d.app.workflows[workflow]
    execution_id = execution_id or f"{workflow}-{next(_ids)}"
    d.forward(PendingStart(
        execution_id=execution_id, workflow=workflow, payload=json.dumps(payload).encode(),
        origin=Origin.event, kind=kind, declaration_version=wf.version, hop=0,
        request_id=f"req-{execution_id}" if kind is AdmittedKind.start
        else f"resume:{execution_id}",
        request_ids=[f"req-{execution_id}"], requested_at_ms=d.now_ms,
        arrived_at_ms=d.now_ms, priority=wf.priority.value(payload) if wf.priority else 0.0,
        slots=slots or []), payload=payload)
    return execution_id


def release_to(d: TestDriver, key: str, execution_id: str, workflow: str,
               kind: ReleaseKind = ReleaseKind.ended, at_ms: int | None = None) -> None:
    d.pipe(d.topics.stage(NAME), Release(
        stage=NAME, key=key, execution_id=execution_id, workflow=workflow, kind=kind,
        at_ms=d.now_ms if at_ms is None else at_ms), key)


def release(d: TestDriver, execution_id: str, kind: ReleaseKind = ReleaseKind.ended) -> None:
    """The run ends (or, `suspended`, sleeps between steps): its engine says so, and the
    runs stage gives back every concurrency slot the run holds (a suspended run's only in
    `steps` mode)."""
    d.report(execution_id, RunEventKind.suspended if kind is ReleaseKind.suspended
             else RunEventKind.completed)


def admitted_ids(d: TestDriver) -> list[str]:
    return [a.execution_id for a in d.admitted]


def outcomes(d: TestDriver, execution_id: str) -> list[Outcome]:
    return [r.outcome for r in d.ledger if r.request_id == f"req-{execution_id}"]


def holders(d: TestDriver, key: str) -> list[str]:
    stage = d.stage(NAME)
    assert isinstance(stage, ConcurrencyStage)
    return stage.holders(d.context(NAME), key)


def releases(d: TestDriver) -> list[Release]:
    """The releases sent to the other stages' topics."""
    return [r for stage in STATEFUL_STAGES if stage != NAME
            for r in _decoded(d, d.topics.stage(stage), Release)]


def _decoded(d: TestDriver, topic: str, cls: type[R]) -> list[R]:
    out = []
    for written in d.sent(topic):
        try:
            out.append(codec.decode(cls, written.value))
        except codec.DecodeError:
            continue
    return out


def test_the_excess_waits_with_its_position_and_is_admitted_as_slots_free(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=2, key="tenant")))
    ids = [start(h, "w", {"tenant": "a"}) for _ in range(5)]
    assert admitted_ids(h) == ids[:2]
    queued = [r for r in h.ledger if r.outcome is Outcome.queued]
    assert [(r.deferral, r.key, r.position) for r in queued] == [
        ("concurrency", "a", 0), ("concurrency", "a", 1), ("concurrency", "a", 2)]
    other = start(h, "w", {"tenant": "b"})
    assert admitted_ids(h)[-1] == other, "another key has slots of its own"
    release(h, ids[0])
    assert admitted_ids(h)[-1] == ids[2]
    assert outcomes(h, ids[2]) == [Outcome.queued, Outcome.admitted]
    assert h.admitted[-1].slots == [Slot(NAME, "w\x1fa")]


def test_a_queued_start_says_why_it_waits_its_place_behind_the_limit(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=2, key="tenant")))
    for _ in range(4):
        start(h, "w", {"tenant": "a"})
    reasons = [r.reason for r in h.ledger if r.outcome is Outcome.queued]
    assert reasons == [
        "concurrency: 2 of 2 slots of workflow w key 'a' in use; number 1 in line for the "
        "next free one",
        "concurrency: 2 of 2 slots of workflow w key 'a' in use; number 2 in line for the "
        "next free one"]


def test_a_start_ranked_far_from_the_head_is_told_so_rather_than_counted(make: Any) -> None:
    """Its place is counted up to COUNTED starts ahead of it; past them the ledger says
    so, and has no position (docs/decisions/queue-position-bound.md)."""
    h = make(Workflow(name="w", payload=Job, concurrency=1, priority="p"))
    start(h, "w", {"tenant": "x"})
    for _ in range(COUNTED + 5):
        start(h, "w", {"tenant": "x", "p": 1})
    start(h, "w", {"tenant": "x", "p": 0})
    late = start(h, "w", {"tenant": "x", "p": 1})  # behind every 1, ahead of the 0
    row = [r for r in h.ledger if r.outcome is Outcome.queued][-1]
    assert row.request_id == f"req-{late}"
    assert row.position is None
    assert row.reason == (
        f"concurrency: 1 of 1 slots of workflow w in use; more than {COUNTED} ahead of it "
        "in line for the next free one")


def _logged_holders(d: TestDriver) -> list[bytes]:
    """The keys of the holder rows the concurrency stage's changelog carries."""
    return [w.key for w in d.sent(d.topics.changelog(NAME))
            if w.key is not None and w.key.startswith(STATE_PREFIX + b"H")]


def test_the_slot_of_a_run_admitted_here_is_made_again_from_its_row_not_logged(
        make: Any) -> None:
    """A start admitted from this hop, its run's row written by this task's runs stage in
    the same transaction: its slot is not logged, and a restore makes it again from the
    row (docs/decisions/holders-from-run-rows.md). A run that ends frees it as before."""
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, key="tenant")))
    first, second = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    h.commit()
    assert _logged_holders(h) == []
    h.restart()
    assert holders(h, "w\x1fa") == [first], "made again from the run's row"
    third = start(h, "w", {"tenant": "a"})
    assert admitted_ids(h) == [first]
    release(h, first)
    assert admitted_ids(h) == [first, second]
    h.commit()
    h.restart()
    assert holders(h, "w\x1fa") == [second]
    assert outcomes(h, third) == [Outcome.queued]


def test_a_slot_whose_run_is_admitted_elsewhere_is_logged(make: Any) -> None:
    """A hop after this one (here a second limit, over the whole workflow) admits the
    start, maybe in another task: the run's row is not this task's to make the slot of
    the first limit from, so that slot is logged; the second limit's is not."""
    h = make(Workflow(name="w", payload=Job, concurrency=[
        Concurrency(limit=1, key="tenant"), Concurrency(limit=5)]))
    first = start(h, "w", {"tenant": "a"})
    h.commit()
    assert len(_logged_holders(h)) == 1
    h.restart()
    assert [s.key for s in h.admitted[0].slots] == ["w\x1fa", "w#1\x1f"]
    assert holders(h, "w\x1fa") == [first] and holders(h, "w#1\x1f") == [first]


def test_a_release_after_a_restore_made_the_slot_free_lets_the_next_start_go(
        make: Any) -> None:
    """The run ended (its row says so) and its release is still on its way through the
    stage's topic when the partition is restored: the restore already finds the slot
    free, so the release that comes finds no holder, and the start waiting goes then."""
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, key="tenant")))
    first, second = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    runs = h.context("runs").table("runs")
    row = runs.get(first)
    runs.put(first, replace(row, status=RunStatus.completed))
    h.commit()
    h.restart()
    assert holders(h, "w\x1fa") == [] and admitted_ids(h) == [first]
    release_to(h, "w\x1fa", first, "w")
    assert admitted_ids(h) == [first, second]
    assert holders(h, "w\x1fa") == [second]


def test_a_release_for_a_run_that_holds_nothing_here_changes_nothing(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1)))
    first, second = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    release(h, first)
    release(h, first)  # releases can repeat
    release_to(h, "w\x1f", "stranger", "w", at_ms=0)
    third = start(h, "w", {"tenant": "a"})
    assert admitted_ids(h) == [first, second]
    assert holders(h, "w\x1f") == [second]
    assert outcomes(h, third) == [Outcome.queued]


def test_strict_priority_admits_urgent_starts_first_and_ties_in_arrival_order(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=1, priority="p"))
    running = start(h, "w", {"tenant": "x"})
    normal = [start(h, "w", {"tenant": "x", "p": 0}) for _ in range(3)]
    urgent = [start(h, "w", {"tenant": "x", "p": 100}) for _ in range(2)]
    current = running
    for _ in range(5):
        release(h, current)
        current = admitted_ids(h)[-1]
    assert admitted_ids(h) == [running, *urgent, *normal]


def test_age_priority_counts_as_extra_waiting_time(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=1,
                      priority=Priority(expr="p", mode="age")))
    running = start(h, "w", {"tenant": "x"})
    old = start(h, "w", {"tenant": "x", "p": 0})
    h.advance(60_000)
    boosted = start(h, "w", {"tenant": "x", "p": 120})  # as if it came a minute before `old`
    h.advance(1_000)
    late = start(h, "w", {"tenant": "x", "p": 30})  # only 30 s ahead: still after `old`
    for current in (running, boosted, old):
        release(h, current)
    assert admitted_ids(h) == [running, boosted, old, late]


def _seed_003_shape() -> Workflow:
    # Seed 003: one run at a time overall, at most 5 per account; waiting runs of
    # accounts with a boost go first "as if they had waited" that much longer.
    return Workflow(name="w", payload=Job, priority=Priority(expr="p", mode="age"),
                    concurrency=[Concurrency(limit=1), Concurrency(limit=5, key="tenant")])


def test_age_priority_across_lanes_orders_by_waiting_time_with_the_boost(make: Any) -> None:
    h = make(_seed_003_shape())
    running = start(h, "w", {"tenant": "a"})
    old = start(h, "w", {"tenant": "a", "p": 0})
    h.advance(9 * 60_000)
    boosted = start(h, "w", {"tenant": "b", "p": 1})  # 1 s of boost against 9 minutes
    h.advance(1_000)
    far_boosted = start(h, "w", {"tenant": "c", "p": 600})  # as if it came 10 minutes ago
    for current in (running, far_boosted, old):
        release(h, current)
    assert admitted_ids(h) == [running, far_boosted, old, boosted]


def test_age_priority_across_lanes_is_first_come_first_served_on_a_tie(make: Any) -> None:
    h = make(_seed_003_shape())
    running = start(h, "w", {"tenant": "a"})
    h.advance(1_000)
    first = start(h, "w", {"tenant": "b", "p": 0})
    h.advance(5_000)
    second = start(h, "w", {"tenant": "c", "p": 5})  # the same virtual arrival as `first`
    third = start(h, "w", {"tenant": "a", "p": 0})
    for current in (running, first, second):
        release(h, current)
    assert admitted_ids(h) == [running, first, second, third]


def _serve_all(h: Any, running: list[str]) -> list[str]:
    """End the runs one at a time, oldest first, until nothing waits; the admissions."""
    seen = len(h.admitted)
    while running:
        release(h, running.pop(0))
        running.extend(admitted_ids(h)[seen:])
        seen = len(h.admitted)
    return admitted_ids(h)


def _tenants(h: Any, ids: list[str]) -> str:
    tenant = {a.execution_id: json.loads(a.payload)["tenant"] for a in h.admitted}
    return "".join(tenant[i] for i in ids)


def test_a_fairness_key_serves_a_pool_round_robin_without_a_dummy_limit(make: Any) -> None:
    # The pool alone, no narrower limit: before fair_by, B's 5 starts waited behind A's 50.
    h = make(Workflow(name="f", payload=Job,
                      concurrency=Concurrency(limit=2, pool="p", fair_by="tenant")))
    big = [start(h, "f", {"tenant": "A"}) for _ in range(50)]
    small = [start(h, "f", {"tenant": "B"}) for _ in range(5)]
    order = _serve_all(h, admitted_ids(h))
    assert _tenants(h, order[:14]) == "AA" + "AB" * 5 + "AA"
    assert order == [*big[:2], *[x for pair in zip(big[2:7], small, strict=True)
                                 for x in pair], *big[7:]]
    positions = [r.position for r in h.ledger if r.outcome is Outcome.queued
                 and r.request_id in {f"req-{i}" for i in small}]
    assert positions == [0, 1, 2, 3, 4]  # its place among its tenant's starts


def test_a_fairness_weight_gives_its_value_that_many_turns_in_a_row(make: Any) -> None:
    h = make(Workflow(name="f", payload=Job, concurrency=Concurrency(
        limit=1, pool="p", fair_by="tenant", weights={"G": 3})))
    running = start(h, "f", {"tenant": "x"})
    for _ in range(6):
        start(h, "f", {"tenant": "G"})
        start(h, "f", {"tenant": "S"})
    order = _serve_all(h, [running])
    assert _tenants(h, order[1:]) == "GGGS" + "GGGS" + "SSSS"


def test_a_fairness_key_in_age_mode_takes_turns_across_lanes(make: Any) -> None:
    # Age mode orders a tenant's own starts; the round decides between tenants.
    h = make(Workflow(name="f", payload=Job, priority=Priority(expr="p", mode="age"),
                      concurrency=Concurrency(limit=1, pool="p", fair_by="tenant")))
    running = start(h, "f", {"tenant": "x"})
    old = [start(h, "f", {"tenant": "A"}) for _ in range(3)]
    h.advance(60_000)
    new = start(h, "f", {"tenant": "B", "p": 0})
    boosted = start(h, "f", {"tenant": "A", "p": 120})
    order = _serve_all(h, [running])
    assert order == [running, boosted, new, *old]


def test_a_pool_is_one_budget_for_all_its_members(make: Any) -> None:
    a = Workflow(name="a", payload=Job, concurrency=Concurrency(limit=3, pool="openai"))
    b = Workflow(name="b", payload=Job, concurrency=Concurrency(limit=3, pool="openai"))
    h = make(a, b)
    ids = [start(h, name, {"tenant": "t"}) for name in "abab"]
    assert admitted_ids(h) == ids[:3]
    assert h.admitted[0].slots == [Slot(NAME, "pool:openai\x1f")]
    release(h, ids[1])
    assert admitted_ids(h) == [*ids[:3], ids[3]]


def test_a_pool_serves_its_lanes_round_robin_so_a_small_tenant_is_not_starved(
        make: Any) -> None:
    h = make(Workflow(name="f", payload=Job, concurrency=[
        Concurrency(limit=1000, key="tenant"), Concurrency(limit=4, pool="gpu")]))
    big = [start(h, "f", {"tenant": "A"}) for _ in range(1000)]
    small = [start(h, "f", {"tenant": "B"}) for _ in range(10)]
    assert admitted_ids(h) == big[:4]
    for _ in range(20):
        release(h, admitted_ids(h)[len(h.admitted) - 4])
    served = admitted_ids(h)[4:24]
    assert set(small) <= set(served), "B's ten are admitted within the first twenty"
    assert served[:4] == [big[4], small[0], big[5], small[1]]


def test_the_deployment_cap_bounds_every_workflow_together(make: Any) -> None:
    a = Workflow(name="a", payload=Job, concurrency=5)
    b = Workflow(name="b", payload=Job, concurrency=5)
    h = make(a, b, deployment_cap=3)
    ids = [start(h, name, {"tenant": "t"}) for name in "ababa"]
    assert admitted_ids(h) == ids[:3]
    assert h.admitted[0].slots == [Slot(NAME, "a\x1f"), Slot(NAME, "deployment\x1f")]
    release(h, ids[0])
    release(h, ids[1])
    assert sorted(admitted_ids(h)[3:]) == sorted(ids[3:])


def test_max_queued_drops_the_excess_with_queue_full(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job,
                      concurrency=Concurrency(limit=1, key="tenant", max_queued=2)))
    ids = [start(h, "w", {"tenant": "a"}) for _ in range(4)]
    (dropped,) = [r for r in h.ledger if r.outcome is Outcome.dropped]
    assert dropped.request_id == f"req-{ids[3]}"
    assert dropped.reason is not None and dropped.reason.startswith("queue-full")
    assert "max_queued 2" in dropped.reason and dropped.key == "a"
    assert outcomes(h, start(h, "w", {"tenant": "b"})) == [Outcome.admitted]


def test_a_start_dropped_or_expired_gives_back_the_slots_it_took_on_the_way(
        make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, timeouts=Timeouts(start="1m"), concurrency=[
        Concurrency(limit=5, key="tenant"), Concurrency(limit=1, pool="p")]))
    first = start(h, "w", {"tenant": "a"}, slots=[Slot("singleton", "w\x1fa")])
    waiting = start(h, "w", {"tenant": "a"}, slots=[Slot("singleton", "w\x1fb")])
    assert holders(h, "w\x1fa") == [first, waiting]
    h.advance(60_000)
    assert outcomes(h, waiting)[-1] is Outcome.expired
    expired = next(r for r in h.ledger if r.outcome is Outcome.expired)
    assert expired.reason is not None and expired.reason.startswith("timeouts.start: waited 1m")
    assert {(r.stage, r.key, r.execution_id) for r in releases(h)} == {
        ("singleton", "w\x1fb", waiting)}
    # The release of its tenant slot came back to this stage: taken already.
    assert holders(h, "w\x1fa") == [first]
    assert outcomes(h, first) == [Outcome.admitted]


def test_a_start_admitted_before_its_timeout_does_not_expire(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=1, timeouts=Timeouts(start="1m")))
    first, second = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    h.advance(30_000)
    release(h, first)
    h.advance(60_000)
    assert outcomes(h, second) == [Outcome.queued, Outcome.admitted]
    assert h.timers(NAME).next_due is None


@pytest.mark.parametrize("mode", ["steps", "runs"])
def test_a_suspended_run_holds_its_slot_after_a_restore_only_in_runs_mode(
        make: Any, mode: str) -> None:
    """Slots made again from the runs' rows at a restore: a run sleeping between steps
    holds none in `steps` mode (it gave its slot back) and keeps its own in `runs` mode."""
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, mode=mode)))
    sleeper, other = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    release(h, sleeper, ReleaseKind.suspended)
    h.commit()
    h.restart()
    holding = [other] if mode == "steps" else [sleeper]
    assert holders(h, "w\x1f") == holding
    assert admitted_ids(h) == [sleeper, *([other] if mode == "steps" else [])]


def test_steps_mode_frees_the_slot_while_suspended_and_readmits_before_resuming(
        make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, mode="steps")))
    sleeper, other = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    release(h, sleeper, ReleaseKind.suspended)
    assert admitted_ids(h) == [sleeper, other]
    start(h, "w", {"tenant": "a"}, kind=AdmittedKind.resume, execution_id=sleeper)
    assert len(h.admitted) == 2, "the resume waits for a slot"
    start(h, "w", {"tenant": "a"}, kind=AdmittedKind.resume, execution_id=sleeper)  # twice
    release(h, other)
    resumed = h.admitted[2:]
    assert [(a.execution_id, a.kind) for a in resumed] == [(sleeper, AdmittedKind.resume)]
    assert not [r for r in h.ledger if r.request_id == f"resume:{sleeper}"]


def test_runs_mode_keeps_the_slot_of_a_suspended_run(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=1))
    sleeper, other = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    release(h, sleeper, ReleaseKind.suspended)
    assert admitted_ids(h) == [sleeper]
    release(h, sleeper)
    assert admitted_ids(h) == [sleeper, other]


def test_a_resume_waiting_for_a_run_that_ended_is_forgotten(make: Any) -> None:
    h = make(Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, mode="steps")))
    sleeper, other = start(h, "w", {"tenant": "a"}), start(h, "w", {"tenant": "a"})
    release(h, sleeper, ReleaseKind.suspended)
    start(h, "w", {"tenant": "a"}, kind=AdmittedKind.resume, execution_id=sleeper)
    release_to(h, "w\x1f", sleeper, "w", at_ms=0)
    release(h, other)
    assert admitted_ids(h) == [sleeper, other]


def test_starts_of_a_removed_workflow_fail_at_restore_and_a_raised_limit_fills_up(
        make: Any) -> None:
    gone = Workflow(name="gone", payload=Job, concurrency=1, on_failure="handler")
    stays = Workflow(name="stays", payload=Job, concurrency=1)
    from sluicegate.declare import FailureReport
    handler = Workflow(name="handler", payload=FailureReport)
    h = make(gone, stays, handler)
    held = start(h, "gone", {"tenant": "a"})
    waiting = start(h, "gone", {"tenant": "a"})
    running = start(h, "stays", {"tenant": "a"})
    later = [start(h, "stays", {"tenant": "a"}) for _ in range(2)]
    h.commit()
    h.restart(App([Workflow(name="stays", payload=Job, concurrency=3), handler]))
    assert outcomes(h, waiting) == [Outcome.queued, Outcome.failed]
    failed = next(r for r in h.ledger if r.outcome is Outcome.failed)
    assert failed.reason == REMOVED
    assert admitted_ids(h) == [held, running, *later]
    release(h, held)  # the removed workflow's run still gives its slot back
    assert holders(h, "gone\x1f") == []


def test_a_restore_under_the_declarations_of_the_last_sweep_does_not_sweep_again(
        make: Any) -> None:
    """The sweep reads every waiting start (seconds at a million): it runs when the
    declarations changed since the partition's last one, not at every restore."""
    one = Workflow(name="w", payload=Job, concurrency=1)
    h = make(one)
    for _ in range(3):
        start(h, "w", {"tenant": "a"})
    h.commit()
    h.restart(App([one]))
    h.commit()
    h.restart(App([one]))
    assert not h.store(NAME).changes, "no sweep: the restore wrote nothing"
    raised = Workflow(name="w", payload=Job, concurrency=2)
    h.commit()
    h.restart(App([raised]))  # a raised limit: swept, and the room filled
    assert len(admitted_ids(h)) == 2


def test_a_partition_first_assigned_empty_does_not_sweep_at_its_first_restart(
        make: Any) -> None:
    """A new worker's partitions are restored empty and checked then: the starts queued
    afterwards, under the same declarations, are not read again at the next restore
    (a million of them took most of a 13 s restart)."""
    one = Workflow(name="w", payload=Job, concurrency=1)
    h = make(one)
    # The driver restored the store at its first assignment, empty.
    for _ in range(3):
        start(h, "w", {"tenant": "a"})
    h.commit()
    h.restart()
    assert not h.store(NAME).changes, "no sweep: the restore wrote nothing"
    h.commit()
    h.restart(App([Workflow(name="w", payload=Job, concurrency=2)]))  # changed: swept
    assert len(admitted_ids(h)) == 2


# -- against a reference model ---------------------------------------------------------


TENANTS = ("a", "b", "c")


def assert_derived_rows_follow(d: TestDriver) -> None:
    """The rows the concurrency stage keeps up to date as it goes and never logs are the
    rows it would derive from its other rows at a restore."""
    stage = d.stage("concurrency")
    store = d.store("concurrency")
    kept = {key: value for prefix in stage.derived for key, value in store.items(prefix)}
    derived = d.derive("concurrency")
    assert pending.agrees(kept, derived), (kept, derived)


class OneKeyPerTenant(RuleBasedStateMachine):
    """Limit 2 per tenant, strict priority: never more than 2 holders per tenant, the
    waiting start admitted next is the reference queue's head (priority, then arrival),
    and once every run ends nothing is left waiting."""

    LIMIT = 2

    def __init__(self) -> None:
        super().__init__()
        self.h = TestDriver(App([Workflow(
            name="w", payload=Job, priority="p", cancel_on=ON_TENANT_GONE,
            concurrency=Concurrency(limit=self.LIMIT, key="tenant"))]), start_ms=T0)
        self.running: dict[str, set[str]] = defaultdict(set)
        self.waiting: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        self.arrivals = itertools.count()

    def _check_new_admissions(self, seen: int) -> None:
        for admitted in self.h.admitted[seen:]:
            tenant = json.loads(admitted.payload)["tenant"]
            queue = self.waiting[tenant]
            if queue:
                head = min(queue)
                assert admitted.execution_id == head[2], "admitted out of order"
                queue.remove(head)
            self.running[tenant].add(admitted.execution_id)

    @rule(tenant=st.sampled_from(TENANTS), priority=st.sampled_from((0, 0, 1, 5)))
    def start(self, tenant: str, priority: int) -> None:
        seen = len(self.h.admitted)
        execution_id = start(self.h, "w", {"tenant": tenant, "p": priority})
        if len(self.h.admitted) == seen:
            self.waiting[tenant].append((-priority, next(self.arrivals), execution_id))
        self._check_new_admissions(seen)

    @precondition(lambda self: any(self.running.values()))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        tenant = data.draw(st.sampled_from(sorted(t for t, r in self.running.items() if r)))
        execution_id = data.draw(st.sampled_from(sorted(self.running[tenant])))
        self.running[tenant].discard(execution_id)
        seen = len(self.h.admitted)
        release(self.h, execution_id)
        self._check_new_admissions(seen)

    @invariant()
    def never_more_than_the_limit(self) -> None:
        for tenant in TENANTS:
            held = holders(self.h, f"w\x1f{tenant}")
            assert set(held) == self.running[tenant]
            assert len(held) <= self.LIMIT
            assert len(held) == self.LIMIT or not self.waiting[tenant], "a free slot idles"

    @invariant()
    def derived_rows_follow_from_the_others(self) -> None:
        assert_derived_rows_follow(self.h)

    @rule()
    def restart(self) -> None:
        """Another worker takes over: the derived rows are made again from the others."""
        self.h.commit()
        self.h.restart()

    def teardown(self) -> None:
        # Every waiting start is admitted once the runs end.
        while any(self.running.values()):
            tenant = next(t for t, r in self.running.items() if r)
            self.end_one(tenant)
        assert not any(self.waiting.values())
        self.h.close()

    def end_one(self, tenant: str) -> None:
        execution_id = min(self.running[tenant])
        self.running[tenant].discard(execution_id)
        seen = len(self.h.admitted)
        release(self.h, execution_id)
        self._check_new_admissions(seen)


TestOneKeyPerTenant = OneKeyPerTenant.TestCase
TestOneKeyPerTenant.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


class SharedPool(RuleBasedStateMachine):
    """A pool of 2 shared by tenants, one lane each: never more than 2 holders, FIFO within
    a lane, and round-robin across lanes: while a lane waits, no other lane is served twice
    before it."""

    LIMIT = 2

    def __init__(self) -> None:
        super().__init__()
        self.h = TestDriver(self.app(), start_ms=T0)
        self.running: list[str] = []
        self.lanes: dict[str, deque[str]] = defaultdict(deque)
        # Per waiting lane: the lanes served since it began waiting or was last served.
        self.served_since: dict[str, list[str]] = {}

    def app(self) -> App:
        # The lanes come from the narrower, keyed limit before the pool.
        return App([Workflow(name="f", payload=Job, cancel_on=ON_TENANT_GONE, concurrency=[
            Concurrency(limit=100, key="tenant"), Concurrency(limit=self.LIMIT, pool="p")])])

    def _check_new_admissions(self, seen: int) -> None:
        for admitted in self.h.admitted[seen:]:
            tenant = json.loads(admitted.payload)["tenant"]
            lane = self.lanes[tenant]
            if lane:
                assert admitted.execution_id == lane.popleft(), "out of order within a lane"
                for other, served in self.served_since.items():
                    if other != tenant:
                        assert tenant not in served, f"{tenant} served twice before {other}"
                        served.append(tenant)
                self.served_since[tenant] = []
                if not lane:
                    del self.served_since[tenant]
            self.running.append(admitted.execution_id)

    @rule(tenant=st.sampled_from(TENANTS))
    def start(self, tenant: str) -> None:
        seen = len(self.h.admitted)
        execution_id = start(self.h, "f", {"tenant": tenant})
        if len(self.h.admitted) == seen:
            if not self.lanes[tenant]:
                self.served_since[tenant] = []
            self.lanes[tenant].append(execution_id)
        self._check_new_admissions(seen)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        execution_id = data.draw(st.sampled_from(self.running))
        self.running.remove(execution_id)
        seen = len(self.h.admitted)
        release(self.h, execution_id)
        self._check_new_admissions(seen)

    @invariant()
    def never_more_than_the_pool(self) -> None:
        held = holders(self.h, "pool:p\x1f")
        assert sorted(held) == sorted(self.running)
        assert len(held) <= self.LIMIT

    @invariant()
    def derived_rows_follow_from_the_others(self) -> None:
        assert_derived_rows_follow(self.h)

    @rule()
    def restart(self) -> None:
        self.h.commit()
        self.h.restart()

    def teardown(self) -> None:
        while self.running:
            execution_id = self.running.pop(0)
            seen = len(self.h.admitted)
            release(self.h, execution_id)
            self._check_new_admissions(seen)
        assert not any(self.lanes.values()), "every waiting start is admitted in the end"
        self.h.close()


TestSharedPool = SharedPool.TestCase
TestSharedPool.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


class FairPool(SharedPool):
    """The same guarantees with the lanes named by a declared fairness key."""

    def app(self) -> App:
        return App([Workflow(name="f", payload=Job, concurrency=Concurrency(
            limit=self.LIMIT, pool="p", fair_by="tenant"))])


TestFairPool = FairPool.TestCase
TestFairPool.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("log_derived", [0, 1])
def test_the_gates_counters_reach_its_changelog_only_while_rolling_from_a_release_that_logs_them(
        log_derived: int) -> None:
    wf = Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, key="tenant"))
    with TestDriver(App([wf]), Settings(partitions=1, log_derived=log_derived),
                    start_ms=T0) as d:
        first = start(d, "w", {"tenant": "a"})
        start(d, "w", {"tenant": "a"})
        d.commit()
        release(d, first)
        d.commit()
        derived = d.stage(NAME).derived
        logged = [w.key for w in d.sent(d.topics.changelog(NAME))]
        assert logged, "the holders and the queue are logged either way"
        assert any(key.startswith(derived) for key in logged) == bool(log_derived)
        # Taken over (its derived rows made again, or restored as logged), the gate holds
        # the same: one run.
        d.restart()
        assert holders(d, "w\x1fa") == [d.admitted[-1].execution_id]
        assert_derived_rows_follow(d)


@pytest.mark.parametrize("log_derived", [0, 1])
def test_a_waiting_starts_index_row_is_its_queue_row_unless_rolling_from_a_release_before(
        log_derived: int) -> None:
    wf = Workflow(name="w", payload=Job, concurrency=Concurrency(limit=1, key="tenant"))
    with TestDriver(App([wf]), Settings(partitions=1, log_derived=log_derived),
                    start_ms=T0) as d:
        start(d, "w", {"tenant": "a"})
        waits = start(d, "w", {"tenant": "a"})
        d.commit()
        for restarted in (False, True):
            store = d.tasks[0].states[NAME].store
            assert store is not None
            ((row, _),) = list(store.items(pending.ROW_PREFIX))
            (index,) = [value for _, value in store.items(WAITING.prefix)]
            if log_derived:
                assert index == len("w").to_bytes(4, "big") + b"w" + row
            else:
                # (In memory the queue's row is made from its queue's values when read:
                # docs/decisions/queues-held-as-values.md.)
                assert index == row
            assert d.stage(NAME)._waiting(d.context(NAME), "w\x1fa",  # type: ignore[attr-defined]
                                          waits) is not None
            if not restarted:
                d.restart()


def test_a_start_handed_over_is_parked_with_the_bytes_it_was_sent_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Handed over in-process (docs/decisions/encoded-once-per-hop.md), a start that waits is
    encoded once on its way to this hop, and its queue row is those very bytes: what the
    stage's topic would have carried."""
    driver = TestDriver(App([Workflow(name="w", payload=Job,
                                      concurrency=Concurrency(limit=1, key="tenant"))]),
                        Settings(partitions=1), start_ms=T0, in_order=True)
    try:
        start(driver, "w", {"tenant": "a"})
        encode = codec.encode
        encoded: list[bytes] = []

        def counting(record: Any) -> bytes:
            data = encode(record)
            if isinstance(record, PendingStart):
                encoded.append(data)
            return data

        monkeypatch.setattr(codec, "encode", counting)
        waiting = start(driver, "w", {"tenant": "a"})
        assert outcomes(driver, waiting) == [Outcome.queued]
        assert len(encoded) == 1, "encoded once, when it left identity's hop"
        rows = [value for _, value in driver.context(NAME).store.items(pending.ROW_PREFIX)]
        assert rows == encoded
        assert codec.decode(PendingStart, rows[0]).execution_id == waiting
    finally:
        driver.close()
