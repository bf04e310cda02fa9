"""Per-key limits from the limits table (`per_key`): concurrency, throttle and rateLimit
take a key's limit from `sg.limits` when it names the key, the declared one otherwise
(admission/limits.py, docs/decisions/limits-table.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from sluicegate.admission.limits import (
    BadLimitRow,
    KeyLimits,
    LimitChange,
    key_limit,
    limits_key,
    parse,
)
from sluicegate.admission.stages.throttle import Pace, Rate, repaced
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Concurrency,
    DeclarationError,
    RateLimit,
    Throttle,
    Workflow,
)
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.records import KeyLimit, Outcome, RunEventKind
from sluicegate.testing import TestDriver

T0 = 1_000_000


class Job(BaseModel):
    tenant: str


def _row(limit: int) -> bytes:
    return codec.encode(KeyLimit(limit=limit, at_ms=T0))


def _record(key: bytes | None, value: bytes | None) -> InputRecord:
    return InputRecord("sg.limits", 0, 7, key, value, T0)


# -- the pure core -------------------------------------------------------------------


def test_a_key_the_table_names_gets_its_limit_and_any_other_the_declared_one() -> None:
    table = KeyLimits("sg.limits")
    assert table.apply(_record(limits_key("tiers", "acme"), _row(20))) == LimitChange(
        "tiers", "acme", 20, T0)
    assert key_limit(table, "tiers", "acme", 2) == 20
    assert key_limit(table, "tiers", "free", 2) == 2
    assert key_limit(table, "other", "acme", 2) == 2, "rows of another name"
    assert key_limit(table, None, "acme", 2) == 2, "a limit without per_key"
    assert key_limit(None, "tiers", "acme", 2) == 2, "no table read"
    # The same limit again changes nothing; a tombstone returns the key to its default.
    assert table.apply(_record(limits_key("tiers", "acme"), _row(20))) is None
    assert table.apply(_record(limits_key("tiers", "acme"), None)) == LimitChange(
        "tiers", "acme", None)
    assert key_limit(table, "tiers", "acme", 2) == 2
    assert table.apply(_record(limits_key("tiers", "acme"), None)) is None


def test_a_key_value_may_hold_the_separator_the_name_cannot() -> None:
    assert parse(b"tiers:org:42", _row(3)) == LimitChange("tiers", "org:42", 3, T0)


@pytest.mark.parametrize(("key", "value", "reason"), [
    (None, _row(3), "needs its key"),
    (b"acme", _row(3), "is not '<per_key>:<key value>'"),
    (b":acme", _row(3), "is not '<per_key>:<key value>'"),
    (b"tiers:acme", b"not avro", "is not a KeyLimit"),
    (b"tiers:acme", _row(0), "limit 0 is not from 1 to 100,000"),
    (b"tiers:acme", _row(100_001), "limit 100001 is not from 1 to 100,000"),
])
def test_a_record_that_is_no_limit_is_a_bad_row_and_the_key_keeps_its_limit(
        key: bytes | None, value: bytes, reason: str) -> None:
    table = KeyLimits("sg.limits")
    table.apply(_record(b"tiers:acme", _row(5)))
    found = table.apply(_record(key, value))
    assert isinstance(found, BadLimitRow)
    assert reason in found.reason
    assert found.record.key == key and found.record.value == value
    assert key_limit(table, "tiers", "acme", 2) == 5


def test_a_changed_throttle_limit_pays_what_the_key_owes_at_the_new_rate() -> None:
    # 1 per 10 s: a start admitted at 0 ms lets the next go at 10 s. At 2 s, 8 s of it
    # are owed, 0.8 of a start's interval; raised to 10 per 10 s, that is 0.8 s of the
    # new interval: the next may go at 2.8 s. Lowered back then, 8 s are owed again.
    old, new = Rate(1, 10_000), Rate(10, 10_000)
    pace = Pace(10_000, 1)
    raised = repaced(pace, new, 2_000)
    assert raised == Pace(28_000, 10)  # in tenths of a ms
    assert repaced(raised, old, 2_000) == Pace(10_000, 1)
    assert repaced(Pace(1_000, 1), new, 5_000) == Pace(10_000, 10), "owes nothing"
    assert repaced(pace, old, 2_000) is pace


# -- declarations -----------------------------------------------------------------------


@pytest.mark.parametrize(("option", "message"), [
    (Concurrency(limit=2, per_key="tiers"), "concurrency per_key 'tiers' needs a key"),
    (Concurrency(limit=2, key="tenant", per_key="a:b"),
     "concurrency per_key 'a:b' is not a valid name"),
    (Throttle(limit=2, period="1m", per_key="tiers"), "throttle per_key 'tiers' needs a key"),
    (RateLimit(limit=2, period="1m", per_key="tiers"), "rate_limit per_key 'tiers' needs a key"),
])
def test_a_per_key_limit_needs_a_key_and_a_name_fit_for_a_row_key(
        option: object, message: str) -> None:
    field = {Concurrency: "concurrency", Throttle: "throttle",
             RateLimit: "rate_limit"}[type(option)]
    with pytest.raises(DeclarationError) as raised:
        App([Workflow(name="w", payload=Job, **{field: option})])
    assert f"workflow w: {message}" in str(raised.value)


def test_every_member_of_a_pool_takes_its_limits_per_key_from_the_same_rows() -> None:
    with pytest.raises(DeclarationError) as raised:
        App([Workflow(name="a", payload=Job, concurrency=Concurrency(
                 limit=2, pool="gpu", key="tenant", per_key="tiers")),
             Workflow(name="b", payload=Job, concurrency=Concurrency(
                 limit=2, pool="gpu", key="tenant"))])
    assert ("workflow b: concurrency pool 'gpu' declares per_key None, but workflow a "
            "declares 'tiers'") in str(raised.value)
    with pytest.raises(DeclarationError) as raised:
        App([Workflow(name="a", payload=Job, throttle=Throttle(
                 limit=2, period="1m", pool="api", key="tenant", per_key="tiers")),
             Workflow(name="b", payload=Job, throttle=Throttle(
                 limit=2, period="1m", pool="api", key="tenant", per_key="other"))])
    assert ("workflow b: throttle pool 'api' declares per_key 'other', but workflow a "
            "declares 'tiers'") in str(raised.value)


def test_a_workflow_with_several_throttles_declares_no_per_key_one() -> None:
    with pytest.raises(DeclarationError) as raised:
        App([Workflow(name="w", payload=Job, throttle=[
            Throttle(limit=2, period="1m", key="tenant", per_key="tiers"),
            Throttle(limit=9, period="1h")])])
    assert "workflow w: throttle per_key cannot be declared by a workflow that declares " \
        "several throttles" in str(raised.value)


# -- concurrency, in the test driver -------------------------------------------------


def _driver(*workflows: Workflow, partitions: int = 1) -> TestDriver:
    return TestDriver(App(list(workflows)), Settings(partitions=partitions), start_ms=T0)


@pytest.fixture
def tiers() -> Iterator[TestDriver]:
    with _driver(Workflow(name="w", payload=Job, concurrency=Concurrency(
            limit=2, key="tenant", per_key="tiers"))) as d:
        yield d


def _start(d: TestDriver, tenant: str, workflow: str = "w") -> str:
    return d.start(workflow, {"tenant": tenant}).execution_id


def _admitted(d: TestDriver) -> list[str]:
    return [a.execution_id for a in d.admitted]


def _end(d: TestDriver, execution_id: str) -> None:
    d.report(execution_id, RunEventKind.started)
    d.report(execution_id, RunEventKind.completed)


def test_a_tenant_the_table_names_gets_its_limit_and_the_others_the_default(
        tiers: TestDriver) -> None:
    d = tiers
    d.set_limit("tiers", "enterprise", 5, reason="contract 1142", by="billing")
    big = [_start(d, "enterprise") for _ in range(7)]
    free = [_start(d, "free") for _ in range(3)]
    assert _admitted(d) == [*big[:5], *free[:2]]
    queued = [r for r in d.ledger if r.outcome is Outcome.queued]
    assert "concurrency: 5 of 5 slots of workflow w key 'enterprise' in use" in queued[0].reason
    assert "concurrency: 2 of 2 slots of workflow w key 'free' in use" in queued[-1].reason
    # `ledger ask why` says where a key's limit comes from when it is not the declared one.
    assert "in use (the key's, from the limits table; declared 2); number 1" in (
        queued[0].reason)
    assert "in use; number 1" in queued[-1].reason


def test_a_raised_limit_admits_waiting_starts_at_once_and_a_lowered_one_cancels_nothing(
        tiers: TestDriver) -> None:
    d = tiers
    ids = [_start(d, "acme") for _ in range(8)]
    assert _admitted(d) == ids[:2]
    d.set_limit("tiers", "acme", 5)
    assert _admitted(d) == ids[:5], "raised: three more go at once, no run ends first"
    d.set_limit("tiers", "acme", 1)
    assert _admitted(d) == ids[:5]
    assert not d.commands, "lowered: nothing cancelled, the key drains down to it"
    for run in ids[:4]:
        _end(d, run)
        assert _admitted(d) == ids[:5], "still at or over the lowered limit"
    _end(d, ids[4])
    assert _admitted(d) == ids[:6], "below it: one at a time"
    d.unset_limit("tiers", "acme")
    assert _admitted(d) == ids[:7], "back to the default of 2"


def test_a_bad_row_is_dead_lettered_once_with_its_reason_and_the_key_keeps_its_limit() -> None:
    with _driver(Workflow(name="w", payload=Job, concurrency=Concurrency(
            limit=1, key="tenant", per_key="tiers")), partitions=3) as d:
        d.set_limit("tiers", "acme", 3)
        d.limits_record(b"tiers:acme", _row(0))
        d.limits_record(b"tiers:acme", b"\x00garbage")
        d.limits_record(b"acme", _row(9))
        reasons = [letter.reason for letter in d.dead_letters]
        assert len(reasons) == 3, "one dead letter each, by the task owning its key"
        assert "limit 0 is not from 1 to 100,000" in reasons[0]
        assert "is not a KeyLimit" in reasons[1]
        assert "'acme' is not '<per_key>:<key value>'" in reasons[2]
        assert {letter.source_topic for letter in d.dead_letters} == {d.topics.limits}
        ids = [_start(d, "acme") for _ in range(4)]
        assert _admitted(d) == ids[:3], "the key kept the limit it had"


def test_limits_set_before_a_restart_hold_after_it_and_starts_queued_then_go(
        tiers: TestDriver) -> None:
    d = tiers
    ids = [_start(d, "acme") for _ in range(4)]
    d.commit()
    d.set_limit("tiers", "acme", 3)
    d.restart()
    assert _admitted(d) == ids[:3]
    ids.append(_start(d, "acme"))
    assert _admitted(d) == ids[:3]


def test_a_pool_takes_a_tenants_limit_from_the_rows_its_members_name() -> None:
    limit = Concurrency(limit=1, pool="gpu", key="tenant", per_key="tiers")
    with _driver(Workflow(name="a", payload=Job, concurrency=limit),
                 Workflow(name="b", payload=Job, concurrency=limit)) as d:
        d.set_limit("tiers", "acme", 2)
        ids = [_start(d, "acme", name) for name in "abab"]
        assert _admitted(d) == ids[:2]
        assert d.admitted[0].slots[0].key == "pool:gpu\x1facme"
        d.set_limit("tiers", "acme", 3)
        assert _admitted(d) == ids[:3]


def test_a_workflow_without_per_key_reads_no_limits_table() -> None:
    with _driver(Workflow(name="w", payload=Job, concurrency=Concurrency(
            limit=1, key="tenant"))) as d:
        assert [t.name for t in d.pipeline.topology.global_tables] == ["control"]
        d.set_limit("tiers", "acme", 3)
        ids = [_start(d, "acme") for _ in range(2)]
        assert _admitted(d) == ids[:1]
        assert not d.dead_letters


# -- throttle and rateLimit ----------------------------------------------------------


def test_a_throttle_paces_a_key_at_its_limit_from_the_table() -> None:
    with _driver(Workflow(name="t", payload=Job, throttle=Throttle(
            limit=1, period="10s", key="tenant", per_key="tiers"))) as d:
        ids = [_start(d, "acme", "t") for _ in range(4)]
        others = [_start(d, "free", "t") for _ in range(2)]
        assert _admitted(d) == [ids[0], others[0]]
        d.advance(2_000)
        d.set_limit("tiers", "acme", 10)  # one per second from now
        d.advance(799)
        assert _admitted(d) == [ids[0], others[0]]
        d.advance(1)
        assert _admitted(d)[-1] == ids[1], "the 8 s owed paid at the new rate: 0.8 s"
        d.advance(1_000)
        assert _admitted(d)[-1] == ids[2]
        times = [a.admitted_at_ms - T0 for a in d.admitted if a.execution_id in ids]
        assert times == [0, 2_800, 3_800]
        d.advance(6_200)
        assert _admitted(d)[-1] == others[1], "the free tenant kept 1 per 10 s"


def test_a_rate_limit_admits_a_key_up_to_its_limit_from_the_table() -> None:
    with _driver(Workflow(name="r", payload=Job, rate_limit=RateLimit(
            limit=1, period="1m", key="tenant", per_key="tiers"))) as d:
        d.set_limit("tiers", "acme", 3)
        ids = [_start(d, "acme", "r") for _ in range(4)]
        free = [_start(d, "free", "r") for _ in range(2)]
        assert _admitted(d) == [*ids[:3], free[0]]
        dropped = [r for r in d.ledger if r.outcome is Outcome.dropped]
        assert [r.key for r in dropped] == ["acme", "free"]
        assert dropped[0].reason.startswith("rateLimit: 3 per 1m for key 'acme'")
        assert dropped[1].reason.startswith("rateLimit: 1 per 1m for key 'free'")
        d.unset_limit("tiers", "acme")
        d.advance(60_000)
        more = [_start(d, "acme", "r") for _ in range(2)]
        assert _admitted(d)[-1] == more[0] and more[1] not in _admitted(d)


def test_payloads_are_the_tenants(tiers: TestDriver) -> None:
    # The admitted start carries the payload as sent: the limit changed nothing in it.
    tiers.set_limit("tiers", "acme", 3)
    _start(tiers, "acme")
    assert json.loads(tiers.admitted[0].payload) == {"tenant": "acme"}
