"""Every topic sluicegate uses: its name under the namespace, its partitions, its configuration.

Stage topics and `starts` share one partition count: a key lands on the same partition
number in every topic that carries it, so the task that owns partition p owns that key's
state in every stage (co-partitioning, as in Kafka Streams).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.config import Settings

# The stages that keep state, in SPEC.md's order of evaluation. `runs` keeps the runs table.
STATEFUL_STAGES = (
    "identity", "ratelimit", "defer", "singleton", "throttle", "concurrency", "pause", "runs",
    "cancelon",
)
# Stages fed through a topic of their own: starts on their way, and releases of the slots
# runs hold (identity's also takes starts a producer keyed differently than sluicegate;
# runs' takes the admitted starts whose run row another worker keeps,
# docs/decisions/in-process-handover.md).
ROUTED_STAGES = (
    "identity", "ratelimit", "defer", "singleton", "throttle", "concurrency", "pause",
    "cancelon", "runs",
)

_COMPACT = {"cleanup.policy": "compact"}
# The broker's default largest record batch (message.max.bytes), and what a batch of one
# record adds to it.
_KAFKA_MAX_MESSAGE_BYTES = 1_048_588
_BATCH_OVERHEAD_BYTES = 1024
# A week of history on the event-like topics; the ledger is the audit trail, so a month.
_WEEK = {"retention.ms": str(7 * 24 * 3600 * 1000)}
_MONTH = {"retention.ms": str(30 * 24 * 3600 * 1000)}


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    purpose: str = ""

    @property
    def compacted(self) -> bool:
        return self.config.get("cleanup.policy") == "compact"


class Topics:
    """Topic names for one namespace (default `sg.`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        ns = settings.namespace
        self.starts = f"{ns}starts"
        self.admitted = f"{ns}admitted"
        self.ledger = f"{ns}ledger"
        self.run_events = f"{ns}run-events"
        self.commands = f"{ns}commands"
        self.control = f"{ns}control"
        self.limits = f"{ns}limits"
        self.deadletter = f"{ns}deadletter"
        self.runs = f"{ns}runs"
        self.replies = f"{ns}replies"

    def stage(self, stage: str) -> str:
        return f"{self.settings.namespace}stage.{stage}"

    def changelog(self, stage: str) -> str:
        return f"{self.settings.namespace}changelog.{stage}"

    def event(self, name: str) -> str:
        """The topic a cancelOn `event` is published to: `<namespace>events.<name>`
        (docs/decisions/cancelon-correlator.md)."""
        return f"{self.settings.namespace}events.{name}"

    def event_specs(self, names: list[str]) -> list[TopicSpec]:
        """The event topics of the declared cancelOn events, with the stage topics'
        partition count (so a worker's tasks line up with them)."""
        return [TopicSpec(self.event(name), self.settings.partitions, dict(_WEEK),
                          f"cancelOn events {name!r}") for name in sorted(set(names))]

    @property
    def group(self) -> str:
        """The consumer group every worker joins."""
        return f"{self.settings.namespace}workers"

    def specs(self) -> list[TopicSpec]:
        n = self.settings.partitions
        specs = [
            TopicSpec(self.starts, n, dict(_WEEK), "start requests from producers"),
            TopicSpec(self.admitted, n, dict(_WEEK), "admitted starts, for engines"),
            TopicSpec(self.ledger, n, dict(_MONTH), "one record per admission decision"),
            TopicSpec(self.run_events, n, dict(_WEEK), "run lifecycle reported by engines"),
            TopicSpec(self.commands, n, dict(_WEEK), "cancel and redrive commands for engines"),
            TopicSpec(self.control, 1, dict(_COMPACT), "pause rows, limit overrides"),
            TopicSpec(self.limits, 1, dict(_COMPACT), "per-key limits (tenant tiers)"),
            TopicSpec(self.deadletter, n, dict(_MONTH), "records that could not be handled"),
            TopicSpec(self.runs, n, dict(_COMPACT), "the runs table"),
            TopicSpec(self.replies, n, {"retention.ms": str(3600 * 1000)},
                      "decisions answered to waiting callers"),
        ]
        specs += [
            TopicSpec(self.stage(s), n, dict(_WEEK), f"repartition input of the {s} stage")
            for s in ROUTED_STAGES
        ]
        specs += [
            TopicSpec(self.changelog(s), n, dict(_COMPACT), f"changelog of the {s} store")
            for s in STATEFUL_STAGES
        ]
        if self.settings.max_record_bytes + _BATCH_OVERHEAD_BYTES > _KAFKA_MAX_MESSAGE_BYTES:
            # Producers set to write larger records: every topic must take them.
            limit = {"max.message.bytes": str(self.settings.max_record_bytes
                                              + _BATCH_OVERHEAD_BYTES)}
            specs = [TopicSpec(s.name, s.partitions, {**s.config, **limit}, s.purpose)
                     for s in specs]
        return specs
