"""Which stages a worker runs for a set of declarations."""

from __future__ import annotations

from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.streams.stage import Stage
from sluicegate.streams.stages.identity import IdentityStage


def build_stages(app: App, settings: Settings) -> list[Stage]:
    return [IdentityStage(app, settings.partitions)]
