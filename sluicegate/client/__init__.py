"""The Python SDK: `Client` for producers, `AsyncClient` its asyncio twin, `Engine` for engines."""

from sluicegate.client.aio import AsyncClient
from sluicegate.client.engine import Delivery, Engine, RecentRuns, RunsBegun
from sluicegate.client.errors import (
    BlockingCallerRefused,
    ClientError,
    DecisionTimeout,
    PayloadError,
    PayloadTooLarge,
    RateLimited,
    SingletonHeld,
    UnknownWorkflow,
)
from sluicegate.client.producer import Client, Handle

__all__ = [
    "AsyncClient",
    "BlockingCallerRefused",
    "Client",
    "ClientError",
    "DecisionTimeout",
    "Delivery",
    "Engine",
    "Handle",
    "PayloadError",
    "PayloadTooLarge",
    "RateLimited",
    "RecentRuns",
    "RunsBegun",
    "SingletonHeld",
    "UnknownWorkflow",
]
