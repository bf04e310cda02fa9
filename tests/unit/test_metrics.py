"""The inspect server's metrics over a flow view, without a broker: what the alert rules in
deploy/prometheus rely on finding there."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from sluicegate.declare import App, Batch, Concurrency, Debounce, Throttle, Timeouts, Workflow
from sluicegate.ops.services.flow import FlowView, KeyFlow, WorkflowFlow
from sluicegate.ops.services.metrics import (
    KEYS_AT_LIMIT_LISTED,
    FlowCollector,
    InputOffsets,
    WaitBounds,
    wait_bounds,
)
from sluicegate.ops.services.overview import OUTCOMES


class Job(BaseModel):
    tenant: str


def _registry(collector: FlowCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


def test_a_declared_workflow_has_a_zero_for_every_outcome_before_its_first_row() -> None:
    registry = _registry(FlowCollector(lambda: FlowView(now_ms=0),
                                       lambda: [("tour", "admitted", 3)],
                                       declared=["tour", "quiet"], outcomes=OUTCOMES))
    for outcome in OUTCOMES:
        assert registry.get_sample_value("sluicegate_decisions_total",
                                         {"workflow": "quiet", "outcome": outcome}) == 0
    assert registry.get_sample_value("sluicegate_decisions_total",
                                     {"workflow": "tour", "outcome": "admitted"}) == 3
    assert registry.get_sample_value("sluicegate_decisions_total",
                                     {"workflow": "tour", "outcome": "expired"}) == 0


def test_keys_at_their_limit_are_counted_whole_and_listed_up_to_a_cap() -> None:
    full = tuple(KeyFlow(key=f"t{i:03}", in_flight=2, limit=2)
                 for i in range(KEYS_AT_LIMIT_LISTED + 5))
    below = KeyFlow(key="small", in_flight=1, limit=2)
    view = FlowView(now_ms=0, workflows=(
        WorkflowFlow(workflow="perTenant", keys=(*full, below)),
        WorkflowFlow(workflow="report", keys=(KeyFlow(key=None, in_flight=3, limit=3),),
                     limit=3)))
    registry = _registry(FlowCollector(lambda: view, lambda: []))
    assert registry.get_sample_value("sluicegate_keys_at_limit",
                                     {"workflow": "perTenant"}) == len(full)
    listed = [s.labels["key"] for m in registry.collect() for s in m.samples
              if s.name == "sluicegate_key_at_limit" and s.labels["workflow"] == "perTenant"]
    assert listed == [f"t{i:03}" for i in range(KEYS_AT_LIMIT_LISTED)]
    # The one key of an unkeyed limit is the empty text, as in the flow view's JSON.
    assert registry.get_sample_value("sluicegate_key_at_limit",
                                     {"workflow": "report", "key": ""}) == 1
    assert registry.get_sample_value("sluicegate_concurrency_limit",
                                     {"workflow": "report"}) == 3
    assert registry.get_sample_value("sluicegate_concurrency_limit",
                                     {"workflow": "perTenant"}) is None


def test_wait_bounds_are_timeouts_start_and_the_longest_period_of_a_deferring_control() -> None:
    app = App([
        Workflow(name="edits", payload=Job, debounce=Debounce(key="tenant", period="1m")),
        Workflow(name="capped", payload=Job,
                 debounce=Debounce(key="tenant", period="1m", timeout="10m"),
                 timeouts=Timeouts(start="1h")),
        Workflow(name="paced", payload=Job, throttle=[
            Throttle(limit=10, period="1m", key="tenant"), Throttle(limit=100, period="1h")]),
        Workflow(name="gated", payload=Job, concurrency=Concurrency(limit=2),
                 timeouts=Timeouts(start="30s")),
        Workflow(name="plain", payload=Job),
    ])
    assert wait_bounds(app) == {
        "edits": WaitBounds(period_s=60),
        "capped": WaitBounds(start_timeout_s=3600, period_s=600),
        "paced": WaitBounds(period_s=3600),
        "gated": WaitBounds(start_timeout_s=30),
    }
    assert wait_bounds(None) == {}


def test_a_batch_waits_by_its_timeout() -> None:
    class Items(BaseModel):
        items: list[Job]

    app = App([Workflow(name="batched", payload=Items,
                        batch=Batch(item=Job, key="tenant", max_size=10, timeout="2m"))])
    assert wait_bounds(app) == {"batched": WaitBounds(period_s=120)}


def test_the_lag_of_an_input_partition_is_its_end_less_the_committed_offset() -> None:
    registry = _registry(FlowCollector(
        lambda: FlowView(now_ms=0), lambda: [], dead_letters=lambda: 4,
        inputs=lambda: [InputOffsets("sg.starts", 0, committed=10, end=25),
                        InputOffsets("sg.starts", 1, committed=7, end=7)]))
    assert registry.get_sample_value("sluicegate_workers_lag",
                                     {"topic": "sg.starts", "partition": "0"}) == 15
    assert registry.get_sample_value("sluicegate_workers_lag",
                                     {"topic": "sg.starts", "partition": "1"}) == 0
    assert registry.get_sample_value("sluicegate_workers_committed_offset",
                                     {"topic": "sg.starts", "partition": "0"}) == 10
    assert registry.get_sample_value("sluicegate_dead_letters_total") == 4


def test_dead_letters_are_left_out_until_their_count_is_whole() -> None:
    counts: list[int | None] = [None, 12]
    registry = _registry(FlowCollector(lambda: FlowView(now_ms=0), lambda: [],
                                       dead_letters=lambda: counts.pop(0)))
    assert registry.get_sample_value("sluicegate_dead_letters_total") is None
    assert registry.get_sample_value("sluicegate_dead_letters_total") == 12


def test_an_override_in_force_is_a_gauge_of_its_limit_beside_the_declared_one() -> None:
    from sluicegate.schemas.records import OverrideRow

    rows = {
        "concurrency:pool:gpu": OverrideRow(control="concurrency", budget="pool:gpu",
                                            at_ms=1, limit=8, declared=4),
        "concurrency:report": OverrideRow(control="concurrency", budget="report", at_ms=2,
                                          declared=3),  # cleared: none in force
        "throttle:sync": OverrideRow(control="throttle", budget="sync", at_ms=3, limit=10,
                                     period_ms=60_000, declared=30),
    }
    registry = _registry(FlowCollector(lambda: FlowView(now_ms=0), lambda: [],
                                       overrides=lambda: rows))
    labels = {"control": "concurrency", "budget": "pool:gpu"}
    assert registry.get_sample_value("sluicegate_limit_override", labels) == 8
    assert registry.get_sample_value("sluicegate_limit_override_declared", labels) == 4
    assert registry.get_sample_value("sluicegate_limit_override",
                                     {"control": "concurrency", "budget": "report"}) is None
    assert registry.get_sample_value("sluicegate_limit_override_period_seconds",
                                     {"control": "throttle", "budget": "sync"}) == 60


def test_a_pools_limit_in_force_and_a_keys_limit_from_the_limits_table_are_gauges() -> None:
    from sluicegate.admission.limits import LimitChange
    from sluicegate.ops.services.flow import PoolFlow

    tiers = LimitChange("tiers", "acme", 20)
    view = FlowView(now_ms=0, workflows=(WorkflowFlow("perTenant", keys=(
        KeyFlow("acme", in_flight=3, limit=20, limit_row=tiers, declared=2),
        KeyFlow("bolt", in_flight=1, limit=2))),), pools=(
        PoolFlow("gpu", ("embed", "summarize"), in_flight=7, limit=8),
        PoolFlow("tenants", ("fair",), in_flight=3, keys=(
            KeyFlow("acme", in_flight=2, limit=4, limit_row=tiers, declared=2),))))
    registry = _registry(FlowCollector(lambda: view, lambda: []))
    assert registry.get_sample_value("sluicegate_pool_concurrency_limit", {"pool": "gpu"}) == 8
    assert registry.get_sample_value("sluicegate_pool_in_flight", {"pool": "gpu"}) == 7
    assert registry.get_sample_value("sluicegate_pool_concurrency_limit",
                                     {"pool": "tenants"}) is None, "keyed: per key"
    assert registry.get_sample_value("sluicegate_key_concurrency_limit",
                                     {"budget": "perTenant", "key": "acme"}) == 20
    assert registry.get_sample_value("sluicegate_key_concurrency_limit",
                                     {"budget": "perTenant", "key": "bolt"}) is None
    assert registry.get_sample_value("sluicegate_key_concurrency_limit",
                                     {"budget": "pool:tenants", "key": "acme"}) == 4


def test_every_limit_an_override_may_name_is_a_gauge_of_the_limit_in_force() -> None:
    from sluicegate.admission.overrides import targets
    from sluicegate.declare import RateLimit
    from sluicegate.schemas.records import OverrideRow

    app = App([
        Workflow(name="perTenant", payload=Job, concurrency=[
            Concurrency(limit=5, key="tenant"), Concurrency(limit=8, pool="gpu")]),
        Workflow(name="embed", payload=Job, concurrency=Concurrency(limit=8, pool="gpu"),
                 throttle=Throttle(limit=30, period="1m", pool="partner")),
        Workflow(name="alert", payload=Job, rate_limit=RateLimit(limit=2, period="1m")),
        Workflow(name="sync", payload=Job, throttle=[
            Throttle(limit=1, period="1s", key="tenant"), Throttle(limit=9, period="1s")]),
        Workflow(name="scoped", payload=Job, concurrency=Concurrency(
            limit=3, key="tenant", scope="account")),
    ])
    assert [t.name for t in targets(app)] == [
        "concurrency:perTenant", "concurrency:pool:gpu", "rateLimit:alert",
        "throttle:pool:partner"]
    rows = {"concurrency:pool:gpu": OverrideRow(control="concurrency", budget="pool:gpu",
                                                at_ms=1, limit=2, declared=8),
            "rateLimit:alert": OverrideRow(control="rateLimit", budget="alert", at_ms=1,
                                           limit=5, period_ms=10_000, declared=2)}
    registry = _registry(FlowCollector(lambda: FlowView(now_ms=0), lambda: [],
                                       overrides=lambda: rows, limits=targets(app)))

    def gauge(name: str, control: str, budget: str) -> float | None:
        return registry.get_sample_value(name, {"control": control, "budget": budget})

    assert gauge("sluicegate_limit_in_force", "concurrency", "perTenant") == 5
    assert gauge("sluicegate_limit_in_force", "concurrency", "pool:gpu") == 2
    assert gauge("sluicegate_limit_in_force", "throttle", "pool:partner") == 30
    assert gauge("sluicegate_limit_in_force_period_seconds", "throttle", "pool:partner") == 60
    assert gauge("sluicegate_limit_in_force", "rateLimit", "alert") == 5
    assert gauge("sluicegate_limit_in_force_period_seconds", "rateLimit", "alert") == 10
