"""The payload sluicegate starts an onFailure workflow with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class FailureReport(BaseModel):
    """Why a run did not deliver. `reason` says which way it failed: the engine reported a
    failure with retries spent, `timeouts.finish`, `timeouts.start`, or the workflow was
    removed from the declarations while starts of it were queued. `run_id` and
    `execution_id` are None when no run ever existed (the last two). `failed_at` is
    milliseconds since the epoch."""

    workflow: str
    payload: Any
    error_tag: str | None = None
    error_message: str | None = None
    run_id: str | None = None
    execution_id: str | None = None
    reason: str
    failed_at: int
