"""The settings a command or the inspect server runs with, and how long it waits for Kafka.

Settings come from the environment (`sluicegate.config`), with what the command line
gave on top: a bootstrap, a namespace, a state directory. Every process that talks to
Kafka checks the bootstrap's syntax and configures the codec as the workers do; a command
that must reach the broker waits for it at most `timeout_s` (docs/decisions/cli-errors.md).
"""

from __future__ import annotations

from sluicegate.config import Settings

# How long a command waits for the broker to answer before it gives up (`--timeout`).
DEFAULT_TIMEOUT_S = 3.0


def command_settings(bootstrap: str | None, namespace: str | None, *, offline: bool = False,
                     reach: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                     **more: object) -> Settings:
    """The settings, with `bootstrap`, `namespace` and any of `more` that is not None on
    top; unless `offline`, the bootstrap's syntax is checked and the process's codec is
    configured from them (with a schema registry: its framing, every schema registered),
    so that a command reads and writes records as the workers do. With `reach`, a broker at
    the bootstrap must answer within `timeout_s` (KafkaUnreachable)."""
    changes: dict[str, object] = {k: v for k, v in more.items() if v is not None}
    if bootstrap:
        changes["bootstrap"] = bootstrap
    if namespace:
        changes["namespace"] = namespace
    settings = Settings().with_(**changes)
    if not offline:
        from sluicegate.kafkautil import parse_bootstrap, require_broker
        from sluicegate.topology.framing import configure_codec

        parse_bootstrap(settings.bootstrap)
        if reach:
            require_broker(settings, timeout_s)
        configure_codec(settings)
    return settings
