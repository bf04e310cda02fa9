"""The admission worker: the engine's worker, running the stages of an App's declarations."""

from __future__ import annotations

from sluicegate.admission.app import build_pipeline
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine import runtime
from sluicegate.engine.clock import Clock


class Worker(runtime.Worker):
    @classmethod
    def for_app(cls, app: App, settings: Settings, clock: Clock | None = None,
                leave_on_stop: bool = False) -> Worker:
        """A worker running every stage for `app`'s declarations."""
        return cls(build_pipeline(app, settings).topology, settings, clock=clock,
                   leave_on_stop=leave_on_stop)
