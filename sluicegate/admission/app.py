"""What a worker runs for a set of declarations: every stage, the router between them,
and the control table they all consult."""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.admission.control import ControlTable
from sluicegate.admission.routing import Router
from sluicegate.admission.stages.cancelon import CancelOnStage
from sluicegate.admission.stages.concurrency import ConcurrencyStage
from sluicegate.admission.stages.defer import DeferStage
from sluicegate.admission.stages.identity import IdentityStage
from sluicegate.admission.stages.pause import PauseStage
from sluicegate.admission.stages.ratelimit import RateLimitStage
from sluicegate.admission.stages.runs import RunsStage
from sluicegate.admission.stages.singleton import SingletonStage
from sluicegate.admission.stages.throttle import ThrottleStage
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.stage import Stage


@dataclass(slots=True)
class Pipeline:
    stages: list[Stage]
    router: Router
    control: ControlTable


def build_pipeline(app: App, settings: Settings, control: ControlTable | None = None) -> Pipeline:
    """Every stage for `app`, sharing one router and one control table: the worker's, read
    from Kafka, unless `control` is given (the test driver's, set by the test)."""
    if control is None:
        control = ControlTable(settings)
    router = Router(app, settings.deployment_cap, control)
    stages: list[Stage] = [
        IdentityStage(app, settings.partitions, router, settings.max_payload_bytes),
        PauseStage(app, settings.partitions, router),
        DeferStage(app, router, settings.max_payload_bytes),
        SingletonStage(router),
        ConcurrencyStage(app, router, settings.deployment_cap),
        RateLimitStage(app, router),
        ThrottleStage(app, router),
        RunsStage(app, router),
        CancelOnStage(app),
    ]
    return Pipeline(stages, router, control)
