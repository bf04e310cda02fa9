"""Per-key limits from the limits table on the real broker: a tenant's limit raised while
its starts wait admits them at once, lowered it cancels nothing and the key drains down
to it, every worker reads the table, the flow view shows a key's limit from it, and a bad
row is dead-lettered once (the limit held at every moment by the engine's clock:
admissions and completions)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from sluicegate.admission.limits import limits_key
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.ops.services import limits
from sluicegate.schemas.records import (
    AdmittedStart,
    DeadLetter,
    LedgerRecord,
    Outcome,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.integration import cli
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.integration.test_concurrency import StepEngine, produce_in_order

pytestmark = pytest.mark.broker

APP = "tests.apps.limits"


def _tenant(run: AdmittedStart) -> str:
    return str(json.loads(run.payload)["tenant"])


def in_flight_at_admissions(admitted: Iterable[AdmittedStart], events: Iterable[RunEvent],
                            tenant: str) -> list[tuple[int, int]]:
    """(when, runs of `tenant` in flight just before it) for each of its admissions, by
    the clock of the worker (admissions) and of the engine (completions); at equal
    milliseconds a completion counts first, as it comes before the admission it allows."""
    ours = {a.execution_id for a in admitted if _tenant(a) == tenant}
    moments = sorted([(e.at_ms, 0, -1) for e in events
                      if e.kind is RunEventKind.completed and e.execution_id in ours]
                     + [(a.admitted_at_ms, 1, 1) for a in admitted if a.execution_id in ours])
    out, now = [], 0
    for at, kind, step in moments:
        if kind == 1:
            out.append((at, now))
        now += step
    return out


def test_a_tenants_limit_from_the_table_changes_while_its_starts_wait(
        settings: Settings, tmp_path: Path) -> None:
    app = load_app(APP)
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    letters = TopicReader(settings, topics.deadletter, DeadLetter)
    engine = StepEngine(settings)
    running: list[AdmittedStart] = []

    def take(n: int) -> None:
        running.extend(engine.next_admitted() for _ in range(n))

    def queued_reason(request_id: str) -> str | None:
        ledger.poll()
        return next((r.reason for r in ledger.records if r.request_id == request_id
                     and r.outcome is Outcome.queued), None)

    try:
        with WorkerThread(app, settings):
            produce_in_order(settings, [("tiered", {"tenant": "acme", "n": i})
                                        for i in range(8)]
                             + [("tiered", {"tenant": "free", "n": 100 + i}) for i in range(3)])
            take(4)  # two of each: the default of 2
            ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= 7,
                         timeout=20, what="the other seven queued")
            engine.nothing_admitted(1.0)
            assert sorted(_tenant(r) for r in running) == ["acme"] * 2 + ["free"] * 2

            # Raised: three more of acme's go at once, no run having ended.
            limits.set_limit(settings, "tiers", "acme", 5, reason="enterprise", by="billing")
            take(3)
            assert [_tenant(r) for r in running[4:]] == ["acme"] * 3
            engine.nothing_admitted(1.0)
            # The flow view shows the key's limit from the table, and the declared one.
            flow = cli.on(settings, "workflows", "flow", "--workflow", "tiered", "--app", APP,
                          "--db", str(tmp_path / "ledger.duckdb"))
            assert flow.code == 0, flow.stderr
            lines = {line.split()[0]: line for line in flow.stdout.splitlines()}
            assert lines["key=acme"].endswith(
                f"in_flight=5/5 (from {topics.limits}; declared 2)"), flow.stdout
            assert lines["key=free"].endswith("in_flight=2/2"), flow.stdout

            # Lowered: no run is cancelled. It applies once a fresh start is judged by it.
            limits.set_limit(settings, "tiers", "acme", 1, reason="unpaid", by="billing")
            deadline = time.monotonic() + 20
            probes: list[str] = []
            while True:
                assert time.monotonic() < deadline, "the lowered limit never applied"
                probes += produce_in_order(settings, [("tiered", {"tenant": "acme",
                                                                   "n": 200 + len(probes)})])
                reason = None
                while reason is None and time.monotonic() < deadline:
                    reason = queued_reason(probes[-1])
                if reason is not None and "5 of 1 slots" in reason:
                    break
            # acme drains down to 1: its five runs end one by one, and only then do its
            # waiting starts go, one at a time.
            acme = [r for r in running if _tenant(r) == "acme"]
            for run in acme:
                engine.report(run, RunEventKind.completed)
            waiting = 3 + len(probes)
            for _ in range(waiting):
                run = engine.next_admitted()
                assert _tenant(run) == "acme"
                engine.report(run, RunEventKind.completed)
            for run in [r for r in running if _tenant(r) == "free"]:
                engine.report(run, RunEventKind.completed)
            last = engine.next_admitted()
            assert _tenant(last) == "free"
            engine.report(last, RunEventKind.completed)

            # A bad row: dead-lettered once, with its reason; acme keeps its limit of 1.
            producer = Producer(settings.client_config())
            producer.produce(topics.limits, b"\x00not a limit", limits_key("tiers", "acme"))
            assert producer.flush(10) == 0
            letters.until(lambda rows: len(rows) >= 1, timeout=20, what="the dead letter")
            assert [row.limit for row in limits.limit_rows(settings, "tiers")] == [1]
            events.until(lambda rows: sum(e.kind is RunEventKind.completed for e in rows)
                         >= 11 + len(probes), timeout=20, what="every run ended")
        admitted.settle(0.5)
        letters.settle(0.5)
    finally:
        engine.close()
    assert [(d.source_topic, d.key) for d in letters.records] == [
        (topics.limits, b"tiers:acme")]
    assert "is not a KeyLimit" in letters.records[0].reason
    # The limit in force held at every moment: 2 until the raise, 5 until the lowering,
    # then nothing admitted until acme was down to none in flight, one at a time after.
    acme = in_flight_at_admissions(admitted.records, events.records, "acme")
    assert [before for _, before in acme] == [0, 1, 2, 3, 4] + [0] * (3 + len(probes))
    free = in_flight_at_admissions(admitted.records, events.records, "free")
    assert len(free) == 3 and max(before for _, before in free) < 2, free


def in_flight_at_admissions_of(admitted: Iterable[AdmittedStart], events: Iterable[RunEvent],
                               workflow: str) -> list[tuple[str, int]]:
    """(tenant, runs of `workflow` in flight just before it) for each of its admissions."""
    ours = {a.execution_id: _tenant(a) for a in admitted if a.workflow == workflow}
    moments = sorted([(e.at_ms, 0, "") for e in events
                      if e.kind is RunEventKind.completed and e.execution_id in ours]
                     + [(a.admitted_at_ms, 1, _tenant(a)) for a in admitted
                        if a.execution_id in ours])
    out, now = [], 0
    for _, kind, tenant in moments:
        if kind == 1:
            out.append((tenant, now))
            now += 1
        else:
            now -= 1
    return out


def test_a_small_tenant_gets_its_floor_of_a_pool_behind_a_large_tenants_backlog(
        settings: Settings) -> None:
    app = load_app(APP)
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    events = TopicReader(settings, topics.run_events, RunEvent)
    engine = StepEngine(settings)
    try:
        with WorkerThread(app, settings):
            produce_in_order(settings, [("floored", {"tenant": "big", "n": i})
                                        for i in range(30)])
            running = [engine.next_admitted() for _ in range(6)]
            assert {_tenant(r) for r in running} == {"big"}, "alone, big uses every slot"
            ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= 24,
                         timeout=20, what="big's other 24 queued")
            produce_in_order(settings, [("floored", {"tenant": "small", "n": 100 + i})
                                        for i in range(4)])
            ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= 28,
                         timeout=20, what="small's 4 queued")
            engine.nothing_admitted(1.0)
            # Each slot that frees: small's first two (its floor), then big's weighted
            # turns; without the floor big's weight of 50 would take them all.
            served = []
            for _ in range(5):
                engine.report(running.pop(0), RunEventKind.completed)
                run = engine.next_admitted()
                running.append(run)
                served.append(_tenant(run))
            assert served == ["small", "small", "big", "big", "big"]
            # small's runs end: back under its floor, the next slot is small's again.
            for run in [r for r in running if _tenant(r) == "small"]:
                engine.report(run, RunEventKind.completed)
                running.remove(run)
                nxt = engine.next_admitted()
                running.append(nxt)
                served.append(_tenant(nxt))
            assert served[5:] == ["small", "small"]
            for run in running:
                engine.report(run, RunEventKind.completed)
            events.until(lambda rows: sum(e.kind is RunEventKind.completed for e in rows)
                         >= 13, timeout=20, what="the runs ended")
        admitted.settle(0.5)
    finally:
        engine.close()
    # By the engine's clock: the pool never ran more than 6, and small reached its floor
    # of 2 while big's backlog waited.
    flight = in_flight_at_admissions_of(admitted.records, events.records, "floored")
    assert max(before for _, before in flight) < 6, flight
    tenants = [tenant for tenant, _ in flight]
    assert tenants[:6] == ["big"] * 6
    assert tenants[6:8] == ["small", "small"]


def test_limits_set_list_and_unset_from_the_command_line(settings: Settings) -> None:
    create_topics(settings)
    ran = cli.on(settings, "limits", "set", "tiers", "acme", "20", "--reason",
                 "enterprise", "--by", "billing", "--app", APP)
    assert ran.code == 0, ran.stderr
    assert ran.stdout.strip() == "set tiers:acme to 20: enterprise"
    assert cli.on(settings, "limits", "set", "tiers", "org:7", "3").code == 0
    listed = cli.on(settings, "limits", "list", "tiers")
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[:2] for line in lines] == [["tiers:acme", "20"], ["tiers:org:7", "3"]]
    assert lines[0].endswith("by billing: enterprise")
    as_json = [json.loads(line) for line in
               cli.on(settings, "limits", "list", "--json").stdout.splitlines()]
    assert [(r["name"], r["key"], r["limit"]) for r in as_json] == [
        ("tiers", "acme", 20), ("tiers", "org:7", 3)]
    gone = cli.on(settings, "limits", "unset", "tiers", "acme")
    assert gone.code == 0 and "was 20" in gone.stdout
    again = cli.on(settings, "limits", "unset", "tiers", "acme")
    assert again.code == 0 and "has no row" in again.stdout
    assert [r.key for r in limits.limit_rows(settings)] == ["org:7"]
    # Refused, exit 2, nothing written: a misspelt name, a limit out of range.
    typo = cli.on(settings, "limits", "set", "teirs", "acme", "5", "--app", APP)
    assert typo.code == 2
    assert "no per_key 'teirs' declared in tests.apps.limits; did you mean 'tiers'?" in \
        typo.stderr
    zero = cli.on(settings, "limits", "set", "tiers", "acme", "0")
    assert zero.code == 2 and "limit 0 is not from 1 to 100,000" in zero.stderr
    assert [r.key for r in limits.limit_rows(settings)] == ["org:7"]
