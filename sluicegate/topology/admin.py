"""Creating the topics with the Admin API, idempotently."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.kafkautil import check_access
from sluicegate.topology.framing import configure_codec
from sluicegate.topology.topics import Topics, TopicSpec


class TopologyError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class CreateReport:
    created: list[TopicSpec]
    existing: list[TopicSpec]
    # An existing topic whose partition count differs cannot be fixed by creating it again:
    # co-partitioning would silently break, so it is reported, not ignored.
    mismatched: list[tuple[TopicSpec, int]]


def create_topics(settings: Settings, app: App | None = None,
                  timeout_s: float = 30.0) -> CreateReport:
    """Every sluicegate topic, and with `app` the event topics its cancelOn entries read;
    with a schema registry configured, the schemas and subjects too."""
    check_access(settings)
    configure_codec(settings)
    admin = AdminClient(settings.client_config())
    topics = Topics(settings)
    specs = topics.specs()
    if app is not None:
        specs += topics.event_specs(
            [entry.event for wf in app.workflows.values() for entry in wf.cancel_on])
    existing, mismatched, missing = _compare(specs, admin, timeout_s)
    created: list[TopicSpec] = []
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, num_partitions=s.partitions,
                         replication_factor=settings.replication, config=s.config)
                for s in missing
            ],
            operation_timeout=timeout_s,
        )
        by_name = {s.name: s for s in missing}
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
                created.append(by_name[name])
            except KafkaException as exc:
                error = exc.args[0]
                # Another process created it between our listing and our request.
                exists = KafkaError.TOPIC_ALREADY_EXISTS
                if isinstance(error, KafkaError) and error.code() == exists:
                    existing.append(by_name[name])
                else:
                    raise TopologyError(f"cannot create topic {name}: {error}") from exc
    if created:
        _wait_for_leaders(admin, [s.name for s in created], timeout_s)
    return CreateReport(created, existing, mismatched)


def _compare(specs: list[TopicSpec], admin: AdminClient, timeout_s: float) -> tuple[
        list[TopicSpec], list[tuple[TopicSpec, int]], list[TopicSpec]]:
    """The specs whose topic exists as specified, exists with another partition count
    (and that count), and does not exist."""
    present = admin.list_topics(timeout=timeout_s).topics
    existing: list[TopicSpec] = []
    mismatched: list[tuple[TopicSpec, int]] = []
    missing: list[TopicSpec] = []
    for spec in specs:
        meta = present.get(spec.name)
        if meta is None:
            missing.append(spec)
        elif len(meta.partitions) != spec.partitions:
            mismatched.append((spec, len(meta.partitions)))
        else:
            existing.append(spec)
    return existing, mismatched, missing


def require_topics(settings: Settings, timeout_s: float = 30.0) -> None:
    """Raise TopologyError unless every sluicegate topic exists with its partition count:
    a worker on a missing stage topic would fail every cycle that sends to it, and one on
    a topic with another partition count would put a key's state on two tasks. (The
    cancelOn event topics may come later: a worker notices them when they appear.)"""
    admin = AdminClient(settings.client_config())
    _, mismatched, missing = _compare(Topics(settings).specs(), admin, timeout_s)
    problems = [f"{spec.name} is missing" for spec in missing] + [
        f"{spec.name} has {found} partitions, not {spec.partitions}"
        for spec, found in mismatched]
    if problems:
        raise TopologyError(
            "the topics are not ready for a worker: " + "; ".join(problems)
            + (". Create them with `sluicegate topics create` (idempotent)." if missing
               else ". A topic's partition count must equal SLUICEGATE_PARTITIONS"
               f" ({settings.partitions}) for every stage to see a key on the same task."))


# What a share group of engines needs that Kafka's defaults do not give (group configs,
# KIP-932): the admitted starts written before the group's first member joined
# (`latest` would skip them: runs that never run), and only committed ones (sluicegate
# writes them in transactions; `read_uncommitted` would run starts of aborted ones).
SHARE_GROUP_CONFIG = {
    "share.auto.offset.reset": "earliest",
    "share.isolation.level": "read_committed",
}


def configure_share_group(settings: Settings, group: str, timeout_s: float = 30.0) -> None:
    """Set SHARE_GROUP_CONFIG on the share group `group` (idempotent; the group need not
    exist yet). Needs the ALTER_CONFIGS permission on the group."""
    admin = AdminClient(settings.client_config())
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in SHARE_GROUP_CONFIG.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise TopologyError(
                f"cannot configure share group {group!r} "
                f"({', '.join(f'{k}={v}' for k, v in SHARE_GROUP_CONFIG.items())}): "
                f"{exc.args[0]}. The broker must have share groups (Kafka 4.2 or later, "
                "feature share.version 1 or more) and this client the ALTER_CONFIGS "
                "permission on the group.") from exc


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """A topic just created answers NOT_LEADER until its partitions have leaders: wait
    for them, so whoever created the topics can use them at once."""
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting:
        topics = admin.list_topics(timeout=timeout_s).topics
        waiting = {
            name for name in waiting
            if name not in topics or topics[name].error is not None
            or any(p.leader < 0 for p in topics[name].partitions.values())
        }
        if waiting and time.monotonic() > deadline:
            raise TopologyError(f"topics without leaders after {timeout_s}s: {sorted(waiting)}")
        if waiting:
            time.sleep(0.1)
