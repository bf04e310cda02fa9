"""Prometheus metrics: what each process can know cheaply (docs/operations.md).

- The worker (`sluicegate worker --metrics-port`) knows its own loop: records handled,
  commits and how long they take, aborted cycles, and its consumer lag. It counts once
  per commit cycle, never per record, so the loop's hot path is unchanged.
- `sluicegate inspect serve` (`GET /metrics`) knows the fleet-wide picture it already
  reads for the flow view: decisions by outcome (from the ledger), queue depths, the
  oldest wait, slots in use and pauses, per workflow. Computed when scraped.

Each process uses a registry of its own, so two workers in one test process never meet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.ops.flow import FlowView

if TYPE_CHECKING:
    from sluicegate.engine.runtime import Worker

# Lag needs a call per assigned partition: done at most this often, after a commit.
LAG_EVERY_S = 1.0


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.records = Counter("sluicegate_worker_records", "Input records processed "
                               "(starts, stage records, run events)", registry=r)
        self.commits = Counter("sluicegate_worker_commits", "Transactions committed",
                               registry=r)
        self.aborts = Counter("sluicegate_worker_aborts", "Cycles aborted and rewound",
                              registry=r)
        self.commit_seconds = Histogram(
            "sluicegate_worker_commit_seconds", "Time to commit one cycle (changelog, flush, "
            "offsets, commit, store write)", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0))
        self.lag = Gauge("sluicegate_worker_consumer_lag", "Records not yet consumed, per "
                         "assigned input partition", ["topic", "partition"], registry=r)
        self._seen = 0
        self._lag_at = 0.0

    def committed(self, worker: Worker, seconds: float) -> None:
        self.commits.inc()
        self.commit_seconds.observe(seconds)
        self.records.inc(worker.processed - self._seen)
        self._seen = worker.processed
        now = time.monotonic()
        if now - self._lag_at >= LAG_EVERY_S:
            self._lag_at = now
            self._measure_lag(worker)

    def aborted(self) -> None:
        self.aborts.inc()

    def _measure_lag(self, worker: Worker) -> None:
        consumer = worker.consumer
        self.lag.clear()  # partitions revoked since the last time
        for tp in consumer.position(consumer.assignment()):
            # cached: the high watermark of the last fetch, no request to the broker.
            _, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                self.lag.labels(tp.topic, str(tp.partition)).set(max(0, high - tp.offset))


def serve_worker_metrics(port: int, addr: str = "127.0.0.1") -> WorkerMetrics:
    """The worker's /metrics on `addr` (loopback unless the operator says otherwise)."""
    metrics = WorkerMetrics()
    start_http_server(port, addr=addr, registry=metrics.registry)
    return metrics


class FlowCollector(Collector):
    """The inspect server's metrics, computed from a fresh flow view at each scrape."""

    def __init__(self, view: Callable[[], FlowView],
                 decisions: Callable[[], list[tuple[str, str, int]]]) -> None:
        self._view = view
        self._decisions = decisions

    def collect(self) -> Iterator[Metric]:
        decided = CounterMetricFamily("sluicegate_decisions", "Ledger rows by workflow and "
                                      "outcome", labels=["workflow", "outcome"])
        for workflow, outcome, n in self._decisions():
            decided.add_metric([workflow, outcome], n)
        yield decided
        queued = GaugeMetricFamily("sluicegate_queued", "Starts waiting (latest row queued)",
                                   labels=["workflow"])
        oldest = GaugeMetricFamily("sluicegate_oldest_waiting_seconds", "Age of the oldest "
                                   "queued start", labels=["workflow"])
        slots = GaugeMetricFamily("sluicegate_in_flight", "Live runs (per concurrency slot "
                                  "held)", labels=["workflow"])
        paused = GaugeMetricFamily("sluicegate_paused", "1 while the workflow is paused",
                                   labels=["workflow"])
        for wf in self._view().workflows:
            total = wf.total()
            queued.add_metric([wf.workflow], total.queued)
            oldest.add_metric([wf.workflow], (total.waiting_ms or 0) / 1000)
            slots.add_metric([wf.workflow], total.in_flight)
            paused.add_metric([wf.workflow], 1 if wf.paused else 0)
        yield from (queued, oldest, slots, paused)
