"""Keys and names, once: how a start's keys and its execution id are made.

The client, the operator commands and the stages all build these, so they live here, below
all three, and importing them loads neither RocksDB nor a stage:

- `ControlKey`: a control's key as it travels and is stored, its budget (the workflow, or
  a pool shared with others) and the key's text, joined by `SEP`;
- `identity_key` / `identity_store_key`: the idempotency key a start is named by, and the
  Kafka key (and store key) of the identity stage's row for it;
- `plain_execution_id` / `execution_id_for`: the execution id of a fresh run, placed on
  the partition that decides it (docs/decisions/placed-execution-ids.md).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from sluicegate.declare import Workflow, applies
from sluicegate.schemas.murmur2 import python_partition_for
from sluicegate.schemas.native import speedups
from sluicegate.schemas.records import StartRequest

# The one separator of a composite key's parts (no key text a user writes contains it).
SEP = "\x1f"
SEP_BYTES = SEP.encode()


class ControlKey(NamedTuple):
    """A control's key: the budget its state lives in and the key's own text ('' for one
    key for the whole budget)."""

    budget: str
    text: str = ""

    def __str__(self) -> str:
        return f"{self.budget}{SEP}{self.text}"

    def encode(self) -> bytes:
        return str(self).encode()

    @classmethod
    def parse(cls, key: str | bytes) -> ControlKey:
        """A key as it travels (or a slot's key); its text is '' when it has none. A key
        is parsed several times on a start's way through a stage (its queue, its ledger
        rows, its slot): the last keys parsed are kept, so most of those are a lookup."""
        return _parse(key)


@functools.lru_cache(maxsize=65_536)
def _parse(key: str | bytes) -> ControlKey:
    raw = key.decode(errors="replace") if isinstance(key, bytes) else key
    budget, _, text = raw.partition(SEP)
    return ControlKey(budget, text)


def key_text(key: str | bytes) -> str:
    """A hop key (or a slot's key, or the Kafka key it travels under) as the ledger shows
    it: the key's own text, without the budget (docs/decisions/ledger-keys.md)."""
    return ControlKey.parse(key).text


# -- idempotency -----------------------------------------------------------------------


def identity_key(wf: Workflow, start: StartRequest, payload: Any) -> str | None:
    """The key that names this start's execution, or None when nothing names it.

    An explicit id wins on every origin (a `direct` start's retry-safe id, or an event's
    own id); the declared expression applies to event starts only (seed 003's matrix).
    """
    if start.idempotency_id is not None:
        return start.idempotency_id
    idem = wf.idempotency
    if idem is not None and idem.key_expr is not None and applies("idempotency", start.origin):
        try:
            return idem.key_expr.text(payload)
        except ValueError:
            return "null"
    return None


def identity_store_key(workflow: str, key: str) -> bytes:
    """Where the identity stage keeps an idempotency key (also its Kafka key)."""
    return ControlKey(workflow, key).encode()


# -- execution ids -----------------------------------------------------------------------

_EXECUTION_NS = uuid.UUID("6f1c2d8e-5b7a-4c1e-9a53-2f0e8d4b7c61")
_EXECUTION_SHA1 = hashlib.sha1(_EXECUTION_NS.bytes, usedforsecurity=False)


def python_uuid5_text(digest: bytes) -> str:
    # RFC 4122: version 5 in the high nibble of byte 6, the variant in byte 8.
    x = (digest[:6] + bytes(((digest[6] & 0x0F) | 0x50,)) + digest[7:8]
         + bytes(((digest[8] & 0x3F) | 0x80,)) + digest[9:16]).hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def python_placed_uuid_text(text: str, partitions: int, partition: int) -> str | None:
    if not 0 <= partition < partitions:
        raise ValueError(f"partition {partition} of {partitions} partitions")
    start = int(text[32:], 16)
    for n in range(0x10000):
        placed = f"{text[:32]}{(start + n) & 0xFFFF:04x}"
        if python_partition_for(placed.encode(), partitions) == partition:
            return placed
    return None


uuid5_text: Callable[[bytes], str] = python_uuid5_text
placed_uuid_text: Callable[[str, int, int], str | None] = python_placed_uuid_text
if speedups is not None:
    uuid5_text, placed_uuid_text = speedups.uuid5_text, speedups.placed_uuid_text


def plain_execution_id(workflow: str, request_id: str) -> str:
    """`str(uuid.uuid5(_EXECUTION_NS, f"{workflow}\\x1f{request_id}"))` without the UUID
    object: the execution id before it is placed (and as workers before placed ids made
    it)."""
    h = _EXECUTION_SHA1.copy()
    h.update(f"{workflow}{SEP}{request_id}".encode())
    return uuid5_text(h.digest())


def execution_id_for(workflow: str, request_id: str, partition: int, partitions: int) -> str:
    """The execution id of a fresh run, placed on the partition that decided it.

    Deterministic, so a replayed decision names the same execution: the version-5 UUID
    of `plain_execution_id`, its last 16 bits counted up (mod 2^16) to the first value
    whose text murmur2 puts on `partition`. The run's row then lives in the task that
    admits it when nothing moved it on (the passthrough), and is written there in the
    same step (docs/decisions/placed-execution-ids.md). The plain UUID when no value
    lands there, which takes tens of thousands of partitions. Made in C;
    tests/unit/test_codec_fast.py holds it to the Python here."""
    text = plain_execution_id(workflow, request_id)
    return placed_uuid_text(text, partitions, partition) or text
