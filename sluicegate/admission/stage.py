"""An admission stage on the engine: a hop of the routes, with a name, whose context
names the namespace's topics."""

from __future__ import annotations

from typing import TypeAlias

from sluicegate.engine import stage as engine
from sluicegate.topology.topics import Topics

# What an admission stage sees of the engine: `ctx.topics` is the namespace's `Topics`,
# which every stage sends by.
StageContext: TypeAlias = engine.StageContext[Topics]


class AdmissionStage(engine.Stage):
    """A stage of admission. Its name is a route's hop (`topology.route`), its topic's
    (`sg.stage.<name>`) and its store's, and the `stage` of the ledger rows it writes; how
    the worker wires it is `admission.app.node`'s."""

    name: str
