"""Prometheus metrics: what each process can know cheaply (docs/operations.md).

- The worker (`sluicegate worker --metrics-port`) knows its own loop: records handled,
  commits and how long they take, aborted cycles, and its consumer lag. It counts once
  per commit cycle, never per record, so the loop's hot path is unchanged.
- `sluicegate inspect serve` (`GET /metrics`) knows the fleet-wide picture it already
  reads for the flow view: decisions by outcome (from the ledger), queue depths, the
  oldest wait, slots in use and pauses, per workflow; keys at their limit; the limits
  operators override; with the declarations, the limits in force (a workflow's, a
  pool's, a key's from the limits table) and the bounds a wait is judged by; dead
  letters; and how far the workers' group has committed on each input partition, read
  from the broker, so that a worker that stopped committing shows even when its own
  endpoint is stale or gone. Computed when scraped.

The alert rules and the dashboard built on these names are in `deploy/` (docs/operations.md).

Each process uses a registry of its own, so two workers in one test process never meet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluicegate.admission.overrides import Target, effective, effective_period, in_force
from sluicegate.config import Settings
from sluicegate.topology.topics import Topics

if TYPE_CHECKING:
    from sluicegate.declare import App
    from sluicegate.engine.runtime import Worker
    from sluicegate.ops.services.flow import FlowView
    from sluicegate.schemas.records import OverrideRow

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


@dataclass(frozen=True, slots=True)
class WaitBounds:
    """What a workflow's declarations say about how long a start of it may wait:
    `timeouts.start`, and the longest period of its deferring controls (a debounce's
    period, or its timeout when it has one; a batch's timeout; a throttle's period)."""

    start_timeout_s: float | None = None
    period_s: float | None = None


def wait_bounds(app: App | None) -> dict[str, WaitBounds]:
    """The bounds of every workflow of `app` that has one."""
    if app is None:
        return {}
    bounds = {}
    for name, wf in app.workflows.items():
        periods = [t.period_ms for t in wf.throttle]
        if wf.debounce is not None:
            periods.append(wf.debounce.timeout_ms or wf.debounce.period_ms)
        if wf.batch is not None:
            periods.append(wf.batch.timeout_ms)
        start_ms = wf.timeouts.start_ms if wf.timeouts is not None else None
        if start_ms is not None or periods:
            bounds[name] = WaitBounds(
                start_timeout_s=None if start_ms is None else start_ms / 1000,
                period_s=max(periods) / 1000 if periods else None)
    return bounds


@dataclass(frozen=True, slots=True)
class InputOffsets:
    """One input partition of the workers' group: the offset the group has committed
    (the partition's first offset when it never committed there) and the partition's end
    as a read_committed consumer sees it (the last stable offset)."""

    topic: str
    partition: int
    committed: int
    end: int


# At most this many keys at their limit are listed per workflow (the count is whole).
KEYS_AT_LIMIT_LISTED = 20


class FlowCollector(Collector):
    """The inspect server's metrics, computed from a fresh flow view at each scrape.

    `declared` names the declared workflows, so each has a zero for every outcome before
    its first row of it (a rule on `increase()` sees the first expiry too); `bounds` come
    from the declarations (`wait_bounds`); `dead_letters` counts the dead letters so far
    (None while it does not know yet: then the metric is left out);
    `inputs` reads the workers' group's offsets from the broker; `overrides` gives the
    control table's override rows; `limits`, the declared limits an override may name
    (`overrides.targets`), each given as the limit in force."""

    def __init__(self, view: Callable[[], FlowView],
                 decisions: Callable[[], list[tuple[str, str, int]]], *,
                 declared: Iterable[str] = (), outcomes: Iterable[str] = (),
                 bounds: Mapping[str, WaitBounds] | None = None,
                 dead_letters: Callable[[], int | None] | None = None,
                 inputs: Callable[[], list[InputOffsets]] | None = None,
                 overrides: Callable[[], Mapping[str, OverrideRow]] | None = None,
                 limits: Sequence[Target] = ()) -> None:
        self._view = view
        self._decisions = decisions
        self._declared = tuple(declared)
        self._outcomes = tuple(outcomes)
        self._bounds = dict(bounds or {})
        self._dead_letters = dead_letters
        self._inputs = inputs
        self._overrides = overrides
        self._limits = tuple(limits)

    def collect(self) -> Iterator[Metric]:
        yield self._decided()
        yield from self._flow()
        yield from self._declared_bounds()
        rows = self._overrides() if self._overrides is not None else {}
        if self._overrides is not None:
            yield from self._overridden(rows)
        if self._limits:
            yield from self._in_force(self._limits, rows)
        dead_letters = self._dead_letters() if self._dead_letters is not None else None
        if dead_letters is not None:
            dead = CounterMetricFamily("sluicegate_dead_letters", "Records written to the "
                                       "dead-letter topic (bad input, poison records)")
            dead.add_metric([], dead_letters)
            yield dead
        if self._inputs is not None:
            yield from self._input_offsets(self._inputs())

    def _decided(self) -> Metric:
        decided = CounterMetricFamily("sluicegate_decisions", "Ledger rows by workflow and "
                                      "outcome", labels=["workflow", "outcome"])
        counts = {(w, o): 0 for w in self._declared for o in self._outcomes}
        for workflow, outcome, n in self._decisions():
            counts[(workflow, outcome)] = n
        for (workflow, outcome), n in sorted(counts.items()):
            decided.add_metric([workflow, outcome], n)
        return decided

    def _flow(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily("sluicegate_queued", "Starts waiting (latest row queued)",
                                   labels=["workflow"])
        oldest = GaugeMetricFamily("sluicegate_oldest_waiting_seconds", "Age of the oldest "
                                   "queued start", labels=["workflow"])
        slots = GaugeMetricFamily("sluicegate_in_flight", "Live runs (per concurrency slot "
                                  "held)", labels=["workflow"])
        limit = GaugeMetricFamily("sluicegate_concurrency_limit", "The workflow's own unkeyed "
                                  "concurrency limit in force (with the declarations; an "
                                  "operator's override while one is set)",
                                  labels=["workflow"])
        at_limit = GaugeMetricFamily("sluicegate_keys_at_limit", "Keys whose runs in flight "
                                     "reach their concurrency limit", labels=["workflow"])
        key_at_limit = GaugeMetricFamily(
            "sluicegate_key_at_limit", f"1 for a key whose runs in flight reach its "
            f"concurrency limit (at most {KEYS_AT_LIMIT_LISTED} keys per workflow)",
            labels=["workflow", "key"])
        paused = GaugeMetricFamily("sluicegate_paused", "1 while the workflow is paused",
                                   labels=["workflow"])
        pool_limit = GaugeMetricFamily(
            "sluicegate_pool_concurrency_limit", "A concurrency pool's unkeyed limit in force "
            "(with the declarations; an operator's override while one is set)",
            labels=["pool"])
        pool_slots = GaugeMetricFamily("sluicegate_pool_in_flight", "Live runs of every member "
                                       "of a concurrency pool (per slot held)", labels=["pool"])
        key_limit = GaugeMetricFamily(
            "sluicegate_key_concurrency_limit", "The concurrency limit in force of a key whose "
            "limit comes from the limits table (per_key), for the keys with runs in flight or "
            "starts waiting; budget: the workflow or `pool:<name>`",
            labels=["budget", "key"])
        view = self._view()
        for wf in view.workflows:
            total = wf.total()
            queued.add_metric([wf.workflow], total.queued)
            oldest.add_metric([wf.workflow], (total.waiting_ms or 0) / 1000)
            slots.add_metric([wf.workflow], total.in_flight)
            if wf.limit is not None:
                limit.add_metric([wf.workflow], wf.limit)
            full = sorted(k.key or "" for k in wf.keys
                          if k.limit is not None and k.in_flight >= k.limit)
            at_limit.add_metric([wf.workflow], len(full))
            for key in full[:KEYS_AT_LIMIT_LISTED]:
                key_at_limit.add_metric([wf.workflow, key], 1)
            paused.add_metric([wf.workflow], 1 if wf.paused else 0)
            for k in wf.keys:
                if k.limit_row is not None and k.limit is not None:
                    key_limit.add_metric([wf.workflow, k.key or ""], k.limit)
        for pool in view.pools:
            pool_slots.add_metric([pool.pool], pool.in_flight)
            if pool.limit is not None:
                pool_limit.add_metric([pool.pool], pool.limit)
            for k in pool.keys:
                if k.limit_row is not None and k.limit is not None:
                    key_limit.add_metric([f"pool:{pool.pool}", k.key or ""], k.limit)
        yield from (queued, oldest, slots, limit, at_limit, key_at_limit, paused, pool_limit,
                    pool_slots, key_limit)

    @staticmethod
    def _overridden(rows: Mapping[str, OverrideRow]) -> Iterator[Metric]:
        limit = GaugeMetricFamily("sluicegate_limit_override", "The limit an operator's "
                                  "override puts in force, per control and budget (a "
                                  "workflow, `<workflow>#1` for its second limit, or "
                                  "`pool:<name>`), while one does", labels=["control", "budget"])
        declared = GaugeMetricFamily("sluicegate_limit_override_declared", "The declared limit "
                                     "an override stands in for", labels=["control", "budget"])
        period = GaugeMetricFamily("sluicegate_limit_override_period_seconds", "The period of "
                                   "a throttle's or rateLimit's override",
                                   labels=["control", "budget"])
        for row in sorted(rows.values(), key=lambda r: (r.control, r.budget)):
            if row.limit is None:
                continue
            limit.add_metric([row.control, row.budget], row.limit)
            if row.declared is not None:
                declared.add_metric([row.control, row.budget], row.declared)
            if row.period_ms is not None:
                period.add_metric([row.control, row.budget], row.period_ms / 1000)
        yield from (limit, declared, period)

    @staticmethod
    def _in_force(limits: Sequence[Target], rows: Mapping[str, OverrideRow],
                  ) -> Iterator[Metric]:
        limit = GaugeMetricFamily(
            "sluicegate_limit_in_force", "Each declared limit an override may name, as in "
            "force: the override's while one is set, else the declared one; the default "
            "of every key of a keyed limit (a key's own from the limits table is "
            "sluicegate_key_concurrency_limit)", labels=["control", "budget"])
        period = GaugeMetricFamily("sluicegate_limit_in_force_period_seconds", "The period "
                                   "in force of a throttle or a rateLimit",
                                   labels=["control", "budget"])
        for target in limits:
            row = in_force(rows, target.control, target.budget)
            labels = [target.control, target.budget]
            limit.add_metric(labels, effective(target.declared, row))
            if target.declared_period_ms is not None:
                period.add_metric(labels, effective_period(target.declared_period_ms,
                                                           row) / 1000)
        yield from (limit, period)

    def _declared_bounds(self) -> Iterator[Metric]:
        timeout = GaugeMetricFamily("sluicegate_start_timeout_seconds", "The workflow's "
                                    "declared timeouts.start", labels=["workflow"])
        period = GaugeMetricFamily("sluicegate_wait_period_seconds", "The longest period of "
                                   "the workflow's deferring controls (debounce, batch, "
                                   "throttle)", labels=["workflow"])
        for name, bound in sorted(self._bounds.items()):
            if bound.start_timeout_s is not None:
                timeout.add_metric([name], bound.start_timeout_s)
            if bound.period_s is not None:
                period.add_metric([name], bound.period_s)
        yield from (timeout, period)

    @staticmethod
    def _input_offsets(inputs: list[InputOffsets]) -> Iterator[Metric]:
        committed = GaugeMetricFamily("sluicegate_workers_committed_offset", "The offset the "
                                      "workers' group has committed, per input partition",
                                      labels=["topic", "partition"])
        lag = GaugeMetricFamily("sluicegate_workers_lag", "Records of an input partition the "
                                "workers' group has not committed yet (as read_committed "
                                "sees the partition's end)", labels=["topic", "partition"])
        for tp in inputs:
            labels = [tp.topic, str(tp.partition)]
            committed.add_metric(labels, tp.committed)
            lag.add_metric(labels, max(0, tp.end - tp.committed))
        yield from (committed, lag)


def input_offsets(admin: AdminClient, settings: Settings,
                  timeout_s: float = 5.0) -> list[InputOffsets]:
    """Where the workers' group stands on each of its input partitions: every topic it has
    committed offsets on, and always `starts` and `run-events`, whose partitions a stuck
    worker may never have committed on.

    The topics' metadata is asked first: the group's coordinator is asked only once a
    broker has just answered, never into an outage, where librdkafka aborts the process
    when that request's connection drops (confluentinc/librdkafka#4605;
    docs/decisions/committed-offsets-not-asked-into-an-outage.md)."""
    topics = Topics(settings)
    meta = admin.list_topics(timeout=timeout_s).topics
    group = ConsumerGroupTopicPartitions(topics.group)
    done = admin.list_consumer_group_offsets([group], request_timeout=timeout_s)
    found = done[topics.group].result(timeout=timeout_s).topic_partitions or []
    committed = {(tp.topic, tp.partition): tp.offset for tp in found
                 if tp.error is None and tp.offset >= 0}
    names = {topics.starts, topics.run_events} | {t for t, _ in committed}
    wanted = [TopicPartition(t, p) for t in sorted(names) if t in meta
              for p in sorted(meta[t].partitions)]
    if not wanted:
        return []
    ends = _offsets(admin, wanted, OffsetSpec.latest(), timeout_s)
    firsts = _offsets(admin, [tp for tp in wanted
                              if (tp.topic, tp.partition) not in committed],
                      OffsetSpec.earliest(), timeout_s)
    out = []
    for tp in wanted:
        at = (tp.topic, tp.partition)
        out.append(InputOffsets(tp.topic, tp.partition,
                                committed.get(at, firsts.get(at, 0)), ends[at]))
    return out


def _offsets(admin: AdminClient, tps: list[TopicPartition], spec: OffsetSpec,
             timeout_s: float) -> dict[tuple[str, int], int]:
    if not tps:
        return {}
    done = admin.list_offsets({tp: spec for tp in tps},
                              isolation_level=IsolationLevel.READ_COMMITTED,
                              request_timeout=timeout_s)
    return {(tp.topic, tp.partition): future.result(timeout=timeout_s).offset
            for tp, future in done.items()}
