"""The C extension (`_speedups.c`: the codec's Avro walker, murmur2, execution ids) when it
is built and not turned off, else None: every caller then takes its Python reference,
which does the same work at several times the CPU (docs/decisions/optional-extension.md).

`SLUICEGATE_NO_SPEEDUPS=1` turns it off in a build that has it, so one install can run
the pure-Python path, as a machine that installed without a C compiler does."""

from __future__ import annotations

import os
from types import ModuleType

TURN_OFF = "SLUICEGATE_NO_SPEEDUPS"


def _load() -> tuple[ModuleType | None, str | None]:
    if os.environ.get(TURN_OFF, "") not in ("", "0"):
        return None, f"turned off ({TURN_OFF} is set)"
    try:
        from sluicegate.schemas import _speedups
    except ImportError:
        return None, "not built (installed without a C compiler?)"
    return _speedups, None


speedups, missing_because = _load()
"""The extension module, or None and why it is not in use."""
