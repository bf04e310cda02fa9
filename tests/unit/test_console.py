"""The console's pieces without a broker: why each start waits, a run looked up by any of
its ids, and the checks the inspect server makes before it changes anything."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from pydantic import BaseModel

import sluicegate.ops
from sluicegate.config import Settings
from sluicegate.declare import App, Batch, Concurrency, Workflow
from sluicegate.ops.inspect import (
    Refused,
    allowed_hosts,
    check_write,
    cross_site,
    host_name,
)
from sluicegate.ops.services.ledger import LedgerDb, fill
from sluicegate.ops.services.runs import NotFound, RunsIndex, lookup, text
from sluicegate.ops.services.waiting import waiting_starts
from sluicegate.schemas.records import (
    ControlRow,
    LedgerRecord,
    Outcome,
    RunRow,
    RunStatus,
    Slot,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# What a start behind a concurrency limit whose line has not moved lately is told.
NO_ESTIMATE = "; no estimate yet: no start has left this line in the last 10 min"
S = 1000


class Job(BaseModel):
    tenant: str


class Item(BaseModel):
    sku: str


class Items(BaseModel):
    items: list[Item]


APP = App([
    Workflow(name="perTenant", payload=Job, concurrency=Concurrency(limit=2, key="tenant")),
    Workflow(name="twoLimits", payload=Job, concurrency=[
        Concurrency(limit=7, key="tenant"), Concurrency(limit=3, pool="gpu")]),
    Workflow(name="stock", payload=Items,
             batch=Batch(item=Item, max_size=10, key="sku", timeout="30s")),
])


def rec(request_id: str, outcome: Outcome, at_ms: int, workflow: str = "perTenant",
        **more: object) -> LedgerRecord:
    return LedgerRecord(request_id=request_id, workflow=workflow, outcome=outcome,
                        requested_at_ms=at_ms, decided_at_ms=at_ms, **more)  # type: ignore[arg-type]


def queued(request_id: str, at_ms: int, workflow: str, deferral: str, key: str | None,
           control: str | None = None, **more: object) -> LedgerRecord:
    return rec(request_id, Outcome.queued, at_ms, workflow, deferral=deferral, key=key,
               control=control or deferral, **more)


# -- why is it waiting ------------------------------------------------------------------


def test_each_waiting_start_says_which_control_holds_it_and_until_when() -> None:
    db = LedgerDb(":memory:")
    fill(db, [
        # Three of tenant acme behind a limit of 2; the first has since been admitted.
        queued("a1", T0, "perTenant", "concurrency", "acme", position=1),
        queued("a2", T0 + S, "perTenant", "concurrency", "acme", position=2),
        queued("a3", T0 + 2 * S, "perTenant", "concurrency", "acme", position=3),
        rec("a1", Outcome.admitted, T0 + 3 * S, execution_id="e1"),
        # The second limit of a workflow with two, behind a pool.
        queued("g1", T0, "twoLimits", "concurrency", "", control="concurrency[1] pool:gpu"),
        queued("d1", T0, "tourNarration", "debounce", "tour:r1", due_at_ms=T0 + 900 * S),
        queued("t1", T0, "partner", "throttle", "", due_at_ms=T0 + 5 * S),
        # Ranked by its priority behind more than could be counted: no slot time.
        queued("t2", T0 + S, "partner", "throttle", "u9"),
        queued("b1", T0, "stock", "batch", "p1", due_at_ms=T0 + 30 * S),
        queued("b2", T0 + S, "stock", "batch", "p1", due_at_ms=T0 + 30 * S),
        queued("p1", T0, "report", "pause", "report"),
        queued("l1", T0, "later", "delayed", None, control="idempotency",
               due_at_ms=T0 + 3600 * S),
        # Rows about runs are not starts.
        queued("run:e9:lease", T0, "perTenant", "concurrency", "acme"),
    ])
    pause = ControlRow(workflow="report", paused=True, at_ms=T0 - 60 * S,
                       reason="deploying a fix", by="ana")
    why = {w.request_id: w for w in waiting_starts(db, {"report": pause}, app=APP,
                                                   now_ms=T0)}

    assert set(why) == {"a2", "a3", "g1", "d1", "t1", "t2", "b1", "b2", "p1", "l1"}
    assert why["a2"].why == ("concurrency on key 'acme': position 1 of 2 behind a limit of 2"
                             "; no estimate yet: no start has left this line in the last 10 min")
    assert (why["a3"].rank, why["a3"].waiting, why["a3"].position) == (2, 2, 3)
    assert why["g1"].why == "concurrency: position 1 of 1 behind a limit of 3" + NO_ESTIMATE
    assert why["d1"].why.startswith("debounce on key 'tour:r1' until 00:15:00 UTC")
    assert why["t1"].why == "throttle: its slot is at 00:00:05 UTC"
    assert why["t2"].why == ("throttle on key 'u9': its slot comes after those of many "
                             "starts ahead of it")
    assert why["b2"].why == "batch 2/10 on key 'p1' until 00:00:30 UTC"
    # Not today: with its date.
    assert why["p1"].why == "paused since 2025-12-31 23:59:00 UTC (deploying a fix)"
    assert why["l1"].why == "delayed until 01:00:00 UTC (its `at`)"
    assert why["d1"].to_json()["due_at"] == "2026-01-01T00:15:00.000Z"


def test_an_instant_that_is_not_today_is_given_with_its_date_and_zone() -> None:
    db = LedgerDb(":memory:")
    week = 7 * 24 * 3600 * S
    fill(db, [queued("d1", T0, "tourNarration", "debounce", "tour:r1", due_at_ms=T0 + week)])
    (today,) = waiting_starts(db, {}, now_ms=T0 + week)
    assert today.why.startswith("debounce on key 'tour:r1' until 00:00:00 UTC ")
    (later,) = waiting_starts(db, {}, now_ms=T0)
    assert later.why.startswith("debounce on key 'tour:r1' until 2026-01-08 00:00:00 UTC ")


def test_a_start_held_by_a_control_of_a_paused_workflow_says_the_pause_comes_next() -> None:
    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "perTenant", "concurrency", "acme")])
    pause = ControlRow(workflow="perTenant", paused=True, at_ms=T0, reason="x")
    (only,) = waiting_starts(db, {"perTenant": pause}, app=APP)
    assert only.why == ("concurrency on key 'acme': position 1 of 1 behind a limit of 2; "
                        "no estimate yet: no start has left this line in the last 10 min; "
                        "then the pause (the workflow is paused)")


def test_without_declarations_the_limit_is_not_guessed() -> None:
    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "perTenant", "concurrency", "acme")])
    (only,) = waiting_starts(db, {})
    assert only.why == "concurrency on key 'acme': position 1 of 1" + NO_ESTIMATE
    assert only.limit is None


def test_the_deployment_cap_is_the_limit_of_its_rows() -> None:
    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "perTenant", "concurrency", "", control="deployment cap")])
    (only,) = waiting_starts(db, {}, deployment_cap=40)
    assert only.why == "concurrency: position 1 of 1 behind a limit of 40" + NO_ESTIMATE


def test_a_start_waits_behind_the_limit_in_force_an_override_where_one_is_set() -> None:
    from sluicegate.schemas.records import OverrideRow

    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "perTenant", "concurrency", "acme"),
              queued("g1", T0, "twoLimits", "concurrency", "", control="concurrency[1] pool:gpu"),
              queued("t1", T0, "twoLimits", "concurrency", "acme", control="concurrency[0]")])
    overrides = {"concurrency:perTenant": OverrideRow(control="concurrency",
                                                      budget="perTenant", at_ms=T0, limit=1),
                 "concurrency:pool:gpu": OverrideRow(control="concurrency", budget="pool:gpu",
                                                     at_ms=T0, limit=9)}
    limits = {w.request_id: w.limit for w in waiting_starts(db, {}, app=APP,
                                                            overrides=overrides)}
    assert limits == {"a1": 1, "g1": 9, "t1": 7}


def test_a_start_waits_behind_its_keys_limit_from_the_limits_table_said_so() -> None:
    from sluicegate.admission.limits import LimitChange
    from sluicegate.schemas.records import OverrideRow

    app = App([Workflow(name="tiered", payload=Job, concurrency=Concurrency(
        limit=2, key="tenant", per_key="tiers"))])
    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "tiered", "concurrency", "acme"),
              queued("b1", T0, "tiered", "concurrency", "bolt")])
    tiers = {("tiers", "acme"): LimitChange("tiers", "acme", 20)}
    why = {w.request_id: w for w in waiting_starts(db, {}, app=app, key_limits=tiers)}
    assert (why["a1"].limit, why["b1"].limit) == (20, 2)
    assert why["a1"].why == ("concurrency on key 'acme': position 1 of 1 behind a limit of 20 "
                             "(the key's, from the limits table; declared 2)" + NO_ESTIMATE)
    assert why["b1"].why == ("concurrency on key 'bolt': position 1 of 1 behind a limit of 2"
                             + NO_ESTIMATE)
    # An override is every key's limit while it is set.
    overrides = {"concurrency:tiered": OverrideRow(control="concurrency", budget="tiered",
                                                   at_ms=T0, limit=1)}
    (a1, _) = waiting_starts(db, {}, app=app, key_limits=tiers, overrides=overrides)
    assert a1.why.startswith("concurrency on key 'acme': position 1 of 1 behind a limit of 1 "
                             "(an override; declared 2)")


def test_waiting_is_filtered_by_workflow_and_key() -> None:
    db = LedgerDb(":memory:")
    fill(db, [queued("a1", T0, "perTenant", "concurrency", "acme"),
              queued("b1", T0, "perTenant", "concurrency", "bolt"),
              queued("d1", T0, "tourNarration", "debounce", "acme")])
    assert [w.request_id for w in waiting_starts(db, {}, workflow="perTenant", key="acme")
            ] == ["a1"]


# -- one run, whole ---------------------------------------------------------------------

RUN = RunRow(execution_id="0f3c9a6e-0000-5000-8000-000000000001", workflow="tourNarration",
             status=RunStatus.completed, payload=b'{"rowId": "r1"}', declaration_version="v1",
             admitted_at_ms=T0 + 60 * S, updated_at_ms=T0 + 90 * S,
             slots=[Slot(stage="concurrency", key="tourNarration\x1facme")], keys={},
             ended_at_ms=T0 + 90 * S)


def _history() -> tuple[LedgerDb, RunsIndex]:
    eid = RUN.execution_id
    db = LedgerDb(":memory:")
    fill(db, [
        queued("r1", T0, "tourNarration", "debounce", "tour:r1"),
        rec("r1", Outcome.collapsed, T0 + 10 * S, "tourNarration", execution_id=eid,
            key="tour:r1", reason="superseded by a later start"),
        queued("r2", T0 + 10 * S, "tourNarration", "debounce", "tour:r1"),
        rec("r2", Outcome.admitted, T0 + 60 * S, "tourNarration", execution_id=eid,
            folded=1, key="tour:r1"),
        rec("r3", Outcome.existing, T0 + 70 * S, "tourNarration", execution_id=eid,
            key="tour:r1:7", control="idempotency"),
        rec("other", Outcome.admitted, T0, "tourNarration", execution_id="e-other"),
    ])
    runs = RunsIndex(Settings())
    runs.apply(eid.encode(), _encoded(RUN, RunStatus.admitted))
    runs.apply(eid.encode(), _encoded(RUN, RunStatus.completed))
    return db, runs


def _encoded(row: RunRow, status: RunStatus) -> bytes:
    import dataclasses

    from sluicegate.schemas import codec

    return codec.encode(dataclasses.replace(row, status=status))


@pytest.mark.parametrize(("ident", "matched"), [
    (RUN.execution_id, "execution id"),
    (RUN.execution_id[:8], "execution id prefix"),
    ("r1", "request id"),
    ("tour:r1:7", "idempotency key"),
])
def test_a_run_is_found_by_any_of_its_ids_with_its_whole_history(ident: str,
                                                                  matched: str) -> None:
    db, runs = _history()
    doc = lookup(db, runs, ident)
    assert doc["matched"] == matched
    assert doc["execution_ids"] == [RUN.execution_id]
    assert [(r["request_id"], r["outcome"]) for r in doc["ledger"]] == [
        ("r1", "queued"), ("r1", "collapsed"), ("r2", "queued"), ("r2", "admitted"),
        ("r3", "existing")]
    (run,) = doc["runs"]
    assert run["status"] == "completed"
    assert [c["status"] for c in run["changes"]] == ["admitted", "completed"]
    assert run["slots"] == [{"stage": "concurrency", "key": "acme"}]
    assert run["payload"] == {"rowId": "r1"}  # the object, not its JSON text
    assert run["payload_note"] is None
    shown = text(doc)
    assert f"run {RUN.execution_id}  tourNarration  completed" in shown
    assert "collapsed" in shown and "superseded by a later start" in shown


class Edit(BaseModel):
    rowId: str
    text: str


def test_a_run_is_found_by_its_idempotency_key_from_its_first_start_on() -> None:
    """The key names the run before any repeat answered `existing` (issue 36, point 10):
    here a debounce is the last control, so no ledger row of the run carries the key."""
    from sluicegate.declare import Debounce, Idempotency
    from sluicegate.testing import TestDriver

    app = App([Workflow(name="narrate", payload=Edit, idempotency=Idempotency(key="'k:' + rowId"),
                        debounce=Debounce(key="rowId", period="1 minute"))])
    with TestDriver(app) as driver:
        driver.start("narrate", {"rowId": "r1", "text": "first"})
        driver.advance(120_000)
        driver.commit()
        (admitted,) = driver.admitted
        assert [r.control for r in driver.ledger] == ["debounce", "debounce"]
        db = LedgerDb(":memory:")
        fill(db, driver.ledger)
        runs = RunsIndex(Settings())
        for written in driver.sent(driver.topics.runs):
            runs.apply(written.key, written.value)
        for written in driver.sent(driver.topics.changelog("identity")):
            runs.apply_key(written.key, written.value)
    doc = lookup(db, runs, "k:r1")
    assert doc["matched"] == "idempotency key"
    assert doc["execution_ids"] == [admitted.execution_id]
    assert [r["outcome"] for r in doc["ledger"]] == ["queued", "admitted"]
    assert [r["execution_id"] for r in doc["runs"]] == [admitted.execution_id]


def test_a_sealed_payload_is_null_in_json_with_a_note_saying_what_it_is() -> None:
    from sluicegate.ops.services.runs import run_json

    doc = run_json(dataclasses.replace(RUN, payload=b"sg1:k1:gAAAAA"), [])
    assert doc["payload"] is None
    assert doc["payload_note"] == "(13 bytes, not JSON: sealed, or another encoding)"


def test_an_unknown_id_or_an_ambiguous_prefix_is_not_found() -> None:
    db, runs = _history()
    with pytest.raises(NotFound, match="no run or request has the id 'nosuch'"):
        lookup(db, runs, "nosuch")
    fill(db, [rec("x", Outcome.admitted, T0, execution_id=RUN.execution_id[:10] + "ffff")])
    with pytest.raises(NotFound, match="begins 2 execution ids"):
        lookup(db, runs, RUN.execution_id[:8])


# -- the checks before a change -------------------------------------------------------


def test_a_cross_site_request_is_refused_whatever_it_carries() -> None:
    assert cross_site({"origin": "http://evil.example", "host": "127.0.0.1:8787"},
                      "http") is not None
    assert cross_site({"sec-fetch-site": "cross-site"}, "http") is not None
    assert cross_site({"sec-fetch-site": "same-site"}, "http") is not None
    assert cross_site({"origin": "http://127.0.0.1:8787", "host": "127.0.0.1:8787",
                       "sec-fetch-site": "same-origin"}, "http") is None
    assert cross_site({}, "http") is None  # curl: no browser, no ambient credentials


def test_a_change_needs_the_same_origin_then_the_token_then_json() -> None:
    good = {"host": "127.0.0.1:1", "authorization": "Bearer s3cret",
            "content-type": "application/json"}
    check_write(good, "http", "s3cret")
    cases = [({**good, "origin": "http://evil.example"}, 403),
             ({k: v for k, v in good.items() if k != "authorization"}, 401),
             ({**good, "authorization": "Bearer wrong"}, 401),
             ({**good, "authorization": "Basic s3cret"}, 401),
             ({**good, "content-type": "text/plain"}, 415)]
    for headers, status in cases:
        with pytest.raises(Refused) as refused:
            check_write(headers, "http", "s3cret")
        assert refused.value.status == status, headers


def test_the_server_answers_to_its_own_names_only() -> None:
    assert host_name("127.0.0.1:8787") == "127.0.0.1"
    assert host_name("[::1]:8787") == "::1"
    assert host_name("LocalHost") == "localhost"
    hosts = allowed_hosts("127.0.0.1")
    assert {"127.0.0.1", "localhost", "::1"} <= hosts
    assert "evil.example" not in hosts
    assert "ops.internal" in allowed_hosts("127.0.0.1", ("ops.internal",))


# -- the overview -----------------------------------------------------------------------


def test_the_overview_counts_requests_by_outcome_and_per_minute() -> None:
    import time

    from sluicegate.ops.services.flow import compute, concurrency_limits
    from sluicegate.ops.services.overview import overview

    now = int(time.time() * 1000)
    minute = now - now % 60_000
    db = LedgerDb(":memory:")
    fill(db, [
        queued("a1", minute, "perTenant", "concurrency", "acme"),
        rec("a1", Outcome.admitted, minute + 1, execution_id="e1"),
        rec("a2", Outcome.admitted, minute + 2, execution_id="e2"),
        rec("a3", Outcome.existing, minute + 3, execution_id="e1"),
        rec("a4", Outcome.dropped, minute - 60_000),
        # About a run, not a request: counted only as what happened to the run.
        rec("run:e1:lease", Outcome.admitted, minute + 4),
        rec("run:e2:bulk-cancel:op", Outcome.cancelled, minute + 5, execution_id="e2"),
        rec("old", Outcome.admitted, minute - 2 * 3600_000),  # before the chart's hour
    ])
    pause = ControlRow(workflow="perTenant", paused=True, at_ms=now, reason="r", by="ana")
    view = compute({}, {("perTenant", "acme"): 2, ("perTenant", "bolt"): 1},
                   {"perTenant": pause}, now, declared=["perTenant", "stock"],
                   limits=concurrency_limits(APP))
    doc = overview(db, view, frozenset({"perTenant", "stock"}))

    per_tenant, stock = doc["workflows"]
    assert per_tenant["counts"] == {"admitted": 3, "existing": 1, "collapsed": 0,
                                    "dropped": 1, "rejected": 0, "expired": 0, "failed": 0,
                                    "cancelled": 1}
    assert (per_tenant["in_flight"], per_tenant["limit"]) == (3, None)
    assert per_tenant["fullest_key"] == {"key": "acme", "in_flight": 2, "limit": 2}
    assert per_tenant["paused"] and per_tenant["pause"]["reason"] == "r"
    assert per_tenant["per_minute"] == [
        {"minute_ms": minute - 60_000, "dropped": 1},
        {"minute_ms": minute, "admitted": 2, "existing": 1, "cancelled": 1}]
    # The chart's hour begins 59 minutes before the minute the overview was made in.
    assert doc["since_ms"] in (minute - 59 * 60_000, minute - 58 * 60_000)
    assert stock["counts"]["admitted"] == 0 and stock["per_minute"] == []


def test_the_overview_says_a_keys_limit_from_the_limits_table_and_lists_the_pools() -> None:
    from sluicegate.admission.limits import LimitChange
    from sluicegate.ops.services.flow import SlotLimit, compute
    from sluicegate.ops.services.overview import overview

    view = compute({}, {("perTenant", "acme"): 3, ("perTenant", "bolt"): 1}, {}, T0,
                   limits={"perTenant": SlotLimit(2, keyed=True, per_key="tiers")},
                   pools={"gpu": SlotLimit(3, keyed=False, budget="pool:gpu",
                                           members=("twoLimits",))},
                   pool_running={("gpu", ""): 2},
                   key_limits={("tiers", "acme"): LimitChange("tiers", "acme", 20)},
                   limits_topic="sg.limits")
    doc = overview(LedgerDb(":memory:"), view)
    (per_tenant,) = doc["workflows"]
    assert per_tenant["fullest_key"] == {"key": "bolt", "in_flight": 1, "limit": 2}
    view = compute({}, {("perTenant", "acme"): 20}, {}, T0,
                   limits={"perTenant": SlotLimit(2, keyed=True, per_key="tiers")},
                   key_limits={("tiers", "acme"): LimitChange("tiers", "acme", 20)})
    (per_tenant,) = overview(LedgerDb(":memory:"), view)["workflows"]
    assert per_tenant["fullest_key"] == {"key": "acme", "in_flight": 20, "limit": 20,
                                         "declared": 2}
    assert doc["limits_topic"] == "sg.limits"
    assert per_tenant["limits"] == [], "one limit: shown beside in flight"
    assert doc["pools"] == [{"pool": "gpu", "members": ["twoLimits"], "in_flight": 2,
                             "limit": 3, "override": None, "keys": []}]


# -- one time zone ----------------------------------------------------------------------

CONSOLE_JS = Path(sluicegate.ops.__file__).parent / "dashboard" / "console.js"


def test_the_console_shows_every_time_in_utc_never_in_local_time() -> None:
    script = CONSOLE_JS.read_text(encoding="utf-8")
    assert "toLocale" not in script and "getHours" not in script


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the console's code")
def test_the_console_gives_the_date_of_a_time_that_is_not_today() -> None:
    script = CONSOLE_JS.read_text(encoding="utf-8")
    utc = re.search(r"^function utc\(ms\) \{\n.*?^\}\n", script, re.S | re.M)
    assert utc is not None, "console.js formats times with utc(ms)"
    code = utc.group(0) + "console.log(utc(0)); console.log(utc(Date.now()));"
    done = subprocess.run(["node", "-e", code], capture_output=True, text=True, check=True,
                          timeout=30)
    long_ago, now = done.stdout.splitlines()
    assert long_ago == "1970-01-01 00:00:00 UTC"
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", now)


def test_the_demo_and_the_tail_print_utc() -> None:
    from rich.console import Console

    from sluicegate.ops.cli.output import print_decision

    console = Console(record=True, width=200)
    print_decision(console, LedgerRecord(request_id="r", workflow="w", outcome=Outcome.admitted,
                                 requested_at_ms=T0, decided_at_ms=T0 + 5 * S))
    assert console.export_text().startswith("00:00:05 admitted")
