"""Where a start lands (topology/landing.py): the key a start is produced under is the key
of the task that decides it first, and the SDK's key puts a start on the partition the
worker keys its first hop to (docs/decisions/starts-land-where-decided.md)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from sluicegate.admission.routing import Router
from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    Idempotency,
    Origin,
    RateLimit,
    Singleton,
    Throttle,
    Workflow,
)
from sluicegate.ops.cli.root import app as cli
from sluicegate.schemas.murmur2 import partition_for, python_partition_for
from sluicegate.schemas.records import Outcome, StartRequest
from sluicegate.testing import TestDriver
from sluicegate.topology.keys import identity_store_key
from sluicegate.topology.landing import Landing, Landings, explain
from sluicegate.topology.route import route_for


class Job(BaseModel):
    tenant: str
    order: str = "o1"
    n: int | None = 1


class Click(BaseModel):
    tenant: str


PAYLOAD = {"tenant": "acme", "order": "o-7", "n": 1}


def _start(workflow: str, *, origin: Origin = Origin.event, id: str | None = None,
           request_id: str = "r-1") -> StartRequest:
    return StartRequest(request_id=request_id, workflow=workflow, payload=b"{}", origin=origin,
                        requested_at_ms=1, idempotency_id=id)


def _key(wf: Workflow, start: StartRequest | None = None, payload: Any = PAYLOAD,
         deployment_cap: int = 0) -> bytes:
    landing = Landing.of(wf, route_for(wf, deployment_cap))
    return landing.key(start or _start(wf.name), payload)


FIRST_HOPS = {
    "rateLimit": dict(rate_limit=RateLimit(limit=5, period="1m", key="tenant")),
    "debounce": dict(debounce=Debounce(period="1m", key="tenant")),
    "batch": dict(batch=Batch(item=Click, max_size=10, timeout="10s", key="tenant")),
    "singleton": dict(singleton=Singleton(key="tenant", mode="skip")),
    "throttle": dict(throttle=Throttle(limit=5, period="1m", key="tenant")),
    "concurrency": dict(concurrency=Concurrency(limit=2, key="tenant")),
}


@pytest.mark.parametrize("control", sorted(FIRST_HOPS))
def test_a_start_lands_by_its_first_controls_key_as_the_worker_keys_that_hop(
        control: str) -> None:
    payload_model = Click if control == "batch" else Job
    wf = Workflow(name="w", payload=payload_model, **FIRST_HOPS[control])  # type: ignore[arg-type]
    route = route_for(wf)
    worker_key = Router.key_for(wf, route.hops[1], PAYLOAD).encode()
    assert _key(wf) == worker_key == b"w\x1facme"


def test_a_pooled_limit_lands_by_its_pools_key() -> None:
    wf = Workflow(name="w", payload=Job, concurrency=Concurrency(limit=2, pool="p", key="tenant"))
    assert _key(wf) == b"pool:p\x1facme"


def test_a_passthrough_lands_by_request_id() -> None:
    assert _key(Workflow(name="w", payload=Job)) == b"r-1"


@pytest.mark.parametrize("why", ["unkeyed", "constant", "several throttles", "deployment cap"])
def test_a_first_control_with_one_key_for_all_its_starts_lands_by_request_id(
        why: str) -> None:
    options: dict[str, Any] = {
        "unkeyed": dict(concurrency=Concurrency(limit=2)),
        "constant": dict(concurrency=Concurrency(limit=2, key="'partner'")),
        "several throttles": dict(throttle=[Throttle(limit=5, period="1m", key="tenant"),
                                            Throttle(limit=50, period="1h")]),
        "deployment cap": {},
    }[why]
    wf = Workflow(name="w", payload=Job, **options)
    assert _key(wf, deployment_cap=10) == b"r-1"


def test_an_idempotency_key_of_its_own_lands_there_and_keeps_the_hop() -> None:
    wf = Workflow(name="w", payload=Job, idempotency=Idempotency(key="order"),
                  concurrency=Concurrency(limit=2, key="tenant"))
    assert _key(wf) == identity_store_key("w", "o-7") == b"w\x1fo-7"
    assert "one hop: the idempotency key and concurrency's key differ" in explain(
        Landing.of(wf, route_for(wf)))


def test_an_idempotency_key_equal_to_the_control_key_is_the_same_bytes_and_no_hop() -> None:
    wf = Workflow(name="w", payload=Job, idempotency=Idempotency(key="tenant"),
                  concurrency=Concurrency(limit=2, key="tenant"))
    hop_key = Router.key_for(wf, route_for(wf).hops[1], PAYLOAD).encode()
    assert _key(wf) == hop_key == b"w\x1facme"
    lines = explain(Landing.of(wf, route_for(wf)))
    assert "no hop to concurrency: it is keyed by the same key" in lines
    assert not any("run's row" in line for line in lines[2:])


def test_an_explicit_id_lands_by_that_id_on_every_origin() -> None:
    wf = Workflow(name="w", payload=Job, concurrency=Concurrency(limit=2, key="tenant"))
    for origin in Origin:
        assert _key(wf, _start("w", origin=origin, id="x-9")) == b"w\x1fx-9"


def test_a_declared_idempotency_key_applies_to_event_starts_only() -> None:
    wf = Workflow(name="w", payload=Job, idempotency=Idempotency(key="order"),
                  concurrency=Concurrency(limit=2, key="tenant"))
    assert _key(wf, _start("w", origin=Origin.direct)) == b"w\x1facme"


def test_a_control_that_does_not_apply_to_the_origin_is_passed_over() -> None:
    wf = Workflow(name="w", payload=Job, rate_limit=RateLimit(limit=5, period="1m", key="order"),
                  concurrency=Concurrency(limit=2, key="tenant"))
    assert _key(wf) == b"w\x1fo-7"
    assert _key(wf, _start("w", origin=Origin.direct)) == b"w\x1facme"


def test_a_key_read_from_a_payload_wrapped_as_a_batch_of_one_lands_by_request_id() -> None:
    wf = Workflow(name="w", payload=Click,
                  batch=Batch(item=Click, max_size=10, timeout="10s", key="tenant"),
                  concurrency=Concurrency(limit=2, key="tenant"))
    assert _key(wf, _start("w", origin=Origin.direct)) == b"r-1"
    assert any(line.startswith("direct starts land by request id: its payload is wrapped")
               for line in explain(Landing.of(wf, route_for(wf))))


def test_a_key_expression_that_fails_on_the_payload_lands_by_request_id() -> None:
    wf = Workflow(name="w", payload=Job, concurrency=Concurrency(limit=2, key="'t' + (n - 1)"))
    assert _key(wf, payload={"tenant": "acme", "n": 3}) == b"w\x1ft2"
    assert _key(wf, payload={"tenant": "acme", "n": None}) == b"r-1"


def test_an_undeclared_workflow_lands_by_request_id() -> None:
    landings = Landings(App([Workflow(name="w", payload=Job)]))
    assert landings.key(_start("gone"), PAYLOAD) == b"r-1"


# -- the SDK and the worker agree ------------------------------------------------------------

GATED = Workflow(name="gated", payload=Job, concurrency=Concurrency(limit=1, key="tenant"))


@pytest.mark.parametrize("partitions", [4, 6, 12])
def test_the_sdks_key_puts_a_start_on_the_partition_of_the_workers_hop_key(
        partitions: int) -> None:
    app = App([GATED])
    builder = StartBuilder(app, Settings(partitions=partitions))
    hop = route_for(GATED).hops[1]
    for i in range(50):
        payload = {"tenant": f"t{i}", "order": f"o{i}", "n": i}
        _request, key = builder.build("gated", payload, request_id=f"r{i}")
        worker = Router.key_for(GATED, hop, payload).encode()
        assert python_partition_for(key, partitions) == python_partition_for(worker, partitions)
        assert partition_for(key, partitions) == partition_for(worker, partitions)


@pytest.mark.parametrize("in_order", [False, True])
def test_an_sdk_start_is_decided_where_it_lands_with_its_run_on_that_partition(
        in_order: bool) -> None:
    """Four partitions: identity, the concurrency gate and the run's row are one task.
    Without in-order handover the hop to the gate is written, on the start's partition;
    with it (a worker that has caught up), nothing is written to the gate's topic."""
    with TestDriver(App([GATED]), Settings(partitions=4), in_order=in_order) as driver:
        started = [driver.start("gated", {"tenant": f"t{i % 5}", "order": f"o{i}"})
                   for i in range(20)]
        gate = driver.topics.stage("concurrency")
        hops = driver.sent(gate)
        if in_order:
            assert hops == []
        else:
            assert len(hops) == 20
            by_key = {s.key: s.partition for s in started}
            assert all(w.partition == by_key[w.key] for w in hops)
        admitted = driver.admitted
        assert len(admitted) == 5  # one per tenant: the limit holds
        for run in admitted:
            (slot,) = run.slots
            assert partition_for(run.execution_id.encode(), 4) == partition_for(
                slot.key.encode(), 4)


def test_starts_keyed_by_request_id_are_still_admitted_once_with_the_limit_holding() -> None:
    with TestDriver(App([GATED]), Settings(partitions=4), in_order=True) as driver:
        builder = StartBuilder(driver.app, driver.settings)
        for i in range(20):
            request, _key = builder.build("gated", {"tenant": f"t{i % 5}"}, request_id=f"r{i}",
                                          requested_at_ms=driver.now_ms)
            driver.pipe(driver.topics.starts, request, request.request_id.encode())
        decided = {row.request_id: row.outcome for row in driver.ledger
                   if row.outcome in (Outcome.admitted, Outcome.queued)}
        assert len(decided) == 20
        admitted = driver.admitted
        assert len({run.execution_id for run in admitted}) == len(admitted) == 5
        assert sorted(slot.key for run in admitted for slot in run.slots) == [
            f"gated\x1ft{i}" for i in range(5)]


# -- topology show -----------------------------------------------------------------------------


def test_topology_show_says_where_each_workflows_starts_land_and_which_hops_remain() -> None:
    result = CliRunner().invoke(cli, ["topology", "show", "--app", "examples.declarations"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert ("embeddings: starts -> identity[idempotency embeddings by explicit id] -> "
            "concurrency[concurrency pool:openai by tenantId] -> admitted\n"
            "  lands by concurrency pool:openai's key (tenantId): identity, concurrency "
            "pool:openai and the run's row are decided in one task\n"
            "  a start with an explicit id lands by that id: one hop to concurrency "
            "pool:openai\n") in out
    assert ("  lands by the idempotency key ('tour:' + rowId + ':' + editedAt): identity keeps "
            "its spent keys by it\n"
            "  one hop: the idempotency key and debounce's key differ\n"
            "  one hop to concurrency's key (tenantId): keyed unlike debounce\n") in out
    assert ("note: starts -> identity[idempotency note by explicit id] -> admitted\n"
            "  lands by request id: no control after identity: admitted where identity "
            "decides it\n") in out


def test_an_idempotent_start_keyed_by_anything_is_rekeyed_and_decided_once() -> None:
    """A producer that keys an idempotent start by its request id, or by the control's
    key, is still answered `existing` on every repeat: identity re-keys it to its
    idempotency key's partition first."""
    wf = Workflow(name="w", payload=Job, idempotency=Idempotency(key="order"),
                  concurrency=Concurrency(limit=5, key="tenant"))
    with TestDriver(App([wf]), Settings(partitions=4), in_order=True) as driver:
        builder = StartBuilder(driver.app, driver.settings)
        keys = [lambda r: r.request_id.encode(), lambda r: b"w\x1facme",
                lambda r: builder.build("w", PAYLOAD)[1]]
        for i in range(9):
            request, _key = builder.build("w", PAYLOAD, request_id=f"r{i}",
                                          requested_at_ms=driver.now_ms)
            driver.pipe(driver.topics.starts, request, keys[i % 3](request))
        outcomes = Counter(row.outcome for row in driver.ledger)
        assert outcomes == {Outcome.admitted: 1, Outcome.existing: 8}
        assert len(driver.admitted) == 1
