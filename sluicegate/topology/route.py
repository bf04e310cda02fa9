"""The route of each workflow: which stages a start visits, in which order, keyed by what.

The route is computed from the declaration alone (a description, printable without
running anything); the runtime follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.declare import App, Workflow


@dataclass(frozen=True, slots=True)
class Hop:
    stage: str
    control: str
    # Starts of different workflows share state only where `scope` says so (a pool).
    scope: str
    key: str | None

    def describe(self) -> str:
        key = self.key if self.key is not None else "(one key)"
        return f"{self.stage}[{self.control} {self.scope} by {key}]"


@dataclass(frozen=True, slots=True)
class Route:
    workflow: str
    hops: tuple[Hop, ...]

    @property
    def passthrough(self) -> bool:
        """No control after identity: admitted straight away."""
        return all(h.stage == "identity" for h in self.hops)

    def describe(self) -> str:
        parts = ["starts", *(h.describe() for h in self.hops), "admitted"]
        return f"{self.workflow}: " + " -> ".join(parts)


def _identity_hop(wf: Workflow) -> Hop:
    idem = wf.idempotency
    key = idem.key if idem is not None else None
    # Without an expression the identity is the explicit id a caller may pass, or none.
    return Hop("identity", "idempotency", wf.name, key if key else "explicit id")


def _concurrency_hops(wf: Workflow, deployment_cap: int) -> list[Hop]:
    hops = []
    for limit in wf.concurrency:
        scope = limit.pool or (f"key:{limit.key}" if limit.scope != "fn" else wf.name)
        hops.append(Hop("concurrency", "concurrency", scope, limit.key))
    # The narrower limit is taken first, so a start never holds a shared slot while it
    # waits for its own key's slot (keyed limits before unkeyed ones).
    hops.sort(key=lambda h: h.key is None)
    if deployment_cap:
        hops.append(Hop("concurrency", "deployment cap", "deployment", None))
    return hops


def route_for(wf: Workflow, deployment_cap: int = 0) -> Route:
    hops = [_identity_hop(wf)]
    if wf.rate_limit is not None:
        hops.append(Hop("ratelimit", "rateLimit", wf.name, wf.rate_limit.key))
    if wf.debounce is not None:
        hops.append(Hop("defer", "debounce", wf.name, wf.debounce.key))
    if wf.batch is not None:
        hops.append(Hop("defer", "batch", wf.name, wf.batch.key))
    if wf.singleton is not None:
        hops.append(Hop("singleton", "singleton", wf.name, wf.singleton.key))
    if wf.throttle is not None:
        hops.append(Hop("throttle", "throttle", wf.name, wf.throttle.key))
    hops += _concurrency_hops(wf, deployment_cap)
    return Route(wf.name, tuple(hops))


def routes(app: App, deployment_cap: int = 0) -> list[Route]:
    return [route_for(wf, deployment_cap) for wf in app.workflows.values()]
