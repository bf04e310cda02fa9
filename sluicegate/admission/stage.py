"""An admission stage on the engine: a hop of the routes, with a name."""

from __future__ import annotations

from sluicegate.engine.stage import Stage


class AdmissionStage(Stage):
    """A stage of admission. Its name is a route's hop (`topology.route`), its topic's
    (`sg.stage.<name>`) and its store's, and the `stage` of the ledger rows it writes; how
    the worker wires it is `admission.app.node`'s."""

    name: str
