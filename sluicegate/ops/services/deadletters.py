"""The dead letters: the records sluicegate could not handle (`sg.deadletter`), with their
reasons. `recent` gives the newest for the console (`GET /inspect/deadletters`);
`DeadLetterCount` counts them all for `/metrics`."""

from __future__ import annotations

import contextlib
from typing import Any

from sluicegate.config import Settings
from sluicegate.ops.services.formatting import iso
from sluicegate.ops.services.readers import TableReader, Tail
from sluicegate.ops.services.runs import payload_text
from sluicegate.schemas import codec
from sluicegate.schemas.records import DeadLetter, StartRequest
from sluicegate.topology.admin import TopologyError
from sluicegate.topology.topics import Topics


def describe(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as the console shows it; a start request's workflow and request id
    when the record is one."""
    doc: dict[str, Any] = {
        "at": iso(letter.at_ms), "at_ms": letter.at_ms, "reason": letter.reason,
        "stage": letter.stage,
        "source": f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}",
        "key": None if letter.key is None else letter.key.decode("utf-8", "replace"),
        "workflow": None, "request_id": None, "payload": None,
        "bytes": len(letter.value or b""),
    }
    if letter.value is not None:
        try:
            start = codec.decode(StartRequest, letter.value)
        except codec.DecodeError:
            return doc
        doc.update(workflow=start.workflow, request_id=start.request_id,
                   payload=payload_text(start.payload))
    return doc


def recent(settings: Settings, limit: int = 50, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """At most `limit` of the newest dead letters (the last `limit` of each partition,
    merged by time), newest first; none when the topic is not there."""
    try:
        tail = Tail(settings, Topics(settings).deadletter,
                    f"{settings.namespace}deadletter-reader", back=limit, timeout_s=timeout_s)
    except TopologyError:
        return []
    with tail:
        letters: list[DeadLetter] = []
        for msg in tail.to_the_ends(timeout_s):
            value = msg.value()
            if value is not None:
                with contextlib.suppress(codec.DecodeError):
                    letters.append(codec.decode(DeadLetter, value))
    letters.sort(key=lambda d: d.at_ms, reverse=True)
    return [describe(d) for d in letters[:limit]]


class DeadLetterCount:
    """The number of dead letters written so far: the dead-letter topic's records counted
    from its beginning, then only the new ones at each call.

    None until the first count has reached the end of every partition: a counter exported
    half-way through a long topic, then grown to its whole, would read as dead letters
    arriving (each restart of the server would fire the alert)."""

    def __init__(self, settings: Settings) -> None:
        self.count = 0
        self.caught_up = False
        self._reader = TableReader(settings, Topics(settings).deadletter,
                                   f"{settings.namespace}metrics-deadletters", self._counted)

    def _counted(self, _key: bytes | None, _value: bytes | None) -> None:
        self.count += 1

    def __call__(self, timeout_s: float = 5.0) -> int | None:
        behind = self._reader.read_on(timeout_s)
        self.caught_up = self.caught_up or not behind
        return self.count if self.caught_up else None

    def close(self) -> None:
        self._reader.close()
