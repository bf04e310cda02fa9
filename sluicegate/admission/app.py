"""What a worker runs for a set of declarations: every stage, the router between them, the
control table they all consult, and how each stage is wired (the engine's `Topology`)."""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.admission.control import CONTROL_TABLE, ControlTable
from sluicegate.admission.decisions import dead_letter
from sluicegate.admission.limits import LIMITS_TABLE, KeyLimits, LimitsTable, declares_per_key
from sluicegate.admission.routing import Router
from sluicegate.admission.stage import AdmissionStage
from sluicegate.admission.stages.cancelon import CancelOnStage
from sluicegate.admission.stages.concurrency import ConcurrencyStage
from sluicegate.admission.stages.defer import DeferStage
from sluicegate.admission.stages.identity import IdentityStage
from sluicegate.admission.stages.pause import PauseStage
from sluicegate.admission.stages.ratelimit import RateLimitStage
from sluicegate.admission.stages.runs import RUN_ROWS, RunsStage
from sluicegate.admission.stages.singleton import SingletonStage
from sluicegate.admission.stages.throttle import ThrottleStage
from sluicegate.config import Settings
from sluicegate.declare import App
from sluicegate.engine.topology import GlobalTable, Node, StartupStep, Table, Topology
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.registry import RegistryError
from sluicegate.topology.admin import require_topics
from sluicegate.topology.framing import configure_codec
from sluicegate.topology.topics import Topics


@dataclass(slots=True)
class Pipeline:
    """What the worker runs, and the router its stages share (the test driver sends starts
    on through it)."""

    topology: Topology
    router: Router


def build_pipeline(app: App, settings: Settings, control: ControlTable | None = None,
                   limits: KeyLimits | None = None) -> Pipeline:
    """Every stage for `app`, sharing one router and one control table: the worker's, read
    from Kafka, unless `control` is given (the test driver's, set by the test). The limits
    table likewise, read only when a limit declares `per_key`."""
    if control is None:
        control = ControlTable(settings)
    tables: tuple[GlobalTable, ...] = (control,)
    if declares_per_key(app):
        if limits is None:
            limits = LimitsTable(settings)
        tables += (limits,)
    else:
        limits = None
    topics = Topics(settings)
    router = Router(app, settings.deployment_cap, control, limits)
    stages: list[AdmissionStage] = [
        IdentityStage(app, settings.partitions, router, settings.max_payload_bytes),
        PauseStage(app, settings.partitions, router),
        DeferStage(app, router, settings.max_payload_bytes),
        SingletonStage(router),
        ConcurrencyStage(app, router, settings.deployment_cap, settings.partitions),
        RateLimitStage(app, router),
        ThrottleStage(app, router),
        RunsStage(app, router),
        CancelOnStage(app),
    ]
    topology = Topology(
        topics.group, tuple(node(stage, topics) for stage in stages),
        partitioner=partition_for, dead_letter=dead_letter, topics=topics,
        global_tables=tables,
        startup=(StartupStep("check the topics", lambda: require_topics(settings, 5.0)),
                 StartupStep("configure the codec", lambda: configure_codec(settings))),
        # A registry that does not answer is no fault of the record being decoded.
        service_errors=(RegistryError,))
    return Pipeline(topology, router)


def node(stage: AdmissionStage, topics: Topics) -> Node:
    """How a worker wires `stage`: each stage reads its own topic (`sg.stage.<name>`), where
    the router sends it starts and releases, and keeps a store logged to its changelog;
    these read more, or hear of the control table, or publish a table."""
    own, changelog = topics.stage(stage.name), topics.changelog(stage.name)
    match stage:
        case IdentityStage():
            # The start requests as producers key them, and the starts re-keyed by their
            # idempotency key.
            return Node(stage.name, stage, (topics.starts, own), changelog,
                        handed_over_in_order=(own,))
        case PauseStage():
            return Node(stage.name, stage, (own,), changelog, reads=(CONTROL_TABLE,),
                        handed_over_in_order=(own,))
        case ConcurrencyStage() | ThrottleStage():
            # A limit raised by an operator's override (the control table,
            # admission/overrides.py) or for a key in the limits table admits the starts
            # waiting for it at once.
            return Node(stage.name, stage, (own,), changelog,
                        reads=(CONTROL_TABLE, LIMITS_TABLE), handed_over_in_order=(own,))
        case RunsStage():
            return Node(
                stage.name, stage, (own, topics.run_events), changelog,
                # The runs table is this store's run rows: sg.runs is their log, so a row
                # is written to Kafka once, and the store is restored from it.
                tables=(Table("runs", RUN_ROWS, topics.runs),),
                # One admitted start per run (a resume follows its run's own report), so
                # no admission's order against another matters.
                handed_over=(own,))
        case CancelOnStage():
            # The declared events, the sweeps fanned out to every partition, and the runs
            # table; nothing at all when no workflow declares cancelOn.
            inputs = (*(topics.event(e) for e in stage.events), own, topics.runs)
            return Node(stage.name, stage, inputs if stage.events else (), changelog)
    # A control: what reaches it in order is what it decides in order.
    return Node(stage.name, stage, (own,), changelog, handed_over_in_order=(own,))
