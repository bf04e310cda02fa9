"""The controls, one enum for each of them under all its names.

A control is declared as a `Workflow` field (`rate_limit=RateLimit(...)`: its `option`),
named in the ledger, the docs and the route by its value (`rateLimit`), and applied by a
stage whose topic is named after it (`sg.stage.ratelimit`: its `stage`). The order of the
members is the order a start meets them (SPEC.md section 3).
"""

from __future__ import annotations

from enum import StrEnum


class Control(StrEnum):
    idempotency = "idempotency"
    rate_limit = "rateLimit"
    debounce = "debounce"
    batch = "batch"
    singleton = "singleton"
    throttle = "throttle"
    concurrency = "concurrency"
    priority = "priority"

    @property
    def option(self) -> str:
        """The `Workflow` field that declares it."""
        return self.name

    @property
    def stage(self) -> str | None:
        """The stage that applies it (None: priority orders every queue, it has none)."""
        return _STAGES[self]

    @classmethod
    def of(cls, name: str) -> Control:
        """The control named `name` as declarations name it: the declared name
        (`rateLimit`) or the option (`rate_limit`). A stage's name is not a control's (one
        stage applies both debounce and batch), so `ratelimit` is refused like a typo."""
        if name in cls._value2member_map_:
            return cls(name)
        if name in cls.__members__:
            return cls[name]
        raise ValueError(f"unknown control {name!r}; expected one of "
                         f"{', '.join(c.value for c in cls)}")


_STAGES: dict[Control, str | None] = {
    Control.idempotency: "identity",
    Control.rate_limit: "ratelimit",
    Control.debounce: "defer",
    Control.batch: "defer",
    Control.singleton: "singleton",
    Control.throttle: "throttle",
    Control.concurrency: "concurrency",
    Control.priority: None,
}
