"""The errors a caller of the SDK can get, each saying what happened and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluicegate.client.producer import Handle


class ClientError(Exception):
    pass


class UnknownWorkflow(ClientError, LookupError):
    pass


class PayloadError(ClientError, ValueError):
    """The payload does not validate against the workflow's schema; nothing was produced."""


class PayloadTooLarge(PayloadError):
    """The payload is over the largest a start can carry (`Settings.max_payload_bytes`): it
    could be taken, but its admitted start could not be written; nothing was produced."""


class BlockingCallerRefused(ClientError):
    pass


class DecisionTimeout(ClientError, TimeoutError):
    pass


class RateLimited(ClientError):
    """Over a rateLimit cap: this start will never run; retry after `retry_after_ms`."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.retry_after_ms = handle.retry_after_ms
        super().__init__(
            f"workflow {handle.workflow}: rate limited ({handle.reason}); "
            f"retry after {handle.retry_after_ms} ms")


class SingletonHeld(ClientError):
    """singleton `skip`: another run holds the key; `execution_id` is the incumbent."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.execution_id = handle.execution_id
        super().__init__(
            f"workflow {handle.workflow}: singleton held by run {handle.execution_id}")
