"""The alert rules of deploy/prometheus run by a real Prometheus server (Debian's
`prometheus` binary) scraping a worker's metrics endpoint and the inspect server: a dead
letter makes SluicegateDeadLetters fire, a tenant at its concurrency limit shows as a key
at its limit, the worker's commit time is recorded and the group's offsets arrive, and an
operator's override is a gauge. Every name the rules and the dashboard read is checked
against what the server scraped. And the
inspect server alone: start requests no worker ever committed on count as lag."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pydantic import BaseModel

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Timeouts, Workflow
from sluicegate.ops.inspect import open_server
from sluicegate.ops.services import overrides
from sluicegate.ops.services.metrics import serve_worker_metrics
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Origin, Outcome, StartRequest
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.concurrency import per_tenant
from tests.apps.defer import tour
from tests.integration.kafka_helpers import TopicReader, WorkerThread
from tests.unit.test_deploy_metrics import RULES, used_metric_names

pytestmark = pytest.mark.broker



class Report(BaseModel):
    n: int


# An unkeyed limit and a timeouts.start, so that every metric the rules read has a series.
report = Workflow(name="nightlyReport", payload=Report, concurrency=Concurrency(limit=2),
                  timeouts=Timeouts(start="1 hour"))
APP = App([tour, per_tenant, report])
PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on a loopback port with a data directory of its own."""

    def __init__(self, binary: str, workdir: Path, worker: str, inspect: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        # The job names the rules expect (deploy/prometheus/prometheus.yml), scraped often.
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "sluicegate-worker",
                 "static_configs": [{"targets": [worker]}]},
                {"job_name": "sluicegate-inspect", "scrape_interval": "2s",
                 "scrape_timeout": "2s", "static_configs": [{"targets": [inspect]}]},
            ],
        }))
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def until(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        """Wait for `check` to return something true, failing after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                value = check()
            except OSError:  # not listening yet
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                     f"targets: {self.targets()}")
            time.sleep(0.2)

    def targets(self) -> list[tuple[str, str, str]]:
        """Each target's job, health and last scrape error, to say why a wait failed."""
        try:
            active = self.api("targets")["activeTargets"]
        except OSError as exc:
            return [("", "unreachable", str(exc))]
        return [(t["labels"]["job"], t["health"], t["lastError"]) for t in active]

    def firing(self, alert: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def prometheus_binary() -> str:
    if PROMETHEUS is None:
        missing = ("no prometheus binary on PATH (Debian: apt-get install prometheus; "
                   ".ci/run installs it)")
        if os.environ.get("SLUICEGATE_REQUIRE_PROMETHEUS"):
            pytest.fail(missing)
        pytest.skip(missing)
    return PROMETHEUS


@pytest.fixture
def running(settings: Settings, tmp_path: Path,
            prometheus_binary: str) -> Iterator[tuple[Prometheus, Client]]:
    """A worker with its metrics endpoint, the inspect server with the declarations, and
    Prometheus scraping both with the project's rules."""
    create_topics(settings)
    worker_port = _free_port()
    thread = WorkerThread(APP, settings)
    thread.worker.metrics = serve_worker_metrics(worker_port)
    with thread, open_server(settings, port=0, app=APP) as server, \
            Client(app=APP, settings=settings, replies=False) as client:
        prometheus = Prometheus(prometheus_binary, tmp_path, f"127.0.0.1:{worker_port}",
                                f"127.0.0.1:{server.port}")
        try:
            yield prometheus, client
        finally:
            prometheus.stop()


def test_a_dead_letter_fires_its_alert_and_a_full_tenant_shows_at_its_limit(
        settings: Settings, running: tuple[Prometheus, Client]) -> None:
    prometheus, client = running
    topics = Topics(settings)
    ledger = TopicReader(settings, topics.ledger, LedgerRecord)

    # Both targets up, the rules loaded, and a zero of dead letters scraped before any.
    prometheus.until(lambda: len(prometheus.query("up == 1")) == 2, what="both targets up")
    groups = prometheus.api("rules")["groups"]
    assert {g["name"] for g in groups} == {"sluicegate.recording", "sluicegate.alerts"}
    prometheus.until(lambda: prometheus.query("sluicegate_dead_letters_total == 0"),
                     what="no dead letters yet")
    assert prometheus.firing("SluicegateDeadLetters") == []

    # A start of a workflow nobody declared: rejected and dead-lettered.
    producer = Producer(settings.client_config(partitioner="murmur2_random"))
    stray = StartRequest(request_id=uuid.uuid4().hex, workflow="nosuchFlow", payload=b"{}",
                         origin=Origin.event, requested_at_ms=int(time.time() * 1000))
    producer.produce(topics.starts, codec.encode(stray), stray.request_id.encode())
    assert producer.flush(30) == 0
    # Five runs of one tenant against its limit of five, and a sixth that waits.
    for n in range(6):
        client.submit("perTenant", {"tenant": "acme", "n": n})
    client.flush()
    ledger.until(lambda rows: sum(r.outcome is Outcome.admitted for r in rows) == 5
                 and sum(r.outcome is Outcome.queued for r in rows) == 1
                 and any(r.outcome is Outcome.rejected for r in rows),
                 what="five admitted, one queued, one rejected")

    (alert,) = prometheus.until(lambda: prometheus.firing("SluicegateDeadLetters"),
                                what="SluicegateDeadLetters firing")
    assert alert["labels"]["severity"] == "warning"
    assert "dead-lettered in the last 15 minutes" in alert["annotations"]["summary"]

    (key,) = prometheus.until(lambda: prometheus.query("sluicegate_key_at_limit == 1"),
                              what="acme at its limit")
    assert key["metric"]["workflow"] == "perTenant"
    assert key["metric"]["key"] == "acme"
    prometheus.until(
        lambda: prometheus.query('sluicegate_queued{workflow="perTenant"} == 1'),
        what="one perTenant start queued")
    # The decisions recorded per outcome, zero for an outcome not seen yet.
    prometheus.until(lambda: prometheus.query(
        'workflow_outcome:sluicegate_decisions:rate5m{workflow="perTenant",outcome="admitted"}'
        ' > 0'), what="the admissions' rate recorded")
    assert prometheus.query('sluicegate_decisions_total{workflow="tourNarration",'
                            'outcome="expired"} == 0')
    # The worker's commits, and the group's offsets on the start requests read from the broker.
    prometheus.until(lambda: prometheus.query(
        'sluicegate_worker_commits_total{job="sluicegate-worker"} > 0'),
        what="the worker's commits scraped")
    (p99,) = prometheus.until(lambda: prometheus.query(
        "instance:sluicegate_worker_commit_seconds:p99_5m >= 0"),
        what="the worker's commit time recorded")
    assert float(p99["value"][1]) < 10
    prometheus.until(lambda: prometheus.query(
        f'sum(sluicegate_workers_committed_offset{{topic="{topics.starts}"}}) >= 7'),
        what="the workers' committed offsets on the start requests")
    # All decided: nothing of the start requests waits (producers write them outside
    # transactions, so no marker is counted as lag).
    prometheus.until(lambda: prometheus.query(
        f'sum(sluicegate_workers_lag{{topic="{topics.starts}"}}) == 0'),
        what="no lag on the start requests")
    assert prometheus.firing("SluicegateWorkerNotCommitting") == []

    # An operator's override: its gauge, and the limit in force, as SluicegateLimitOverrideInForce
    # reads them.
    overrides.change_limit(settings, APP, "perTenant", concurrency=6, reason="one more",
                           by="ops")
    prometheus.until(lambda: prometheus.query(
        'sluicegate_limit_override{control="concurrency",budget="perTenant"} == 6'),
        what="the override's gauge")
    assert prometheus.query(
        'sluicegate_limit_in_force{control="concurrency",budget="perTenant"} == 6')

    # Every sluicegate metric the server holds is one the code exports, and every name the
    # rules and the dashboard read is among those the server scraped, but for awaited ones.
    scraped = {name for name in prometheus.api("label/__name__/values")
               if name.startswith("sluicegate_")}
    used = used_metric_names()
    assert used.exported <= scraped, sorted(used.exported - scraped)


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_start_requests_no_worker_ever_committed_count_as_lag_from_their_first_offset(
        settings: Settings) -> None:
    # A worker stuck from its start never commits: its partitions still show what waits.
    create_topics(settings)
    topics = Topics(settings)
    with Client(app=APP, settings=settings, replies=False) as client:
        for n in range(3):
            client.submit("perTenant", {"tenant": "acme", "n": n})
        client.flush()
    with open_server(settings, port=0, app=APP) as server:
        samples = _scrape(server.url + "/metrics")
    lag = {dict(labels)["partition"]: value for (name, labels), value in samples.items()
           if name == "sluicegate_workers_lag" and dict(labels)["topic"] == topics.starts}
    assert len(lag) == settings.partitions
    assert sum(lag.values()) == 3
    # Nothing dead-lettered yet, and every declared outcome at zero.
    assert samples[("sluicegate_dead_letters_total", frozenset())] == 0
    assert samples[("sluicegate_decisions_total",
                    frozenset({("workflow", "nightlyReport"), ("outcome", "expired")}))] == 0
