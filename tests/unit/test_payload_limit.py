"""The largest payload a start can carry is derived from the producers' message.max.bytes,
and the SDK refuses a larger one before anything is produced: its admitted start could not
be written (the worker would reject it)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from sluicegate.client import PayloadTooLarge
from sluicegate.client.producer import StartBuilder
from sluicegate.config import PAYLOAD_RESERVE_BYTES, Settings
from sluicegate.declare import App, Workflow
from sluicegate.schemas import codec


class Doc(BaseModel):
    text: str


def _builder(**kafka: str) -> StartBuilder:
    settings = Settings(kafka=dict(kafka), encryption_keys="")
    return StartBuilder(App([Workflow(name="doc", payload=Doc)], settings=settings), settings)


def _text_for(payload_bytes: int) -> str:
    return "x" * (payload_bytes - len(codec.dump_payload({"text": ""})))


def test_the_limit_is_message_max_bytes_less_the_reserve() -> None:
    assert Settings(kafka={}).max_payload_bytes == 1_000_000 - PAYLOAD_RESERVE_BYTES
    assert Settings(kafka={"message.max.bytes": "5000000"}).max_payload_bytes == (
        5_000_000 - PAYLOAD_RESERVE_BYTES)


def test_a_payload_at_the_limit_is_taken_and_one_byte_more_is_refused_with_the_numbers(
) -> None:
    builder = _builder()
    limit = Settings(kafka={}).max_payload_bytes
    start, _ = builder.build("doc", {"text": _text_for(limit)})
    assert len(start.payload) == limit
    with pytest.raises(PayloadTooLarge) as refused:
        builder.build("doc", {"text": _text_for(limit + 1)})
    message = str(refused.value)
    assert "workflow doc" in message
    assert f"{limit + 1:,} bytes" in message and f"{limit:,}-byte limit" in message


def test_a_larger_message_max_bytes_takes_larger_payloads() -> None:
    builder = _builder(**{"message.max.bytes": "3000000"})
    start, _ = builder.build("doc", {"text": _text_for(2_000_000)})
    assert len(start.payload) == 2_000_000
