"""The dashboard in a real headless Chromium, driven over the DevTools protocol: the flow
view renders, pause writes the control row, and the bulk panel's apply button exists only
after a preview returned a number."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluicegate.config import Settings
from sluicegate.ops.inspect import open_server
from sluicegate.topology.admin import create_topics

pytestmark = pytest.mark.broker

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
websocket = pytest.importorskip("websocket", reason="websocket-client is in the dev extra")


class FakeBulk:
    """The bulk seam, recording what the page asked for."""

    def __init__(self) -> None:
        self.previews: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []

    def preview(self, request: dict[str, Any]) -> dict[str, Any]:
        self.previews.append(request)
        return {"matched": 3, "truncated": True, "runs": ["e1", "e2", "e3"]}

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(request)
        return {"truncated": True, "results": [
            {"execution_id": "e1", "outcome": "succeeded", "reason": None},
            {"execution_id": "e2", "outcome": "failed", "reason": "the engine refused"},
            {"execution_id": "e3", "outcome": "skipped", "reason": "already completed"}]}


class Page:
    """One Chromium tab over the DevTools protocol: evaluate JavaScript, wait for it."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=30)
        self._ids = itertools.count(1)

    def js(self, expression: str) -> Any:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": "Runtime.evaluate", "params": {
            "expression": expression, "returnByValue": True, "awaitPromise": True}}))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == call_id:
                result = reply["result"]
                if "exceptionDetails" in result:
                    raise AssertionError(f"{expression}: {result['exceptionDetails']}")
                return result["result"].get("value")

    def until(self, expression: str, what: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")

    def close(self) -> None:
        self.ws.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[int]:
    """A headless Chromium with a DevTools port; yields the port."""
    if CHROMIUM is None:
        pytest.skip("no chromium binary (Debian's `chromium` package; CI installs it)")
    port = _free_port()
    proc = subprocess.Popen([
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", f"--user-data-dir={tmp_path / 'chromium'}",
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


def test_apply_appears_only_after_a_preview_returned_a_number_and_pause_writes_the_row(
        settings: Settings, chromium: int) -> None:
    create_topics(settings)
    bulk = FakeBulk()
    with open_server(settings, port=0, bulk=bulk, declared=["tourNarration"]) as server:
        page = _open_tab(chromium, server.url + "/")
        try:
            page.until("document.querySelector('section[data-workflow=tourNarration] "
                       "button.pause') !== null", "the flow view with a pause button")
            assert page.js("document.getElementById('bulk-apply')") is None

            # A cancel without a reason is refused: still no apply button.
            page.js("document.getElementById('bulk-limit').value = '3';"
                    "document.getElementById('bulk-workflow').value = 'tourNarration';"
                    "document.getElementById('bulk-preview').click()")
            page.until("document.getElementById('bulk-error').textContent", "the refusal")
            assert "reason is required" in page.js(
                "document.getElementById('bulk-error').textContent")
            assert page.js("document.getElementById('bulk-apply') === null") is True
            assert bulk.previews == []

            page.js("document.getElementById('bulk-reason').value = 'bad deploy';"
                    "document.getElementById('bulk-preview').click()")
            page.until("document.getElementById('bulk-apply') !== null", "the apply button")
            assert page.js("document.getElementById('bulk-matched').textContent") == (
                "3 runs matched (truncated: more match than the limit).")
            assert page.js("document.getElementById('bulk-apply').textContent") == (
                "Apply cancel to 3 runs")

            page.js("document.getElementById('bulk-apply').click()")
            page.until("document.querySelectorAll('#bulk-result li').length === 3",
                       "the per-run results")
            assert page.js("[...document.querySelectorAll('#bulk-result li')]"
                           ".map(li => li.textContent)") == [
                "e1: succeeded", "e2: failed (the engine refused)",
                "e3: skipped (already completed)"]
            assert page.js("document.getElementById('bulk-apply') === null") is True
            expected = {"verb": "cancel", "workflow": "tourNarration", "status": None,
                        "mode": None, "reason": "bad deploy", "limit": 3}
            assert bulk.previews == [expected]
            assert bulk.applied == [{**expected, "only": ["e1", "e2", "e3"]}]

            page.js("document.getElementById('pause-reason').value = 'deploying a fix';"
                    "document.querySelector('section[data-workflow=tourNarration] "
                    "button.pause').click()")
            page.until("(document.querySelector('section[data-workflow=tourNarration] "
                       ".state') || {}).textContent === 'PAUSED: deploying a fix'",
                       "the workflow shown paused")
        finally:
            page.close()
        tour = server.flow("tourNarration").get("tourNarration")
        assert tour is not None and tour.paused
        assert tour.pause.reason == "deploying a fix" and tour.pause.by == "dashboard"
