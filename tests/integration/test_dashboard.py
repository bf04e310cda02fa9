"""The console in a real headless Chromium, driven over the DevTools protocol, on the real
broker with a worker: the overview's counts beside the limit, a pause (with the token the
page carries) and a forged one from another site (refused), an error that outlives the
refreshes, why each start waits, a bulk preview listing its runs then applied, a run
looked up, dead letters, the live tail, and the page with Kafka unreachable (each page is
saved to docs/console/ as the screenshot docs/operations.md shows); and the override form
for a throttle, a pool's line, and a key's own limit from the limits table."""

from __future__ import annotations

import base64
import functools
import http.server
import itertools
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.ops.inspect import ModuleBulkOps, open_server
from sluicegate.ops.services import bulk, limits
from sluicegate.schemas import codec
from sluicegate.schemas.records import (
    LedgerRecord,
    Origin,
    Outcome,
    OverrideRow,
    RunEvent,
    RunEventKind,
    RunRow,
    RunStatus,
    StartRequest,
)
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.concurrency import embed, per_tenant
from tests.apps.defer import tour
from tests.apps.limits import tiered
from tests.apps.overrides import slow_sync
from tests.integration.kafka_helpers import TopicReader, WorkerThread

pytestmark = pytest.mark.broker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
websocket = pytest.importorskip("websocket", reason="websocket-client is in the dev extra")
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
APP = App([tour, per_tenant])
EVIL = "evil.example"


class Page:
    """One Chromium tab over the DevTools protocol: evaluate JavaScript, wait for it."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> Any:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply["result"]

    def js(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def until(self, expression: str, what: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def text(self, selector: str) -> str:
        return str(self.js(f"(document.querySelector({json.dumps(selector)}) || "
                           "{textContent: ''}).textContent"))

    def texts(self, selector: str) -> list[str]:
        return list(self.js(f"[...document.querySelectorAll({json.dumps(selector)})]"
                            ".map(e => e.textContent)"))

    def screenshot(self, name: str) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=1280, height=760,
                  deviceScaleFactor=1, mobile=False)
        shot = self.send("Page.captureScreenshot", format="png")
        SHOTS.mkdir(parents=True, exist_ok=True)
        (SHOTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[int]:
    """A headless Chromium with a DevTools port (evil.example resolves to 127.0.0.1, for
    a page of another site); yields the port."""
    if CHROMIUM is None:
        pytest.skip("no chromium binary (Debian's `chromium` package; CI installs it)")
    port = _free_port()
    proc = subprocess.Popen([
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
        f"--user-data-dir={tmp_path / 'chromium'}",
        f"--remote-debugging-port={port}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _open_tab(devtools_port: int, url: str) -> Page:
    deadline = time.monotonic() + 30
    while True:
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{devtools_port}/json/new?{url}", method="PUT")
            with urllib.request.urlopen(request, timeout=5) as response:
                return Page(json.loads(response.read())["webSocketDebuggerUrl"])
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture
def evil_site(tmp_path: Path) -> Iterator[str]:
    """A page of another site: http://evil.example:<port>/ (an empty page)."""
    root = tmp_path / "evil"
    root.mkdir()
    (root / "index.html").write_text("<!doctype html><title>evil</title><p>hello</p>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{EVIL}:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _count(rows: list[LedgerRecord], outcome: Outcome, workflow: str) -> int:
    return sum(1 for r in rows if r.outcome is outcome and r.workflow == workflow)


def _go(page: Page, tab: str) -> None:
    page.js(f"location.hash = {json.dumps(tab)}")


def test_the_console_shows_why_starts_wait_pauses_with_its_token_and_refuses_a_forgery(
        settings: Settings, chromium: int, evil_site: str) -> None:
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    runs = TopicReader(settings, topics.runs, RunRow)
    with WorkerThread(APP, settings), Client(app=APP, settings=settings,
                                             replies=False) as client:
        for edit in range(2):  # two edits of one row: one collapses, one waits
            client.submit("tourNarration", {"rowId": "r1", "editedAt": edit})
            client.flush()
            ledger.until(lambda rows, n=edit + 1: _count(rows, Outcome.queued,
                                                          "tourNarration") >= n,
                         what="the edit queued")
        for n in range(7):  # seven jobs of one tenant against a limit of five
            client.submit("perTenant", {"tenant": "acme", "n": n})
        client.flush()
        # A start of a workflow nobody declared: rejected, and kept as a dead letter.
        producer = Producer(settings.client_config(partitioner="murmur2_random"))
        stray = StartRequest(request_id=uuid.uuid4().hex, workflow="nosuchFlow",
                             payload=b"{}", origin=Origin.event,
                             requested_at_ms=int(time.time() * 1000))
        producer.produce(topics.starts, codec.encode(stray), stray.request_id.encode())
        assert producer.flush(30) == 0
        ledger.until(lambda rows: _count(rows, Outcome.admitted, "perTenant") == 5
                     and _count(rows, Outcome.queued, "perTenant") == 2
                     and _count(rows, Outcome.collapsed, "tourNarration") == 1
                     and _count(rows, Outcome.rejected, "nosuchFlow") == 1,
                     what="five admitted, two queued, one collapsed, one rejected")
        runs.until(lambda rows: len({r.execution_id for r in rows}) >= 5, what="five runs")

        with open_server(settings, port=0, app=APP, bulk=ModuleBulkOps(settings)) as server:
            page = _open_tab(chromium, server.url + "/#overview")
            try:
                _check_overview_and_pause(page, server.flow)
                _check_forgery_refused(chromium, evil_site, server.url, server.flow)
                _check_waiting(page)
                cancelled = _check_bulk(page, settings)
                ledger.until(lambda rows: any(r.execution_id == cancelled and
                                              r.outcome is Outcome.cancelled for r in rows),
                             what="the bulk cancel's ledger row")
                # The engine stops the run and says so.
                producer.produce(topics.run_events, codec.encode(RunEvent(
                    execution_id=cancelled, workflow="perTenant", kind=RunEventKind.cancelled,
                    at_ms=int(time.time() * 1000), reason="bad deploy")), cancelled.encode())
                assert producer.flush(30) == 0
                runs.until(lambda rows: any(r.execution_id == cancelled and
                                            r.status is RunStatus.cancelled for r in rows),
                           what="the first run cancelled")
                _check_run_lookup(page, cancelled)
                _check_bulk_skips_with_why(page, cancelled)
                _check_dead_letters_and_tail(page)
            finally:
                page.close()
    ledger.close()
    runs.close()


def _check_overview_and_pause(page: Page, flow: Any) -> None:
    row = "#overview-table tr[data-workflow=perTenant]"
    page.until(f"(document.querySelector('{row} td.inflight') || {{}}).textContent "
               "=== '5 (acme: 5/5)'", "perTenant's five in flight beside the limit")
    assert page.text(f"{row} td.count-admitted") == "5"
    assert page.text(f"{row} td.queued") == "2"
    assert page.text("#overview-table tr[data-workflow=tourNarration] td.count-collapsed") == "1"
    assert page.text(f"{row} td.state") == "running"
    assert page.text("#overview-table tr[data-workflow=nosuchFlow] td.state") == "not declared"
    assert page.text("#overview-table tr[data-workflow=nosuchFlow] td.count-rejected") == "1"
    assert page.js(f"document.querySelectorAll('{row} svg.chart rect').length") > 0
    # The queue over the last hour: its minute now has the two waiting starts.
    queue = page.js(f"document.querySelector('{row} svg.queue title').textContent")
    assert queue.splitlines()[-1].startswith("this minute: 2 queued, the oldest waiting ")
    assert page.js(f"document.querySelectorAll('{row} svg.queue rect.queued').length") > 0
    page.screenshot("overview")

    # A pause without a reason is refused, and the refusal outlives two refreshes.
    page.js(f"document.querySelector('{row} button.pause').click()")
    page.until("document.querySelector('#messages li') !== null", "the refusal")
    refused = page.text("#messages li")
    assert "Pause of perTenant refused: a pause needs a reason" in refused
    done = page.js("window.refreshes")
    page.until(f"window.refreshes >= {done + 2}", "two more refreshes", timeout=20)
    assert page.text("#messages li") == refused

    # With a reason, the page's own token makes it.
    tour_row = "#overview-table tr[data-workflow=tourNarration]"
    page.js("document.getElementById('pause-reason').value = 'deploying a fix';"
            f"document.querySelector('{tour_row} button.pause').click()")
    page.until(f"(document.querySelector('{tour_row} td.state') || {{}}).textContent "
               "=== 'PAUSED: deploying a fix'", "tourNarration shown paused")
    assert page.js("document.querySelector('#messages li')") is None  # the pause succeeded
    tour_flow = flow("tourNarration").get("tourNarration")
    assert tour_flow.paused and tour_flow.pause.reason == "deploying a fix"
    assert tour_flow.pause.by == "dashboard"


def _check_forgery_refused(devtools: int, evil_site: str, victim: str, flow: Any) -> None:
    evil = _open_tab(devtools, evil_site)
    try:
        evil.until("document.readyState === 'complete' && location.host.startsWith('evil')",
                   "the other site's page")
        # The classic forgery: a simple POST, which a browser sends without a preflight.
        sent = evil.js(f"fetch({json.dumps(victim + '/inspect/workflows/perTenant/pause')}, "
                       "{method: 'POST', mode: 'no-cors', headers: {'Content-Type': "
                       "'text/plain'}, body: '{\"reason\": \"evil\"}'})"
                       ".then(() => 'answered', e => 'not sent: ' + e)")
        assert sent == "answered"  # the server answered it (an opaque answer to the page)
    finally:
        evil.close()
    per_tenant_flow = flow("perTenant").get("perTenant")
    assert per_tenant_flow is not None and not per_tenant_flow.paused


def _check_waiting(page: Page) -> None:
    _go(page, "#waiting")
    page.until("document.querySelectorAll('#waiting-table tbody tr').length === 3",
               "three waiting starts")
    whys = page.texts("#waiting-table td.why")
    # Each behind the limit is told when it should go, or that its line has not moved yet.
    for n, why in enumerate(whys[:2], 1):
        assert why.startswith(f"concurrency on key 'acme': position {n} of 2 behind a limit "
                              "of 5; "), why
        assert " ahead, " in why or why.endswith(
            "no estimate yet: no start has left this line in the last 10 min"), why
    assert whys[2].startswith("debounce on key 'tour:r1' until ")
    assert whys[2].endswith("; then the pause (the workflow is paused)")
    page.screenshot("waiting")


def _check_bulk(page: Page, settings: Settings) -> str:
    _go(page, "#bulk")
    page.until("!document.getElementById('tab-bulk').hidden", "the bulk tab")
    assert page.js("document.getElementById('bulk-apply')") is None
    # A cancel without a reason is refused: still no apply button.
    page.js("document.getElementById('bulk-limit').value = '3';"
            "document.getElementById('bulk-workflow').value = 'perTenant';"
            "document.getElementById('bulk-preview').click()")
    page.until("document.getElementById('bulk-error').textContent", "the refusal")
    assert "reason is required" in page.text("#bulk-error")
    assert page.js("document.getElementById('bulk-apply') === null") is True

    page.js("document.getElementById('bulk-reason').value = 'bad deploy';"
            "document.getElementById('bulk-preview').click()")
    page.until("document.getElementById('bulk-apply') !== null", "the apply button")
    assert page.text("#bulk-matched") == "3 runs matched (truncated: more match than the limit)."
    expected = [r.execution_id for r in bulk.preview_cancel(settings, "perTenant", 3).succeeded]
    listed = page.texts("#bulk-runs tbody tr td:first-child")
    assert listed == expected
    assert page.texts("#bulk-runs tbody tr td:nth-child(3)") == ["admitted"] * 3
    assert page.text("#bulk-apply") == "Apply cancel to 3 runs"
    page.screenshot("bulk")

    page.js("document.getElementById('bulk-apply').click()")
    page.until("document.querySelectorAll('#bulk-result li').length === 3", "the results")
    results = page.texts("#bulk-result li")
    assert [r.split(":")[0] for r in results] == expected
    assert all(": succeeded (cancel sent as " in r for r in results)
    assert page.js("document.getElementById('bulk-apply') === null") is True
    return expected[0]


def _check_run_lookup(page: Page, execution_id: str) -> None:
    _go(page, "#runs")
    page.until("!document.getElementById('tab-runs').hidden", "the runs tab")
    page.js(f"document.getElementById('run-id').value = {json.dumps(execution_id[:8])};"
            "document.getElementById('run-lookup').click()")
    page.until("document.querySelectorAll('#run-history tr.history').length >= 2",
               "the run's history")
    assert page.text("#run-result p.matched") == (
        f"{execution_id[:8]}: matched as execution id prefix")
    assert page.text(".run-row tr[data-field=status] td:last-child") == "cancelled"
    outcomes = page.texts("#run-history tr.history td.outcome")
    assert outcomes[0] == "admitted" and "cancelled" in outcomes
    page.screenshot("run")


def _check_bulk_skips_with_why(page: Page, cancelled: str) -> None:
    # The form still holds the cancel of perTenant: the run cancelled since is skipped.
    _go(page, "#bulk")
    page.until("!document.getElementById('tab-bulk').hidden", "the bulk tab")
    page.js("document.getElementById('bulk-preview').click()")
    page.until("document.querySelectorAll('#bulk-skipped tbody tr').length >= 1",
               "the skipped run")
    (skipped,) = page.js("[...document.querySelectorAll('#bulk-skipped tbody tr')]"
                         ".map(tr => [...tr.children].map(td => td.textContent))")
    assert skipped == [cancelled, "perTenant", "cancelled", "the run is cancelled: only live "
                       "runs (admitted, running, suspended) can be cancelled"]
    assert page.text("#bulk-matched").endswith(" 1 skipped.")


def _check_dead_letters_and_tail(page: Page) -> None:
    _go(page, "#deadletters")
    page.until("document.querySelectorAll('#deadletters-table tbody tr').length >= 1",
               "the dead letter")
    cells = page.texts("#deadletters-table tbody tr:first-child td")
    assert cells[1] == "nosuchFlow"
    assert "nosuchFlow" in cells[4]  # the reason names what was wrong
    page.screenshot("deadletters")
    _go(page, "#tail")
    page.until("document.querySelectorAll('#tail-table tbody tr').length >= 10",
               "the newest decisions")
    assert "admitted" in page.texts("#tail-table td.outcome")
    page.screenshot("tail")


def test_with_kafka_unreachable_the_console_says_so(tmp_path: Path, chromium: int) -> None:
    settings = Settings(bootstrap=f"127.0.0.1:{_free_port()}", namespace="down.",
                        state_dir=tmp_path / "state")
    with open_server(settings, port=0) as server:
        page = _open_tab(chromium, server.url + "/")
        try:
            page.until("(document.getElementById('status') || {}).className === 'error'",
                       "the broker-down state", timeout=15)
            status = page.text("#status")
            assert status.startswith("Kafka cannot be read (503): no Kafka broker answered at "
                                     f"{settings.bootstrap}")
            page.screenshot("broker-down")
        finally:
            page.close()


LIMITS_APP = App([slow_sync, tiered, embed])


def test_the_console_overrides_a_throttle_and_shows_a_pools_and_a_keys_own_limit(
        settings: Settings, chromium: int) -> None:
    create_topics(settings)
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)
    control = TopicReader(settings, topics.control, OverrideRow)
    limits.set_limit(settings, "tiers", "acme", 3, reason="enterprise", by="billing")
    with WorkerThread(LIMITS_APP, settings), Client(app=LIMITS_APP, settings=settings,
                                                    replies=False) as client:
        for n in range(3):  # three of acme: its own limit is 3, the declared one 2
            client.submit("tiered", {"tenant": "acme", "n": n})
        client.submit("embed", {"tenant": "acme", "n": 0})  # one of the pool's 3 slots
        for n in range(4):  # one each 10 s: one goes, three wait
            client.submit("slowSync", {"n": n})
        client.flush()
        ledger.until(lambda rows: _count(rows, Outcome.admitted, "tiered") == 3
                     and _count(rows, Outcome.admitted, "embed") == 1
                     and _count(rows, Outcome.queued, "slowSync") == 3,
                     what="three tiered and one pooled admitted, three slow ones queued")
        with open_server(settings, port=0, app=LIMITS_APP) as server:
            page = _open_tab(chromium, server.url + "/#overview")
            try:
                tiered_cell = "#overview-table tr[data-workflow=tiered] td.inflight"
                page.until(f"(document.querySelector('{tiered_cell}') || {{}}).textContent "
                           f"=== '3 (acme: 3/3 from {topics.limits}, declared 2)'",
                           "acme's own limit from the limits table")
                pool_cell = "#pools-table tr[data-pool=openai] td.inflight"
                page.until(f"(document.querySelector('{pool_cell}') || {{}}).textContent "
                           "=== '1 / 3'", "the pool's line")
                assert page.texts("#pools-table tr[data-pool=openai] td")[:2] == [
                    "openai", "embed"]

                # The form asks for a throttle's rate: the period field, not the nth.
                page.js("const c = document.getElementById('limit-control');"
                        "c.value = 'throttle'; c.dispatchEvent(new Event('change'));"
                        "document.getElementById('limit-workflow').value = 'slowSync';"
                        "document.getElementById('limit-value').value = '10';"
                        "document.getElementById('limit-period').value = '10s';"
                        "document.getElementById('limit-reason').value = 'quota raised';")
                assert page.js("document.getElementById('limit-nth').disabled") is True
                page.js("document.getElementById('limit-preview').click()")
                page.until("document.getElementById('limit-apply') !== null",
                           "the override's apply button")
                said = page.text("#limit-preview-text")
                assert said.startswith(
                    "throttle of slowSync: 1 per 10s -> 10 per 10s (declared 1 per 10s). "
                    "each key's turn already due stands; the turns after it come one each "
                    "1s instead of one each 10s; "), said
                assert page.text("#limit-apply") == "Apply: 1 per 10s -> 10 per 10s"
                page.js("document.getElementById('limit-apply').click()")
                page.until("document.getElementById('limit-preview-text').textContent"
                           ".startsWith('throttle of slowSync: 1 per 10s -> 10 per 10s')",
                           "the override applied")
            finally:
                page.close()
    (row,) = control.until(lambda rows: len(rows) >= 1, what="the override row")
    assert (row.control, row.budget, row.limit, row.period_ms, row.by, row.reason) == (
        "throttle", "slowSync", 10, 10_000, "dashboard", "quota raised")
    ledger.close()
