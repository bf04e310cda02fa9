"""The inspect server over HTTP on the real broker: what it refuses (a cross-site or
tokenless change, a foreign Host, an undeclared workflow), 503 with a reason when Kafka
cannot be read, where it listens, and the token `inspect serve` prints and puts in its page.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sluicegate.admission.control import ControlTable
from sluicegate.config import Settings
from sluicegate.ops.inspect import TOKEN_ENV, InspectServer, open_server
from sluicegate.ops.services.metrics import serve_worker_metrics
from sluicegate.topology.admin import create_topics

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token-1"


def _http(url: str, *, method: str = "GET", body: Any = None,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else (body if isinstance(body, bytes)
                                      else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def _pause_row(settings: Settings, workflow: str) -> Any:
    table = ControlTable(settings)
    try:
        table.catch_up(timeout_s=30)
        return table.rows.get(workflow)
    finally:
        table.close()


def _outward_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent for a UDP connect
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def _refused_on(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.fixture
def server(settings: Settings) -> Iterator[InspectServer]:
    create_topics(settings)
    with open_server(settings, port=0, declared=["tourNarration"], token=TOKEN) as srv:
        yield srv


def test_a_forged_cross_origin_post_changes_nothing_and_the_token_does(
        settings: Settings, server: InspectServer) -> None:
    url = server.url + "/inspect/workflows/tourNarration/pause"
    # What a page on another site can send without a preflight: text/plain, no token.
    status, doc = _http(url, method="POST", body=b'{"reason": "x"}', headers={
        "Content-Type": "text/plain", "Origin": "http://evil.example",
        "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "evil.example" in doc["error"]
    # Even with the token, a cross-site request is refused.
    status, _ = _http(url, method="POST", body={"reason": "x"}, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}",
        "Origin": "http://evil.example"})
    assert status == 403
    # Same origin, no token / a wrong token / not JSON.
    same = {"Origin": server.url, "Content-Type": "application/json"}
    assert _http(url, method="POST", body={"reason": "x"}, headers=same)[0] == 401
    assert _http(url, method="POST", body={"reason": "x"},
                 headers={**same, "Authorization": "Bearer nope"})[0] == 401
    assert _http(url, method="POST", body={"reason": "x"}, headers={
        "Origin": server.url, "Content-Type": "text/plain",
        "Authorization": f"Bearer {TOKEN}"})[0] == 415
    # Neither an action that does not exist.
    assert _http(url.replace("/pause", "/explode"), method="POST", body={"reason": "x"},
                 headers={**same, "Authorization": f"Bearer {TOKEN}"})[0] == 404
    assert _pause_row(settings, "tourNarration") is None

    status, doc = _http(url, method="POST", body={"reason": "deploying a fix"},
                        headers={**same, "Authorization": f"Bearer {TOKEN}"})
    assert (status, doc) == (200, {"workflow": "tourNarration", "paused": True})
    row = _pause_row(settings, "tourNarration")
    assert row is not None and row.paused and row.reason == "deploying a fix"


def test_a_workflow_that_is_not_declared_is_a_404_with_a_hint(
        settings: Settings, server: InspectServer) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    status, doc = _http(server.url + "/inspect/workflows/tourNaration/pause", method="POST",
                        body={"reason": "x"}, headers=headers)
    assert status == 404
    assert doc["error"] == "no workflow 'tourNaration' declared; did you mean 'tourNarration'?"
    assert _pause_row(settings, "tourNaration") is None
    status, doc = _http(server.url + "/inspect/waiting?workflow=nosuch")
    assert status == 404 and "nosuch" in doc["error"]


def test_a_request_for_another_host_name_is_not_answered(server: InspectServer) -> None:
    # A page on a domain pointed at 127.0.0.1 (DNS rebinding) sends its own name as Host.
    status, text = _http(server.url + "/", headers={"Host": f"evil.example:{server.port}"})
    assert status == 421 and "evil.example" in text
    status, page = _http(server.url + "/", headers={"Host": f"localhost:{server.port}"})
    assert status == 200 and f'content="{TOKEN}"' in page


def test_with_kafka_unreachable_every_read_answers_503_with_the_reason_quickly(
        tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(bootstrap=f"127.0.0.1:{port}", namespace="down.",
                        state_dir=tmp_path / "state")
    with open_server(settings, port=0, token=TOKEN) as server:
        for path in ("/inspect/overview", "/inspect/workflows/flow-control",
                     "/inspect/waiting", "/inspect/runs/abc", "/inspect/deadletters",
                     "/inspect/decisions", "/metrics"):
            began = time.monotonic()
            status, doc = _http(server.url + path)
            took = time.monotonic() - began
            assert status == 503, (path, doc)
            assert doc["error"].startswith(f"no Kafka broker answered at 127.0.0.1:{port}")
            assert took < 5, (path, took)
        status, doc = _http(server.url + "/inspect/workflows/w/pause", method="POST",
                            body={"reason": "x"}, headers={
                                "Content-Type": "application/json",
                                "Authorization": f"Bearer {TOKEN}"})
        assert status == 503
        # The page itself needs no broker: it says what is wrong.
        assert _http(server.url + "/")[0] == 200


def test_the_server_and_the_worker_metrics_listen_on_loopback_by_default(
        settings: Settings) -> None:
    with open_server(settings, port=0) as server:
        assert server.socket.getsockname()[0] == "127.0.0.1"
        outward = _outward_address()
        if outward is not None:
            assert _refused_on(outward, server.port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve_worker_metrics(port)
    assert _http(f"http://127.0.0.1:{port}/metrics")[0] == 200
    outward = _outward_address()
    if outward is not None:
        assert _refused_on(outward, port)


def test_the_worker_command_passes_metrics_host_on(monkeypatch: pytest.MonkeyPatch,
                                                    bootstrap: str) -> None:
    from sluicegate.ops import worker
    from sluicegate.ops.cli.root import app as cli

    seen: dict[str, Any] = {}
    monkeypatch.setattr(worker, "run_worker", lambda spec, settings, **kw: seen.update(kw))
    args = ["worker", "--app", "x", "--metrics-port", "9", "--bootstrap", bootstrap]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # Called in-process, the worker gets a stop of its own (sluicegate/ops/signals.py).
    assert isinstance(seen.pop("stop"), threading.Event)
    assert seen == {"metrics_port": 9, "metrics_host": "127.0.0.1", "leave_on_stop": False}
    assert CliRunner().invoke(cli, [*args, "--metrics-host", "0.0.0.0"]).exit_code == 0
    assert seen["metrics_host"] == "0.0.0.0"


def _serve(settings: Settings, env: dict[str, str]) -> tuple[subprocess.Popen[str],
                                                             queue.Queue[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "inspect", "serve", "--port", "0",
         "--bootstrap", settings.bootstrap, "--namespace", settings.namespace],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _lines_until(lines: queue.Queue[str], marker: str, timeout: float = 60) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(marker in line for line in got):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {marker!r} in {got}")
        try:
            got.append(lines.get(timeout=remaining))
        except queue.Empty:
            continue
    return got


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_serve_prints_a_token_it_made_once_and_puts_it_in_its_page(
        settings: Settings) -> None:
    create_topics(settings)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    proc, lines = _serve(settings, env)
    try:
        out = _lines_until(lines, "token")
        (url,) = [line.split()[1] for line in out if line.startswith("serving ")]
        (token,) = [line.split()[1] for line in out if line.startswith("token: ")]
        assert len(token) >= 24
        status, page = _http(url)
        assert status == 200 and f'content="{token}"' in page
    finally:
        _stop(proc)

    proc, lines = _serve(settings, {**env, TOKEN_ENV: "chosen-token"})
    try:
        out = _lines_until(lines, "token")
        assert "chosen-token" not in "".join(out)
        (url,) = [line.split()[1] for line in out if line.startswith("serving ")]
        assert 'content="chosen-token"' in _http(url)[1]
    finally:
        _stop(proc)
