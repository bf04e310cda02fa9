"""The flow view from hand-made ledger rows, run rows and pause rows: exact counts, and
`waiting=` as the age of the oldest queued start at a fixed now."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from sluicegate.admission.limits import LimitChange
from sluicegate.ops.services.flow import (
    SlotLimit,
    compute,
    flow_view,
    in_flight,
    with_overrides,
)
from sluicegate.ops.services.ledger import LedgerDb, fill
from sluicegate.schemas.records import (
    ControlRow,
    LedgerRecord,
    Outcome,
    OverrideRow,
    RunRow,
    RunStatus,
    Slot,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MIN = 60_000
NOW = T0 + 60 * MIN


def rec(request_id: str, outcome: Outcome, at_ms: int, workflow: str = "tourNarration",
        **more: object) -> LedgerRecord:
    fields: dict[str, object] = {"requested_at_ms": at_ms, "decided_at_ms": at_ms}
    fields.update(more)
    return LedgerRecord(request_id=request_id, workflow=workflow, outcome=outcome,
                        **fields)  # type: ignore[arg-type]


def run(execution_id: str, workflow: str, status: RunStatus, *slots: Slot) -> RunRow:
    return RunRow(execution_id=execution_id, workflow=workflow, status=status, payload=b"{}",
                  declaration_version="v1", admitted_at_ms=T0, updated_at_ms=T0,
                  slots=list(slots), keys={s.stage: s.key for s in slots})


@pytest.fixture
def db() -> LedgerDb:
    return LedgerDb(":memory:")


def test_queued_counts_starts_whose_latest_row_is_queued_and_waiting_is_the_oldest(
        db: LedgerDb) -> None:
    fill(db, [
        # r1 waits since T0 + 12 min: the oldest wait is 48 minutes at NOW.
        rec("r1", Outcome.queued, T0 + 12 * MIN, key="tour:a", deferral="debounce"),
        rec("r2", Outcome.queued, T0 + 30 * MIN, key="tour:a", deferral="debounce"),
        # r3 was queued, then collapsed: no longer queued, counted once as collapsed.
        rec("r3", Outcome.queued, T0, key="tour:a", deferral="debounce"),
        rec("r3", Outcome.collapsed, T0 + 1 * MIN, key="tour:a", execution_id="e1"),
        # r4 was queued then admitted: its key has nothing to show and is left out.
        rec("r4", Outcome.queued, T0, key="tour:b"),
        rec("r4", Outcome.admitted, T0 + 15 * MIN, key="tour:b", execution_id="e2"),
    ])
    view = flow_view(db, [], {}, NOW)
    (wf,) = view.workflows
    (a,) = wf.keys
    assert (a.key, a.queued, a.collapsed, a.oldest_queued_at_ms, a.waiting_ms) == (
        "tour:a", 2, 1, T0 + 12 * MIN, 48 * MIN)
    assert a.waiting == "48m00s"
    assert wf.total().queued == 2 and wf.total().waiting_ms == 48 * MIN


def test_a_debounced_row_waits_from_the_first_start_of_its_burst(db: LedgerDb) -> None:
    # The carrier's row is decided at +20 min, having waited 20 min since the burst began.
    fill(db, [rec("r9", Outcome.queued, T0 + 20 * MIN, key="k", waited_ms=20 * MIN,
                  requested_at_ms=T0 + 20 * MIN)])
    (key,) = flow_view(db, [], {}, NOW).workflows[0].keys
    assert (key.oldest_queued_at_ms, key.waiting) == (T0, "1h00m00s")


def test_dropped_expired_and_collapsed_are_counted_per_workflow_and_key(db: LedgerDb) -> None:
    fill(db, [
        rec("d1", Outcome.dropped, T0, workflow="sync", key="acct-1", retry_after_ms=500),
        rec("d2", Outcome.dropped, T0, workflow="sync", key="acct-1", retry_after_ms=500),
        rec("d3", Outcome.dropped, T0, workflow="sync", key="acct-2", retry_after_ms=500),
        rec("x1", Outcome.queued, T0, workflow="sync", key="acct-2"),
        rec("x1", Outcome.expired, T0 + MIN, workflow="sync", key="acct-2"),
        rec("c1", Outcome.collapsed, T0, workflow="tour", key="t"),
        # A row about a run (a lapsed lease) is not a start and counts nowhere.
        rec("run:e1:lease:1", Outcome.expired, T0, workflow="sync", key="acct-1"),
    ])
    view = flow_view(db, [], {}, NOW)
    sync = view.get("sync")
    assert sync is not None
    assert [(k.key, k.queued, k.dropped, k.expired) for k in sync.keys] == [
        ("acct-1", 0, 2, 0), ("acct-2", 0, 1, 1)]
    tour = view.get("tour")
    assert tour is not None and [(k.key, k.collapsed) for k in tour.keys] == [("t", 1)]
    only = flow_view(db, [], {}, NOW, workflow="tour")
    assert [w.workflow for w in only.workflows] == ["tour"]


def test_in_flight_counts_live_runs_per_concurrency_slot_as_the_ledger_shows_its_key() -> None:
    runs = [
        run("e1", "perTenant", RunStatus.running, Slot("concurrency", "perTenant\x1facme")),
        run("e2", "perTenant", RunStatus.admitted, Slot("concurrency", "perTenant\x1facme")),
        run("e3", "perTenant", RunStatus.suspended, Slot("concurrency", "perTenant\x1fzeta")),
        run("e4", "perTenant", RunStatus.completed, Slot("concurrency", "perTenant\x1facme")),
        # A slot shows its key's text (an unkeyed pool's is empty); a run with two limits
        # counts under each.
        run("e5", "fairJob", RunStatus.running, Slot("concurrency", "fairJob\x1facme"),
            Slot("concurrency", "pool:gpu\x1f"), Slot("singleton", "fairJob\x1fx")),
        # No concurrency slot: one run under the workflow's one key.
        run("e6", "note", RunStatus.running),
        run("e7", "note", RunStatus.failed),
    ]
    assert in_flight(runs) == {
        ("perTenant", "acme"): 2, ("perTenant", "zeta"): 1,
        ("fairJob", "acme"): 1, ("fairJob", ""): 1, ("note", ""): 1,
    }


def test_paused_comes_from_the_control_row_and_declared_workflows_are_listed() -> None:
    control = {
        "tour": ControlRow(workflow="tour", paused=True, at_ms=T0, reason="deploying a fix",
                           by="ana"),
        "sync": ControlRow(workflow="sync", paused=False, at_ms=T0 + MIN, by="ana"),
    }
    view = compute({}, {("perTenant", "acme"): 3}, control, NOW, declared=["quiet"])
    assert [(w.workflow, w.paused) for w in view.workflows] == [
        ("perTenant", False), ("quiet", False), ("sync", False), ("tour", True)]
    tour = view.get("tour")
    assert tour is not None
    assert tour.to_json()["pause"] == {"paused": True, "at_ms": T0, "reason": "deploying a fix",
                                       "by": "ana"}
    per_tenant = view.get("perTenant")
    assert per_tenant is not None
    assert per_tenant.to_json()["keys"] == [{
        "key": "acme", "queued": 0, "waiting": None, "waiting_ms": None,
        "oldest_queued_at_ms": None, "collapsed": 0, "dropped": 0, "expired": 0,
        "in_flight": 3, "limit": None, "override": None, "limit_row": None}]
    assert "tour  PAUSED (deploying a fix)" in view.text()
    assert "key=acme  queued=0 collapsed=0 dropped=0 expired=0 in_flight=3" in view.text()


def test_a_key_with_queued_starts_and_running_runs_is_one_line(db: LedgerDb) -> None:
    fill(db, [rec("q1", Outcome.queued, T0 + 48 * MIN, workflow="perTenant", key="acme",
                  deferral="concurrency")])
    runs = [run(f"e{i}", "perTenant", RunStatus.running, Slot("concurrency", "perTenant\x1facme"))
            for i in range(5)]
    view = flow_view(db, runs, {}, NOW)
    (key,) = view.workflows[0].keys
    assert (key.key, key.queued, key.in_flight, key.waiting) == ("acme", 1, 5, "12m00s")
    assert "queued=1 waiting=12m00s" in view.text()


def test_in_flight_shows_the_declared_limit_beside_it() -> None:
    limits = {"perTenant": SlotLimit(2, keyed=True), "report": SlotLimit(2, keyed=False)}
    view = compute({}, {("perTenant", "acme"): 2, ("report", ""): 1}, {}, NOW, limits=limits)
    text = view.text()
    # A keyed limit bounds each key, not the workflow; an unkeyed one bounds both lines.
    assert "perTenant  running  queued=0 collapsed=0 dropped=0 expired=0 in_flight=2\n" in text
    assert "key=acme  queued=0 collapsed=0 dropped=0 expired=0 in_flight=2/2" in text
    assert "report  running  queued=0 collapsed=0 dropped=0 expired=0 in_flight=1/2" in text
    report = view.get("report")
    assert report is not None and report.to_json()["total"]["limit"] == 2


def test_an_override_shows_beside_the_limit_it_replaces_with_who_why_and_the_declared_one(
) -> None:
    overrides = {"concurrency:sync": OverrideRow(
        control="concurrency", budget="sync", at_ms=T0 + 12 * MIN, limit=10, declared=50,
        reason="partner 503s", by="ana")}
    limits = with_overrides({"sync": SlotLimit(50, keyed=False),
                             "tour": SlotLimit(4, keyed=False)}, overrides)
    view = compute({}, {("sync", ""): 3, ("tour", ""): 1}, {}, NOW, limits=limits)
    assert ('in_flight=3/10 (override since 00:12:00 UTC by ana: "partner 503s"; declared 50)'
            in view.text())
    assert "in_flight=1/4\n" in view.text() + "\n", "no override, no note"
    sync = view.get("sync")
    assert sync is not None
    assert sync.to_json()["total"]["override"] == {
        "limit": 10, "declared": 50, "at_ms": T0 + 12 * MIN, "by": "ana",
        "reason": "partner 503s"}
    cleared = {"concurrency:sync": OverrideRow(control="concurrency", budget="sync",
                                               at_ms=T0 + 20 * MIN, declared=50)}
    view = compute({}, {("sync", ""): 3}, {}, NOW,
                   limits=with_overrides({"sync": SlotLimit(50, keyed=False)}, cleared))
    assert "in_flight=3/50\n" in view.text() + "\n"


def test_the_unkeyed_key_is_one_row_spelt_one_key(db: LedgerDb) -> None:
    """An unkeyed concurrency limit's queued starts (key "") and a run holding no slot
    are the same key: the workflow's one key, spelt as `topology show` spells it."""
    fill(db, [rec("q1", Outcome.queued, T0, workflow="report", key="", deferral="concurrency"),
              rec("q2", Outcome.queued, T0, workflow="report", key=None, deferral="pause")])
    view = flow_view(db, [run("e1", "report", RunStatus.running)], {}, NOW)
    (key,) = view.workflows[0].keys
    assert (key.key, key.queued, key.in_flight) == ("", 2, 1)
    assert "  key=(one key)  queued=2" in view.text()
    assert "''" not in view.text() and "(none)" not in view.text()


def test_a_workflow_whose_starts_were_all_admitted_is_listed(db: LedgerDb) -> None:
    fill(db, [rec("a1", Outcome.admitted, T0, workflow="sendReceipt", key="o1"),
              rec("a2", Outcome.existing, T0, workflow="sendReceipt", key="o1")])
    view = flow_view(db, [], {}, NOW)
    assert [w.workflow for w in view.workflows] == ["sendReceipt"]


def test_a_key_with_a_row_in_the_limits_table_shows_that_limit_and_the_declared_one() -> None:
    tiers = {("tiers", "acme"): LimitChange("tiers", "acme", 20, T0, "enterprise", "billing")}
    limits = {"perTenant": SlotLimit(2, keyed=True, per_key="tiers")}
    view = compute({}, {("perTenant", "acme"): 3, ("perTenant", "bolt"): 1}, {}, NOW,
                   limits=limits, key_limits=tiers, limits_topic="sg.limits")
    assert "  key=acme  queued=0 collapsed=0 dropped=0 expired=0 in_flight=3/20 (from " \
           "sg.limits; declared 2)" in view.text()
    assert "  key=bolt  queued=0 collapsed=0 dropped=0 expired=0 in_flight=1/2\n" in (
        view.text() + "\n"), "a key the table does not name has the declared limit"
    flow = view.get("perTenant")
    assert flow is not None
    assert flow.to_json()["keys"][0]["limit_row"] == {
        "name": "tiers", "key": "acme", "limit": 20, "declared": 2, "at_ms": T0,
        "by": "billing", "reason": "enterprise"}
    # An override is every key's limit, whatever the table gives a key.
    overridden = with_overrides(limits, {"concurrency:perTenant": OverrideRow(
        control="concurrency", budget="perTenant", at_ms=T0, limit=1, declared=2)})
    view = compute({}, {("perTenant", "acme"): 3}, {}, NOW, limits=overridden,
                   key_limits=tiers)
    assert "in_flight=3/1 (override since" in view.text()


def test_a_pool_shows_every_members_runs_against_its_limit_and_its_override() -> None:
    from sluicegate.declare import App, Concurrency, Workflow
    from sluicegate.ops.services.flow import pool_in_flight, pool_limits

    class Job(BaseModel):
        tenant: str

    app = App([Workflow(name="embed", payload=Job, concurrency=Concurrency(limit=3, pool="gpu")),
               Workflow(name="summarize", payload=Job, concurrency=[
                   Concurrency(limit=5, key="tenant"), Concurrency(limit=3, pool="gpu")]),
               Workflow(name="fair", payload=Job, concurrency=Concurrency(
                   limit=2, pool="tenants", key="tenant", per_key="tiers"))])
    pools = with_overrides(pool_limits(app), {"concurrency:pool:gpu": OverrideRow(
        control="concurrency", budget="pool:gpu", at_ms=T0 + 12 * MIN, limit=8, declared=3,
        reason="new nodes", by="ana")})
    runs = [run("e1", "embed", RunStatus.running, Slot("concurrency", "pool:gpu\x1f")),
            run("e2", "summarize", RunStatus.running, Slot("concurrency", "summarize\x1fa"),
                Slot("concurrency", "pool:gpu\x1f")),
            run("e3", "summarize", RunStatus.completed, Slot("concurrency", "pool:gpu\x1f")),
            run("e4", "fair", RunStatus.running, Slot("concurrency", "pool:tenants\x1facme")),
            run("e5", "fair", RunStatus.running, Slot("concurrency", "pool:tenants\x1facme")),
            run("e6", "fair", RunStatus.running, Slot("concurrency", "pool:tenants\x1fbolt"))]
    tiers = {("tiers", "acme"): LimitChange("tiers", "acme", 4)}
    view = compute({}, in_flight(runs), {}, NOW, declared=sorted(app.workflows),
                   pools=pools, pool_running=pool_in_flight(runs), key_limits=tiers)
    lines = view.text().splitlines()
    assert ('pool gpu (embed, summarize)  in_flight=2/8 (override since 00:12:00 UTC by ana: '
            '"new nodes"; declared 3)') in lines
    assert lines[-3:] == ["pool tenants (fair)  in_flight=3",
                          "  key=acme  in_flight=2/4 (from sg.limits; declared 2)",
                          "  key=bolt  in_flight=1/2"]
    assert view.to_json()["pools"][0] == {
        "pool": "gpu", "members": ["embed", "summarize"], "in_flight": 2, "limit": 8,
        "override": {"limit": 8, "declared": 3, "at_ms": T0 + 12 * MIN, "by": "ana",
                     "reason": "new nodes"}, "keys": []}
    # A workflow's own view lists the pools it is a member of.
    assert [p.pool for p in view.only("embed").pools] == ["gpu"]


def test_a_workflow_with_two_limits_names_its_own_in_force_on_its_line() -> None:
    from sluicegate.declare import App, Concurrency, Workflow
    from sluicegate.ops.services.flow import paired_limits

    class Job(BaseModel):
        tenant: str

    app = App([Workflow(name="fetch", payload=Job, concurrency=[
                   Concurrency(limit=5, key="tenant", per_key="tiers"),
                   Concurrency(limit=2)]),
               Workflow(name="fair", payload=Job, concurrency=[
                   Concurrency(limit=9, key="tenant"), Concurrency(limit=4, pool="gpu")]),
               Workflow(name="one", payload=Job, concurrency=3)])
    paired = with_overrides(paired_limits(app), {"concurrency:fetch#1": OverrideRow(
        control="concurrency", budget="fetch#1", at_ms=T0 + 12 * MIN, limit=1, declared=2,
        reason="partner 503s", by="ana")})
    assert sorted(paired) == ["fair", "fetch", "fetch#1"], "a pool's has lines of its own"
    view = compute({}, {("fetch", "acme"): 2, ("fetch", ""): 2}, {}, NOW,
                   declared=sorted(app.workflows), paired=paired)
    lines = {line.split()[0]: line for line in view.text().splitlines()}
    assert lines["fetch"].endswith(
        "in_flight=4  limits: concurrency[0]=5 per key (or its row of tiers in sg.limits), "
        'concurrency[1]=1 (override since 00:12:00 UTC by ana: "partner 503s"; declared 2)'
    ), lines
    assert lines["fair"].endswith("in_flight=0  limits: concurrency[0]=9 per key")
    assert "limits:" not in lines["one"]
    fetch = view.get("fetch")
    assert fetch is not None and fetch.to_json()["limits"][1] == {
        "control": "concurrency[1]", "budget": "fetch#1", "limit": 1, "keyed": False,
        "per_key": None, "override": {"limit": 1, "declared": 2, "at_ms": T0 + 12 * MIN,
                                      "by": "ana", "reason": "partner 503s"}}
