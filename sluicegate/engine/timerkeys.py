"""Where a timer's row sits in a stage store: its key layout (engine.timers holds the
layout's description and the timers themselves)."""

from __future__ import annotations

import struct

TIMER_PREFIX = b"\x00T"
STATE_PREFIX = b"\x00S"
# The timers a stage derives from its other rows (`Stage.derived_timers`): an index of
# their own, never logged, made again at restore (docs/decisions/derived-rows.md).
DERIVED_TIMER_PREFIX = b"\x00t"

_DUE = struct.Struct(">Q")
_HEAD = len(TIMER_PREFIX) + _DUE.size
_MAX_DUE = 2**64 - 1


def check_due(due_ms: int) -> None:
    """A timer's due time must fit its key's 8 bytes."""
    if not 0 <= due_ms <= _MAX_DUE:
        raise ValueError(f"timer due time {due_ms} ms is outside 0..2**64-1 (epoch ms)")


def timer_key(due_ms: int, key: bytes, prefix: bytes = TIMER_PREFIX) -> bytes:
    # Big-endian unsigned, so byte order is due order and a scan from
    # the prefix visits timers earliest first (ties by key).
    check_due(due_ms)
    return prefix + _DUE.pack(due_ms) + key


def parse_timer_key(raw: bytes, prefix: bytes = TIMER_PREFIX) -> tuple[int, bytes]:
    if len(raw) < _HEAD or not raw.startswith(prefix):
        raise ValueError(f"{raw!r} is not a timer key (expected {prefix!r} + 8-byte due + key)")
    return _DUE.unpack_from(raw, len(prefix))[0], raw[_HEAD:]
