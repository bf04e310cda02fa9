"""The one step that picks a process's framing, and the subjects of the public topics.

`configure_codec(settings)` is called where a process starts using sluicegate (the CLI,
`Worker.start`, `Client`, `Engine`, `create_topics`): with a schema registry, registry
framing (sluicegate.schemas.registry), every record type registered under its full name
and each public topic's value type under `<topic>-value` too
(docs/decisions/schema-registry-subjects.md); without one, single-object framing.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.config import Settings
from sluicegate.schemas import codec
from sluicegate.schemas.codec import Codec
from sluicegate.schemas.records import (
    AdmittedStart,
    ControlRow,
    DeadLetter,
    EngineCommand,
    KeyLimit,
    LedgerRecord,
    Reply,
    RunEvent,
    RunRow,
    StartRequest,
)
from sluicegate.schemas.registry import (
    RegistryError,
    RegistryFraming,
    registry_client,
    registry_key,
)
from sluicegate.topology.topics import Topics

# The public topics carrying one record type, by `Topics` attribute: each gets the
# TopicNameStrategy subject `<topic>-value` too. Stage topics carry several types and
# are internal; changelogs and stores are not topics' values at all.
TOPIC_VALUE_TYPES: Mapping[str, type] = {
    "starts": StartRequest,
    "admitted": AdmittedStart,
    "run_events": RunEvent,
    "commands": EngineCommand,
    "replies": Reply,
    "ledger": LedgerRecord,
    "runs": RunRow,
    "control": ControlRow,
    "limits": KeyLimit,
    "deadletter": DeadLetter,
}



def topic_subjects(topics: Topics) -> dict[type, str]:
    """TopicNameStrategy: `<topic>-value` of each public topic, for its record type."""
    return {cls: f"{getattr(topics, attr)}-value" for attr, cls in TOPIC_VALUE_TYPES.items()}


def configure_codec(settings: Settings) -> Codec:
    """Make the process's codec frame records as `settings` say, and return it.

    With `schema_registry_url` set: registry framing (every schema registered, and the
    `<topic>-value` subjects of `settings.namespace`); without: single-object framing,
    the default. Idempotent. Refused (RegistryError) once a process frames for one
    registry and is asked for another or for none: schema ids mean something only in
    the registry that gave them, so one process writes for one registry.
    """
    current = codec.default()
    framing = current.framing
    if not settings.schema_registry_url:
        if isinstance(framing, RegistryFraming):
            raise RegistryError(
                f"this process already frames records for the schema registry at"
                f" {framing.source}; settings without SLUICEGATE_SCHEMA_REGISTRY_URL ask for"
                " none. Give every part of a process the same registry settings")
        return current
    key = registry_key(settings)
    if isinstance(framing, RegistryFraming):
        if framing.key != key:
            raise RegistryError(
                f"this process already frames records for the schema registry at"
                f" {framing.source}; these settings name {settings.schema_registry_url} (or"
                " other credentials). Give every part of a process the same registry settings")
    else:
        framing = RegistryFraming(registry_client(settings),
                                  source=settings.schema_registry_url, key=key)
        current = Codec(framing)
        codec.use(current)
    framing.register_subjects(topic_subjects(Topics(settings)))
    return current
