"""Where a start lands: the Kafka key a start request is produced under on `sg.starts`.

The identity stage reads a start on the partition its key hashes to, decides it there and
places its execution id there (docs/decisions/placed-execution-ids.md). Keyed by the key
its first control keys it by, identity, that control and the run's row are one task, and
the start crosses no topic. The rule, per start:

1. it names an idempotency key (`identity_key`): that key's store key, since identity
   keeps its spent keys by it; the first control is then one hop away unless its key is
   the same bytes;
2. else the key of the first hop that applies to its origin, the exact bytes the worker
   keys that hop's record with (`hop_key`), when that control is keyed and its key can be
   read from the request's payload;
3. else its request id (a passthrough, a control with one key for the whole workflow, a
   key expression that fails on this payload, a payload rewritten before the first key is
   read).

Any key is correct: identity re-keys by the idempotency key where it needs to, and every
later hop by its own key. The rule only saves hops. The SDK (`StartBuilder`) and the
worker (the starts it asks for itself) both key by `Landing.key`.
docs/decisions/starts-land-where-decided.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from sluicegate.declare import App, Origin, Workflow
from sluicegate.schemas.records import StartRequest
from sluicegate.topology.keys import identity_key, identity_store_key
from sluicegate.topology.route import (
    Hop,
    Route,
    control_name,
    hop_key,
    key_expression,
    route_for,
    wraps_payload,
)


def first_hop(wf: Workflow, route: Route, origin: Origin) -> tuple[Hop | None, str]:
    """The hop a start of `origin` without an idempotency key lands by (None: by request
    id), and why, in words."""
    for hop in route.hops[1:]:
        if not hop.applies_to(origin):
            if wraps_payload(wf, hop):
                return None, (f"its payload is wrapped as a batch of one ({hop.control} does "
                              "not apply) before the next control reads its key")
            continue
        expr = key_expression(wf, hop)
        if expr is None or expr.is_constant:
            return None, (f"{control_name(wf, hop)} has one key for all its starts: by "
                          "request id, identity's work is spread over every partition")
        return hop, f"{hop.control}'s key"
    return None, "no control after identity: admitted where identity decides it"


@dataclass(frozen=True, slots=True)
class Landing:
    """Where one workflow's starts land, compiled from its route."""

    workflow: Workflow
    route: Route
    # Per origin, the hop a start without an idempotency key is keyed by (None: its
    # request id).
    hops: Mapping[Origin, Hop | None]

    @classmethod
    def of(cls, wf: Workflow, route: Route) -> Landing:
        return cls(wf, route, {origin: first_hop(wf, route, origin)[0] for origin in Origin})

    def key(self, start: StartRequest, payload: Any) -> bytes:
        """The Kafka key of `start` on `sg.starts` (`payload`: its payload as JSON data)."""
        wf = self.workflow
        ident = identity_key(wf, start, payload)
        if ident is not None:
            return identity_store_key(wf.name, ident)
        hop = self.hops[start.origin]
        if hop is None:
            return start.request_id.encode()
        try:
            return hop_key(wf, hop, payload).encode()
        except ValueError:
            # The worker keys the hop by the text null; the start is spread as before.
            return start.request_id.encode()


class Landings:
    """Every declared workflow's `Landing`."""

    def __init__(self, app: App, deployment_cap: int = 0) -> None:
        self._by_workflow = {
            wf.name: Landing.of(wf, route_for(wf, deployment_cap))
            for wf in app.workflows.values()
        }

    def get(self, workflow: str) -> Landing | None:
        return self._by_workflow.get(workflow)

    def key(self, start: StartRequest, payload: Any) -> bytes:
        """`Landing.key` of the start's workflow; its request id for an undeclared one."""
        landing = self._by_workflow.get(start.workflow)
        return landing.key(start, payload) if landing is not None else start.request_id.encode()


# -- in words, for `topology show` ------------------------------------------------------------


def _same_key(wf: Workflow, a: Hop, b: Hop) -> bool:
    """Whether two hops key every start by the same bytes (so on the same partition)."""
    ea, eb = key_expression(wf, a), key_expression(wf, b)
    return a.budget == b.budget and (ea.canonical if ea else "") == (eb.canonical if eb else "")


def _keyed(wf: Workflow, hop: Hop) -> str:
    expr = key_expression(wf, hop)
    if expr is None or expr.is_constant:
        return f"{control_name(wf, hop)} (one key for all its starts)"
    return f"{control_name(wf, hop)}'s key ({expr.source})"


def explain(landing: Landing) -> list[str]:
    """Where the workflow's starts land and why, then which hops remain and why: one line
    each, for an `event` start (then other origins where they land elsewhere)."""
    wf, route = landing.workflow, landing.route
    idem = wf.idempotency.key_expr if wf.idempotency is not None else None
    hop, why = first_hop(wf, route, Origin.event)
    events = [h for h in route.hops[1:] if h.applies_to(Origin.event)]

    def lands_with(other: Hop) -> bool:
        """Whether `other` is keyed by the very key the starts land by."""
        if idem is None:
            return hop is not None and _same_key(wf, hop, other)
        expr = key_expression(wf, other)
        return other.budget == wf.name and expr is not None and expr.canonical == idem.canonical

    lines: list[str] = []
    if idem is not None:
        lines.append(f"lands by the idempotency key ({idem.source}): identity keeps its spent "
                     "keys by it")
        if hop is not None:
            lines.append(f"no hop to {control_name(wf, hop)}: it is keyed by the same key"
                         if lands_with(hop) else f"one hop: the idempotency key and "
                         f"{control_name(wf, hop)}'s key differ")
        elif events:
            lines.append(f"one hop to {_keyed(wf, events[0])}")
    elif hop is not None:
        lines.append(f"lands by {_keyed(wf, hop)}: identity, {control_name(wf, hop)} and the "
                     "run's row are decided in one task")
    else:
        lines.append(f"lands by request id: {why}")
        if events:
            lines.append(f"one hop to {_keyed(wf, events[0])}")
    for before, after in pairwise(events):
        lines.append(f"no hop to {control_name(wf, after)}: keyed as "
                     f"{control_name(wf, before)}" if _same_key(wf, before, after) else
                     f"one hop to {_keyed(wf, after)}: keyed unlike "
                     f"{control_name(wf, before)}")
    if events and not lands_with(events[-1]):
        lines.append("one hop to the run's row: its execution id is placed where identity "
                     f"decides, and {control_name(wf, events[-1])} admits elsewhere")
    if hop is not None and idem is None:
        lines.append(f"a start with an explicit id lands by that id: one hop to "
                     f"{control_name(wf, hop)}")
    for origin in Origin:
        other, other_why = first_hop(wf, route, origin)
        if origin is Origin.event or other == hop:
            continue
        where = f"by {_keyed(wf, other)}" if other is not None else f"by request id: {other_why}"
        lines.append(f"{origin.value} starts land {where}")
    return lines
