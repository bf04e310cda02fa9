"""A guaranteed share under a shared limit (`Concurrency(floor=...)`): a fairness value
with starts waiting gets up to `floor` slots before the weighted round serves the rest
(admission/floors.py, docs/decisions/concurrency-floor.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pydantic import BaseModel

from sluicegate.admission import floors
from sluicegate.admission.stages.concurrency import ConcurrencyStage
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, DeclarationError, Workflow
from sluicegate.schemas.records import RunEvent, RunEventKind
from sluicegate.testing import TestDriver
from tests.unit.test_concurrency import assert_derived_rows_follow

T0 = 1_000_000


class Job(BaseModel):
    tenant: str


def _gpu(floor: int | None, limit: int = 10, weights: dict[str, int] | None = None,
         name: str = "g") -> Workflow:
    return Workflow(name=name, payload=Job, concurrency=Concurrency(
        limit=limit, pool="gpu", fair_by="tenant", weights=weights, floor=floor))


@pytest.fixture
def make() -> Iterator[Callable[..., TestDriver]]:
    made: list[TestDriver] = []

    def build(*workflows: Workflow) -> TestDriver:
        d = TestDriver(App(list(workflows)), Settings(partitions=1), start_ms=T0)
        made.append(d)
        return d

    yield build
    for d in made:
        d.close()


def _start(d: TestDriver, tenant: str, workflow: str = "g") -> str:
    return d.start(workflow, {"tenant": tenant}).execution_id


def _end(d: TestDriver, execution_id: str) -> None:
    d.report(execution_id, RunEventKind.started)
    d.report(execution_id, RunEventKind.completed)


def _tenants(d: TestDriver, since: int = 0) -> str:
    return "".join(json.loads(a.payload)["tenant"][0] for a in d.admitted[since:])


def _end_oldest(d: TestDriver, n: int) -> None:
    """The `n` oldest runs still in flight end, one by one."""
    for _ in range(n):
        ended = {e.execution_id for e in d.read(d.topics.run_events, RunEvent)
                 if e.kind is RunEventKind.completed}
        run = next(a for a in d.admitted if a.execution_id not in ended)
        _end(d, run.execution_id)


@pytest.mark.parametrize(("floor", "expected"), [
    # Without a floor, big's weight of 50 takes the next 50 turns in a row: small waits.
    (None, "bbbbbb"),
    # With a floor of 3, the next three slots that free are small's; then the round.
    (3, "sssbbb"),
])
def test_a_small_tenant_gets_its_floor_behind_a_large_tenants_backlog(
        make: Callable[..., TestDriver], floor: int | None, expected: str) -> None:
    d = make(_gpu(floor, weights={"big": 50}))
    for _ in range(100):
        _start(d, "big")
    assert _tenants(d) == "b" * 10, "big alone: every slot is used"
    for _ in range(5):
        _start(d, "small")
    _end_oldest(d, 6)
    assert _tenants(d, 10) == expected


def test_a_tenant_at_its_floor_goes_back_to_the_weighted_round(
        make: Callable[..., TestDriver]) -> None:
    d = make(_gpu(2, limit=6))
    for _ in range(20):
        _start(d, "big")
    for _ in range(6):
        _start(d, "small")
    _end_oldest(d, 4)
    # Two for small's floor, then turns: big (small went to the back of the round with
    # each of its two), then small.
    assert _tenants(d, 6) == "ss" + "bs"


def test_a_large_tenant_below_its_floor_is_guaranteed_it_too(
        make: Callable[..., TestDriver]) -> None:
    d = make(_gpu(2, limit=4))
    for _ in range(20):
        _start(d, "big")
    for _ in range(6):
        _start(d, "small")
    _end_oldest(d, 6)
    # small's two, then big is down to one slot: under its floor, its turn; again.
    assert _tenants(d, 4) == "ssbbss"


def test_idle_capacity_is_used_and_nothing_is_reserved_for_a_tenant_with_none_waiting(
        make: Callable[..., TestDriver]) -> None:
    d = make(_gpu(5, limit=10))
    ids = [_start(d, "big") for _ in range(12)]
    assert _tenants(d) == "b" * 10
    _end(d, ids[0])
    assert _tenants(d, 10) == "b", "no other tenant waits: the slot is big's"


def test_several_tenants_under_their_floor_share_the_slots_that_free_in_turn(
        make: Callable[..., TestDriver]) -> None:
    # Floors that add up to more than the limit (three tenants of floor 2 besides big's,
    # under a limit of 6): the tenants under theirs take the freed slots in the round's
    # order until each holds its floor.
    d = make(_gpu(2, limit=6, weights={"big": 50}))
    for _ in range(30):
        _start(d, "big")
    for tenant in ("x", "y", "z"):
        for _ in range(3):
            _start(d, tenant)
    _end_oldest(d, 4)
    assert _tenants(d, 6) == "xyzx"
    key = b"\x00\x00\x00\x09pool:gpu\x1f"
    store = d.store("concurrency")
    assert [floors.held(store, key, t) for t in ("big", "x", "y", "z")] == [2, 2, 1, 1]


def test_the_slots_each_tenant_holds_are_made_again_at_restore(
        make: Callable[..., TestDriver]) -> None:
    d = make(_gpu(3, weights={"big": 50}))
    for _ in range(30):
        _start(d, "big")
    for _ in range(5):
        _start(d, "small")
    _end_oldest(d, 1)
    assert _tenants(d, 10) == "s"
    d.commit()
    d.restart()
    stage = d.stage("concurrency")
    assert isinstance(stage, ConcurrencyStage)
    key = b"\x00\x00\x00\x09pool:gpu\x1f"
    assert floors.held(d.store("concurrency"), key, "small") == 1
    assert floors.held(d.store("concurrency"), key, "big") == 9
    _end_oldest(d, 3)
    assert _tenants(d, 11) == "ssb"


def test_a_pools_members_share_one_floor_count(make: Callable[..., TestDriver]) -> None:
    d = make(_gpu(2, limit=5, name="a"), _gpu(2, limit=5, name="b"))
    for _ in range(8):
        _start(d, "big", "a")
    _start(d, "small", "b")
    _start(d, "small", "a")
    _start(d, "small", "b")
    _end_oldest(d, 3)
    assert _tenants(d, 5) == "ssb"


# -- declarations -----------------------------------------------------------------------


@pytest.mark.parametrize(("option", "message"), [
    (Concurrency(limit=10, pool="gpu", floor=2),
     "concurrency floor needs fair_by"),
    (Concurrency(limit=10, pool="gpu", fair_by="tenant", floor=11),
     "concurrency floor 11 is over the limit 10"),
    (Concurrency(limit=10, pool="gpu", fair_by="tenant", floor=0),
     "concurrency floor must be a whole number from 1 to the limit (10) (got 0)"),
])
def test_a_floor_that_cannot_hold_is_a_load_error(option: Concurrency, message: str) -> None:
    with pytest.raises(DeclarationError) as raised:
        App([Workflow(name="w", payload=Job, concurrency=option)])
    assert f"workflow w: {message}" in str(raised.value)


def test_floors_of_every_declared_tenant_may_add_up_to_more_than_the_limit() -> None:
    weights = {f"t{i}": 2 for i in range(30)}
    App([Workflow(name="w", payload=Job, concurrency=Concurrency(
        limit=100, pool="gpu", fair_by="tenant", weights=weights, floor=5))])


def test_every_member_of_a_pool_declares_the_same_floor() -> None:
    with pytest.raises(DeclarationError) as raised:
        App([_gpu(2, name="a"), _gpu(3, name="b")])
    assert ("workflow b: concurrency pool 'gpu' declares floor 3, but workflow a declares 2"
            in str(raised.value))


def test_a_declaration_without_a_floor_keeps_its_version() -> None:
    plain = Workflow(name="w", payload=Job, concurrency=Concurrency(
        limit=10, pool="gpu", fair_by="tenant"))
    floored = Workflow(name="w", payload=Job, concurrency=Concurrency(
        limit=10, pool="gpu", fair_by="tenant", floor=2))
    assert plain.version != floored.version
    assert "floor" not in json.dumps(plain.concurrency[0].model_dump(exclude_none=True))


# -- a state machine: the floor's rule at every admission, the counts at every step --------


class FlooredPool(RuleBasedStateMachine):
    """A pool of 4 with a floor of 2 per tenant, A weighted 3: never more than 4 in flight;
    a start admitted from the queue is of a tenant under its floor whenever one with
    starts waiting is; a free slot never idles while starts wait; the slots each tenant
    holds are what the store counts, and what a restore would derive."""

    LIMIT, FLOOR = 4, 2
    KEY = b"\x00\x00\x00\x09pool:gpu\x1f"

    def __init__(self) -> None:
        super().__init__()
        self.h = TestDriver(App([_gpu(self.FLOOR, limit=self.LIMIT, weights={"A": 3})]),
                            Settings(partitions=1), start_ms=T0)
        self.running: dict[str, str] = {}  # execution id -> tenant
        self.waiting: dict[str, int] = {t: 0 for t in "ABC"}

    def _held(self, tenant: str) -> int:
        return sum(t == tenant for t in self.running.values())

    def _admitted_since(self, seen: int, queued: bool) -> None:
        for run in self.h.admitted[seen:]:
            tenant = json.loads(run.payload)["tenant"]
            if queued:
                under = [t for t in "ABC" if self.waiting[t] and self._held(t) < self.FLOOR]
                assert not under or tenant in under, (tenant, under, self.running)
                self.waiting[tenant] -= 1
            self.running[run.execution_id] = tenant

    @rule(tenant=st.sampled_from("ABC"))
    def start(self, tenant: str) -> None:
        seen = len(self.h.admitted)
        _start(self.h, tenant)
        if len(self.h.admitted) == seen:
            self.waiting[tenant] += 1
        else:
            self._admitted_since(seen, queued=False)

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        execution_id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[execution_id]
        seen = len(self.h.admitted)
        _end(self.h, execution_id)
        self._admitted_since(seen, queued=True)

    @rule()
    def restart(self) -> None:
        self.h.commit()
        self.h.restart()

    @invariant()
    def the_limit_holds_and_no_slot_idles(self) -> None:
        assert len(self.running) <= self.LIMIT
        assert len(self.running) == self.LIMIT or not any(self.waiting.values())

    @invariant()
    def each_tenants_slots_are_counted(self) -> None:
        store = self.h.store("concurrency")
        assert {t: floors.held(store, self.KEY, t) for t in "ABC"} == {
            t: self._held(t) for t in "ABC"}
        assert_derived_rows_follow(self.h)

    def teardown(self) -> None:
        self.h.close()


TestFlooredPool = FlooredPool.TestCase
TestFlooredPool.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
