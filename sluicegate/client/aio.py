"""The asyncio twin of `Client`: the same requests, awaited instead of blocked on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from sluicegate.client.errors import DecisionTimeout
from sluicegate.client.producer import Client, Handle, _raise_synchronous_answer
from sluicegate.config import Settings
from sluicegate.declare import App, Origin
from sluicegate.schemas.records import RunRow


class AsyncClient:
    def __init__(self, bootstrap: str | None = None, *, app: App | str,
                 settings: Settings | None = None) -> None:
        self._client = Client(bootstrap, app=app, settings=settings)

    async def start(
        self,
        workflow: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        id: str | None = None,
        at: datetime | int | None = None,
        origin: str | Origin = "event",
        wait_decision: bool = False,
        wait: bool = False,
        timeout: float = 30.0,
    ) -> Handle:
        if wait:
            # Blocking for the run's end is the sync client's own loop, off the event loop.
            return await asyncio.to_thread(self._client.start, workflow, payload, id=id, at=at,
                                           origin=origin, wait=True, timeout=timeout)
        # Producing never blocks (librdkafka queues it); only the decision is awaited.
        handle = self._client.submit(workflow, payload, id=id, at=at, origin=origin,
                                     wait_decision=wait_decision)
        if wait_decision:
            await self.wait(handle, timeout)
            _raise_synchronous_answer(handle)
        return handle

    async def run(
        self,
        workflow: str,
        payload: BaseModel | Mapping[str, Any],
        *,
        id: str | None = None,
        origin: str | Origin = "event",
        timeout: float = 30.0,
    ) -> RunRow:
        """The asyncio twin of `Client.run`: the ended run's row in the runs table."""
        return await asyncio.to_thread(self._client.run, workflow, payload, id=id,
                                       origin=origin, timeout=timeout)

    async def wait(self, handle: Handle, timeout: float = 30.0) -> Handle:
        if handle.decided:
            return handle
        if handle._future is None:
            raise DecisionTimeout(f"start {handle.request_id} was sent without a reply channel")
        await asyncio.to_thread(self._client.flush, timeout)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(handle._future), timeout)
        except TimeoutError as exc:
            raise DecisionTimeout(
                f"no decision for start {handle.request_id} of {handle.workflow} within "
                f"{timeout}s") from exc
        handle._apply(reply)
        return handle

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
