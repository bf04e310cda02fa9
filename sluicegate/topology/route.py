"""The route of each workflow: which stages a start visits, in which order, keyed by what.

The route is computed from the declaration alone (a description, printable without
running anything); the runtime follows it. Each hop names the stage, the control it
applies, the budget its key lives in (the workflow, or a pool shared with other
workflows) and the key expression.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluicegate.declare import App, Control, Expression, Origin, Workflow, applies
from sluicegate.topology.keys import ControlKey

DEPLOYMENT_BUDGET = "deployment"
# The control of the hop that applies the deployment-wide concurrency cap.
DEPLOYMENT_CAP = "deployment cap"


@dataclass(frozen=True, slots=True)
class Hop:
    stage: str
    control: str
    # Starts of different workflows share a key's state only where `budget` says so.
    budget: str
    key: str | None
    # Which of the workflow's concurrency limits this hop applies (0 for other controls).
    index: int = 0
    # How it is keyed, when `key` alone does not say (several throttles judged together).
    keyed: str | None = None

    def applies_to(self, origin: Origin) -> bool:
        """Whether this hop judges a start of `origin` (seed 003's matrix; the deployment's
        cap is a concurrency limit)."""
        control = Control.concurrency if self.control == DEPLOYMENT_CAP else self.control
        return applies(control, origin)

    def describe(self) -> str:
        key = self.keyed or f"by {self.key if self.key else '(one key)'}"
        return f"{self.stage}[{self.control} {self.budget} {key}]"


@dataclass(frozen=True, slots=True)
class Route:
    workflow: str
    hops: tuple[Hop, ...]

    @property
    def passthrough(self) -> bool:
        """No control after identity: admitted straight away."""
        return len(self.hops) == 1

    def describe(self) -> str:
        parts = ["starts", *(h.describe() for h in self.hops), "admitted"]
        return f"{self.workflow}: " + " -> ".join(parts)


def _hop(control: Control, budget: str, key: str | None, keyed: str | None = None) -> Hop:
    stage = control.stage
    assert stage is not None
    # The control's name as a plain str, as the field says: the ledger rows carry it, and
    # the codec's fast path takes exact strs only (a Control member there sent every
    # such row to fastavro, ~15 µs each).
    return Hop(stage, control.value, budget, key, keyed=keyed)


def _identity_hop(wf: Workflow) -> Hop:
    idem = wf.idempotency
    key = idem.key if idem is not None else None
    # Without an expression the identity is the explicit id a caller may pass, or none.
    return _hop(Control.idempotency, wf.name, key if key else "explicit id")


def _concurrency_hops(wf: Workflow, deployment_cap: int) -> list[Hop]:
    # A workflow's own second limit gets a budget of its own, so its keys never meet the
    # first limit's (an unkeyed limit and a key whose text is empty would).
    hops = [
        Hop("concurrency", Control.concurrency.value,
            limit.shared_budget or (wf.name if index == 0 else f"{wf.name}#{index}"),
            limit.key, index)
        for index, limit in enumerate(wf.concurrency)
    ]
    # The narrower limit is taken first, so a start never holds a shared slot while it
    # waits for its own key's slot: keyed limits before unkeyed ones, own before shared.
    hops.sort(key=lambda h: (h.key is None, h.budget.startswith(("pool:", "key:"))))
    if deployment_cap:
        hops.append(Hop("concurrency", DEPLOYMENT_CAP, DEPLOYMENT_BUDGET, None, -1))
    return hops


def route_for(wf: Workflow, deployment_cap: int = 0) -> Route:
    hops = [_identity_hop(wf)]
    for control in (Control.rate_limit, Control.debounce, Control.batch, Control.singleton):
        option = getattr(wf, control.option)
        if option is not None:
            hops.append(_hop(control, wf.name, option.key))
    if len(wf.throttle) == 1:
        (throttle,) = wf.throttle
        hops.append(_hop(Control.throttle, throttle.shared_budget or wf.name, throttle.key))
    elif wf.throttle:
        # Several paces, judged together where all of the workflow's starts meet
        # (docs/decisions/several-throttles.md).
        keys = ", ".join(t.key if t.key else "(one key)" for t in wf.throttle)
        hops.append(_hop(Control.throttle, wf.name, None,
                         keyed=f"by (one key), pacing together by {keys}"))
    hops += _concurrency_hops(wf, deployment_cap)
    return Route(wf.name, tuple(hops))


def routes(app: App, deployment_cap: int = 0) -> list[Route]:
    return [route_for(wf, deployment_cap) for wf in app.workflows.values()]


def key_expression(wf: Workflow, hop: Hop) -> Expression | None:
    """The compiled key expression of a hop's control (None: one key for all)."""
    option: Any
    if hop.control == Control.idempotency or hop.control == DEPLOYMENT_CAP:
        return None
    if hop.control == Control.throttle:
        option = wf.throttle[0] if len(wf.throttle) == 1 else None
    elif hop.control == Control.concurrency:
        option = wf.concurrency[hop.index]
    else:
        option = getattr(wf, Control.of(hop.control).option)
    return option.key_expr if option is not None else None


def wraps_payload(wf: Workflow, hop: Hop) -> bool:
    """Whether a start this hop does not apply to is wrapped as a batch of one on its way
    past it (batch, or a debounce handing over every event), so that its run's payload
    has the workflow's shape: the later hops read their keys from the wrapped payload."""
    return hop.control == Control.batch.value or (
        hop.control == Control.debounce.value and wf.debounce is not None
        and wf.debounce.events is not None)


def hop_key(wf: Workflow, hop: Hop, payload: Any) -> str:
    """The Kafka key a start carries to this hop: its budget and its key's text."""
    expr = key_expression(wf, hop)
    return str(ControlKey(hop.budget, expr.text(payload) if expr is not None else ""))


def control_name(wf: Workflow, hop: Hop) -> str:
    """A hop's control as the ledger names it (`LedgerRecord.control`): the option as
    declared (`rateLimit`, `debounce`, `batch`, `singleton`, `throttle`, `idempotency`,
    `deployment cap`), followed by the pool it shares (`throttle pool:partner-api`). A
    concurrency limit is `concurrency`, `concurrency[i]` when the workflow declares two,
    followed by the budget it shares (`concurrency pool:openai`,
    `concurrency[1] scope:account`)."""
    if hop.control != "concurrency":
        shared = hop.budget not in (wf.name, DEPLOYMENT_BUDGET)
        return f"{hop.control} {hop.budget}" if shared else hop.control
    limit = wf.concurrency[hop.index]
    name = "concurrency" if len(wf.concurrency) == 1 else f"concurrency[{hop.index}]"
    if limit.pool is not None:
        return f"{name} pool:{limit.pool}"
    if limit.shared_budget is not None:
        return f"{name} scope:{limit.scope}"
    return name
