"""An operator's override of a concurrency limit, end to end on the real broker: raised,
lowered and cleared from the command line under traffic, the limit held at every moment
by the engine's clock, a ledger row per change, and the flow view showing it; the
console's preview and apply, with its token, of a concurrency limit, a throttle and a
rateLimit, and the gauges on /metrics."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sluicegate.client import Client, Engine
from sluicegate.config import Settings
from sluicegate.ops.cli.root import app as cli
from sluicegate.ops.inspect import open_server
from sluicegate.ops.services.formatting import clock
from sluicegate.schemas.records import (
    AdmittedStart,
    EngineCommand,
    LedgerRecord,
    Outcome,
    OverrideRow,
    RunEvent,
    RunEventKind,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.overrides import app
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker
runner = CliRunner()
APP = "tests.apps.overrides"
# How long a worker may take to apply a control row (a pause's measure: well under 2 s).
APPLIES_MS = 2_000


def _cli(settings: Settings, *args: str) -> str:
    result = runner.invoke(cli, ["workflows", *args, "--bootstrap", settings.bootstrap,
                                 "--namespace", settings.namespace])
    assert result.exit_code == 0, result.output
    return result.output


class BusyEngine:
    """An engine in a thread: reports each admitted run started, holds it 0.3-0.6 s by
    its own clock, then reports it completed. `started` counts the runs begun so far."""

    def __init__(self, settings: Settings) -> None:
        self.engine = Engine(settings=settings, group=f"engine-{uuid.uuid4().hex[:6]}")
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        due: list[tuple[float, str, str]] = []
        rng = random.Random(35)
        try:
            while not self._stop.is_set():
                delivery = self.engine.poll(0.01)
                if delivery is not None and delivery.admitted is not None:
                    run = delivery.admitted
                    self.engine.started(delivery)
                    self.started += 1
                    due.append((time.monotonic() + rng.uniform(0.3, 0.6), run.execution_id,
                                run.workflow))
                now = time.monotonic()
                for item in [d for d in due if d[0] <= now]:
                    due.remove(item)
                    self.engine.completed(item[1], item[2])
        except BaseException as exc:  # surfaced by __exit__
            self.error = exc

    def until_started(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.started < n:
            assert time.monotonic() < deadline, f"{self.started} runs started, not {n}"
            time.sleep(0.02)

    def __enter__(self) -> BusyEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.engine.close()
        if self.error is not None:
            raise self.error


def in_flight_at_each_start(events: list[RunEvent]) -> Iterator[tuple[int, int]]:
    """(the engine's time of each start, the runs in flight once it began), from the
    engine's own reports: a run is in flight from its start to its completion. A run ends
    before the admission its slot allows, so at equal milliseconds completions count first."""
    steps = sorted((e.at_ms, 0 if e.kind is RunEventKind.completed else 1)
                   for e in events if e.kind in (RunEventKind.started, RunEventKind.completed))
    now = 0
    for at_ms, starts in steps:
        now += 1 if starts else -1
        if starts:
            yield at_ms, now


def test_an_override_raised_lowered_and_cleared_under_traffic_holds_at_every_moment(
        settings: Settings, tmp_path: Path) -> None:
    create_topics(settings)
    topics = Topics(settings)
    control = TopicReader(settings, topics.control, OverrideRow)
    events = TopicReader(settings, topics.run_events, RunEvent)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    commands = TopicReader(settings, topics.commands, EngineCommand)
    limit = ["limit", "partnerCall", "--app", APP, "--by", "ops"]
    with WorkerThread(app, settings), BusyEngine(settings) as engine:
        with Client(app=app, settings=settings, replies=False) as client:
            for n in range(60):
                client.submit("partnerCall", {"n": n})
        engine.until_started(6)
        assert _cli(settings, *limit, "--concurrency", "8", "--reason",
                    "partner is fast today") == (
            "concurrency limit of partnerCall: 4 -> 8 (declared 4)\n")
        engine.until_started(26)
        _cli(settings, *limit, "--concurrency", "2", "--reason", "partner 503s")
        lowered = control.until(lambda rows: len(rows) >= 2, what="the lowering row")[1]
        # The flow view while it drains: the limit in force, and whose and why.
        flow = _cli(settings, "flow", "--workflow", "partnerCall", "--app", APP, "--db",
                    str(tmp_path / "ledger.duckdb"))
        note = (f'/2 (override since {clock(lowered.at_ms, time.time_ns() // 1_000_000)} '
                f'by ops: "partner 503s"; declared 4)')
        assert note in flow.splitlines()[0], flow
        at_lowering = engine.started
        engine.until_started(at_lowering + 8)
        assert "cleared the override of the concurrency limit of partnerCall: 2 -> 4" in _cli(
            settings, *limit, "--clear", "--reason", "partner recovered")
        engine.until_started(60)
        events.until(lambda rows: sum(e.kind is RunEventKind.completed for e in rows) >= 60,
                     timeout=30, what="60 runs completed")
    raised, lowered, cleared = control.until(lambda rows: len(rows) >= 3, what="3 rows")
    assert set(control.keys) == {b"override:concurrency:partnerCall"}
    assert [(r.limit, r.declared, r.by) for r in (raised, lowered, cleared)] == [
        (8, 4, "ops"), (2, 4, "ops"), (None, 4, "ops")]

    def limit_at(t: int) -> int:
        return 4 if t < raised.at_ms else 8 if t < lowered.at_ms else 2 if t < cleared.at_ms else 4

    def in_force(at_ms: int) -> int:
        """The limit a start at `at_ms` may have been admitted under: while a worker may
        not have applied a lowering yet, the highest in force over the moments before."""
        changes = [r.at_ms for r in (raised, lowered, cleared)
                   if at_ms - APPLIES_MS < r.at_ms <= at_ms]
        return max(limit_at(t) for t in (at_ms, at_ms - APPLIES_MS,
                                          *(c - 1 for c in changes)))

    starts = list(in_flight_at_each_start(events.records))
    assert len(starts) == 60
    over = [(at, n, in_force(at)) for at, n in starts if n > in_force(at)]
    assert over == [], (f"a start found more runs in flight than the limit in force: "
                        f"{raised.at_ms=} {lowered.at_ms=} {cleared.at_ms=} {starts=}")
    # Raising admits waiting starts at once; clearing a lowered one too.
    assert max(n for at, n in starts if raised.at_ms <= at < raised.at_ms + APPLIES_MS) == 8
    assert max(n for at, n in starts if cleared.at_ms <= at < cleared.at_ms + APPLIES_MS) == 4
    # Lowering cancelled nothing: every run completed, no command was sent to the engine.
    assert commands.settle(0.5) == []
    rows = sorted((r for r in ledger.until(
        lambda rows: sum(r.outcome is Outcome.overridden for r in rows) >= 3,
        what="3 override rows") if r.outcome is Outcome.overridden),
        key=lambda r: r.decided_at_ms)
    assert [(r.workflow, r.control, r.reason) for r in rows] == [
        ("partnerCall", "override", "override of the concurrency limit of partnerCall: "
         "4 -> 8 (declared 4) by ops: partner is fast today"),
        ("partnerCall", "override", "override of the concurrency limit of partnerCall: "
         "8 -> 2 (declared 4) by ops: partner 503s"),
        ("partnerCall", "override", "override of the concurrency limit of partnerCall: "
         "2 -> 4 (cleared, the declared limit again) by ops: partner recovered")]


def _post(url: str, body: dict[str, object], token: str | None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", "Origin": url.split("/inspect")[0]}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_console_previews_then_applies_an_override_of_any_limit_with_its_token(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    token = "override-token"
    with WorkerThread(app, settings), open_server(settings, port=0, app=app,
                                                  token=token) as server:
        with Client(app=app, settings=settings, replies=False) as client:
            for n in range(10):
                client.submit("partnerCall", {"n": n})
        # No engine ends a run: four hold the slots, six wait.
        ledger.until(lambda rows: sum(r.outcome is Outcome.queued for r in rows) >= 6,
                     what="six queued")
        admitted.until(lambda rows: len(rows) >= 4, what="four admitted")
        limits = server.url + "/inspect/limits/"
        raise_to_7 = {"workflow": "partnerCall", "concurrency": 7, "reason": "more capacity"}
        status, doc = _post(limits + "preview", raise_to_7, token)
        assert (status, doc) == (200, {
            "control": "concurrency", "limit": "concurrency limit of partnerCall",
            "budget": "partnerCall", "declared": 4, "declared_text": "4", "before": 4,
            "after": 7, "old": "4", "new": "7", "waiting": 6, "admitted_now": 3,
            "draining": 0, "note": None})
        assert _post(limits + "apply", raise_to_7, None)[0] == 401
        status, doc = _post(limits + "apply", {**raise_to_7, "reason": ""}, token)
        assert status == 400 and "needs a reason" in doc["error"]
        status, doc = _post(limits + "apply", {"pool": "nope", "concurrency": 3,
                                               "reason": "x"}, token)
        assert status == 400 and "no workflow declares a concurrency limit in pool" in (
            doc["error"])
        status, doc = _post(limits + "apply", raise_to_7, token)
        assert (status, doc["after"], doc["written"]) == (200, 7, True)
        admitted.until(lambda rows: len(rows) >= 7, timeout=10, what="three more admitted")
        status, doc = _post(limits + "preview", {"workflow": "partnerCall",
                                                 "concurrency": 2}, token)
        assert (doc["before"], doc["admitted_now"], doc["draining"]) == (7, 0, 5)
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
        assert ('sluicegate_limit_override{budget="partnerCall",control="concurrency"} 7.0'
                in metrics)
        assert 'sluicegate_concurrency_limit{workflow="partnerCall"} 7.0' in metrics
        assert len(admitted.settle(0.5)) == 7

        # A throttle, as the command line's --throttle: one each 10 s declared, three wait.
        with Client(app=app, settings=settings, replies=False) as client:
            for n in range(4):
                client.submit("slowSync", {"n": n})
        ledger.until(lambda rows: sum(r.outcome is Outcome.queued
                                      and r.workflow == "slowSync" for r in rows) >= 3,
                     what="three slow starts queued")
        faster = {"control": "throttle", "workflow": "slowSync", "rate": "10/10s",
                  "reason": "partner raised our quota"}
        status, doc = _post(limits + "preview", faster, token)
        assert (status, doc["old"], doc["new"], doc["admitted_now"]) == (
            200, "1 per 10s", "10 per 10s", 0), doc
        assert doc["waiting"] >= 2, doc  # the next goes 10 s after the first
        assert doc["note"] == ("each key's turn already due stands; the turns after it come "
                               "one each 1s instead of one each 10s")
        status, doc = _post(limits + "apply", {**faster, "rate": "ten/10s"}, token)
        assert status == 400 and "a rate is LIMIT/PERIOD" in doc["error"]
        status, doc = _post(limits + "apply", faster, token)
        assert (status, doc["done"]) == (200, "throttle of slowSync: 1 per 10s -> 10 per 10s "
                                              "(declared 1 per 10s)"), doc
        slow = admitted.until(lambda rows: sum(a.workflow == "slowSync" for a in rows) >= 4,
                              timeout=30, what="the slow starts admitted")
        times = sorted(a.admitted_at_ms for a in slow if a.workflow == "slowSync")
        # The turn already due (10 s after the first) stands; the two after it a second
        # apart, not 10 s (declared, the last would go 30 s after the first; the change
        # may come after the second turn on a slow machine, so 25 s at most).
        assert times[1] - times[0] >= 9_999 and times[3] - times[0] < 25_000, times
        # A rateLimit, as --rate-limit, and its clearing.
        storm = {"control": "rateLimit", "workflow": "alert", "rate": "5/1m",
                 "reason": "alert storm is real"}
        status, doc = _post(limits + "preview", storm, token)
        assert (doc["old"], doc["new"], doc["admitted_now"]) == ("2 per 1m", "5 per 1m", 0)
        status, doc = _post(limits + "apply", storm, token)
        assert doc["done"] == "rateLimit of alert: 2 per 1m -> 5 per 1m (declared 2 per 1m)"
        status, doc = _post(limits + "apply", {"control": "rateLimit", "workflow": "alert",
                                               "clear": True, "reason": "over"}, token)
        assert doc["done"] == ("cleared the override of the rateLimit of alert: 5 per 1m -> "
                               "2 per 1m (the declared limit)")
    reasons = [r.reason for r in ledger.until(
        lambda rows: sum(r.outcome is Outcome.overridden for r in rows) >= 4,
        what="four override rows") if r.outcome is Outcome.overridden]
    assert reasons[1:] == [
        "override of the throttle of slowSync: 1 per 10s -> 10 per 10s (declared 1 per 10s) "
        "by dashboard: partner raised our quota",
        "override of the rateLimit of alert: 2 per 1m -> 5 per 1m (declared 2 per 1m) by "
        "dashboard: alert storm is real",
        "override of the rateLimit of alert: 5 per 1m -> 2 per 1m (cleared, the declared "
        "limit again) by dashboard: over"]


def test_a_throttle_and_a_rate_limit_overridden_from_the_command_line_judge_what_follows(
        settings: Settings) -> None:
    create_topics(settings)
    topics = Topics(settings)
    admitted = TopicReader(settings, topics.admitted, AdmittedStart)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    with WorkerThread(app, settings), Client(app=app, settings=settings,
                                             replies=False) as client:
        # The rateLimit: two a minute, the third dropped; five a minute once overridden.
        for n in range(3):
            client.submit("alert", {"n": n})
        ledger.until(lambda rows: sum(r.outcome is Outcome.dropped for r in rows) == 1,
                     what="the third alert dropped")
        assert _cli(settings, "limit", "alert", "--rate-limit", "5/1m", "--reason",
                    "alert storm is real", "--app", APP) == (
            "rateLimit of alert: 2 per 1m -> 5 per 1m (declared 2 per 1m)\n")
        # The command returning means the row is on the broker; the worker applies it on
        # its next loop. A probe each half second until one is admitted.
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline, "no probe admitted within 10 s"
            probe = client.submit("alert", {"n": 99}).request_id
            client.flush()
            decided = ledger.until(lambda rows, probe=probe: any(
                r.request_id == probe and r.outcome in (Outcome.admitted, Outcome.dropped)
                for r in rows), what="a decision on the probe")
            if any(r.request_id == probe and r.outcome is Outcome.admitted for r in decided):
                break
            time.sleep(0.5)
        assert sum(a.workflow == "alert" for a in admitted.until(
            lambda rows: sum(a.workflow == "alert" for a in rows) >= 3,
            what="a third alert admitted")) == 3
        # The throttle: one each 2 s declared; ten each 2 s once overridden.
        for n in range(6):
            client.submit("pacedSync", {"n": n})
        client.flush()
        admitted.until(lambda rows: any(a.workflow == "pacedSync" for a in rows),
                       what="the first paced start")
        _cli(settings, "limit", "pacedSync", "--throttle", "10/2s", "--reason",
             "partner raised our quota", "--app", APP)
        paced = [a for a in admitted.until(
            lambda rows: sum(a.workflow == "pacedSync" for a in rows) >= 6, timeout=20,
            what="six paced starts") if a.workflow == "pacedSync"]
    times = sorted(a.admitted_at_ms for a in paced)
    # The turn already due stands (2 s after the first); after it, one each 200 ms (never
    # sooner than its turn), not one each 2 s.
    assert times[1] - times[0] >= 1_999, times
    assert all(times[k] - times[1] >= (k - 1) * 200 - 1 for k in range(2, 6)), times
    assert times[-1] - times[1] < 2_000, times
