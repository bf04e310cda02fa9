"""The declarations `bench.gate` runs: one workflow per scenario, one App per scenario.

A worker of one scenario loads only its workflow (`--app bench.gate_apps:conc50`), so each
measures what its own control costs (SPEC.md section 5: a workflow pays only for the
controls it declares). The Apps are built on first use (the module's `__getattr__`), so a
declaration an older source tree cannot load (`bench.gate --baseline-tree`) fails its own
scenario only.

Self-contained on purpose (pydantic and `sluicegate.declare` only, nothing from `bench`):
`bench.gate` copies this file beside a baseline tree's worker under another module name,
because that tree's own `bench` package has no such module.

How many keys each scenario's starts spread over is the input's business, not the
declaration's: `bench.gate` chooses it (`Scenario.keys`).
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    Idempotency,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Workflow,
)


class Job(BaseModel):
    id: str  # unique per start (idempotency: repeated on purpose)
    grp: str  # the scenario's key: one of `Scenario.keys` values
    prio: int = 0  # age-mode priority, seconds (-600..600)
    note: str = ""


class Jobs(BaseModel):
    items: list[Job]


def _one(name: str, **options: object) -> Callable[[], list[Workflow]]:
    def build() -> list[Workflow]:
        return [Workflow(name=name, payload=Jobs if "batch" in options else Job,
                         **options)]
    return build


# scenario -> its workflows (the workflow a scenario starts is named after the scenario).
BUILDERS: dict[str, Callable[[], list[Workflow]]] = {
    # No controls, no idempotency key: identity admits it on the spot.
    "passthrough": _one("passthrough"),
    # Every start's key was spent in the warm-up: each answers `existing`.
    "idem": _one("idem", idempotency=Idempotency(key="id")),
    # A limit no key reaches: every start admitted, its key's window row rewritten.
    "rl-admit": _one("rl-admit", rate_limit=RateLimit(limit=1000, period="1h", key="grp")),
    # One per hour per key, each key spent in the warm-up: every start dropped.
    "rl-drop": _one("rl-drop", rate_limit=RateLimit(limit=1, period="1h", key="grp")),
    # 1,000/s per key: the starts of a key that arrive in one fetch wait their turn
    # (a millisecond apart), the rest go through; every start is admitted.
    "throttle": _one("throttle", throttle=Throttle(limit=1000, period="1s", key="grp")),
    # The same per-key pace under a global one that never binds: what judging several
    # throttles together costs (every start meets on the workflow's one partition).
    "throttles": _one("throttles", throttle=[Throttle(limit=1000, period="1s", key="grp"),
                                             Throttle(limit=100_000, period="1s")]),
    # One start per key: each parks, then fires a second after it arrived.
    "debounce": _one("debounce", debounce=Debounce(key="grp", period="1s")),
    # One batch key: a run of ten items each ten starts (one admitted, nine collapsed).
    # The timeout never binds (bench.gate makes every phase a multiple of ten): it counts
    # from each item's arrival, so with a 1s timeout the items of a backlog older than
    # that run one at a time (seen: 391 of 902 runs of one item), and how many do depends
    # on the machine.
    "batch": _one("batch", batch=Batch(item=Job, max_size=10, timeout="10 minutes")),
    # One key per start: every start takes its key's hold, the engine's end gives it back.
    "singleton": _one("singleton", singleton=Singleton(key="id", mode="skip")),
    # Issue 15's gate: 50 per key (200 keys at 100,000 starts: 90% queued).
    "conc50": _one("conc50", concurrency=Concurrency(limit=50, key="grp")),
    # 1 per key (1,000 keys at 100,000 starts).
    "conc1": _one("conc1", concurrency=Concurrency(limit=1, key="grp")),
    # steps mode: the engine suspends each run at once (its slot goes back) and resumes
    # it (it waits for a slot again) before completing it.
    "steps": _one("steps", concurrency=Concurrency(limit=50, key="grp", mode="steps")),
    # The passthrough's workflow, paused and unpaused through the control table.
    "pause": _one("pause"),
    # conc50 with an age-mode priority: the queue is ordered by virtual age.
    "priority": _one("priority", concurrency=Concurrency(limit=50, key="grp"),
                     priority=Priority(expr="prio", mode="age")),
    # One key, 1,000 slots held (no engine): the queue behind it 1,000 to 100,000 deep.
    "depth": _one("depth", concurrency=Concurrency(limit=1000)),
}

_APPS: dict[str, App] = {}


def app_for(scenario: str) -> App:
    if scenario not in _APPS:
        _APPS[scenario] = App(BUILDERS[scenario]())
    return _APPS[scenario]


def __getattr__(name: str) -> App:
    # `load_app("bench.gate_apps:conc50")` reads the attribute `conc50`; `rl_admit` for
    # `rl-admit` (an attribute name has no '-').
    scenario = name.replace("_", "-")
    if scenario in BUILDERS:
        return app_for(scenario)
    raise AttributeError(name)
