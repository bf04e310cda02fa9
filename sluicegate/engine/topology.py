"""What the engine runs, described apart from running it.

A global table is read in full by every worker, outside its consumer group (Kafka
Streams' global tables); the engine catches up with it before it processes anything,
polls it from its loop, and tells the stages that read it of each row that changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class GlobalTable(Protocol):
    """A table every worker reads whole. Its rows are whatever its owner makes of its
    records: the engine hands them to the stages as they come and reads none itself."""

    @property
    def name(self) -> str: ...

    @property
    def rows(self) -> Mapping[Any, object]:
        """The rows as read so far: each is told to a task's stages once it is restored."""

    def catch_up(self) -> None:
        """Read to the table's end (at start, before anything is processed); a Kafka error
        or a TimeoutError while Kafka does not answer."""

    def poll(self) -> Sequence[object]:
        """Read what arrived since the last call; the rows that changed."""

    def close(self) -> None: ...
