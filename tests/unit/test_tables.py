"""Typed tables (issue 33; docs/decisions/typed-tables.md): the codecs round-trip their
values, read the rows of the release before, and every row a stage writes sits in one of the
tables it declares."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from sluicegate.admission.rows import text_fields
from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    CancelOn,
    Concurrency,
    Debounce,
    Idempotency,
    RateLimit,
    Singleton,
    Throttle,
    Workflow,
)
from sluicegate.engine.tables import (
    INTEGER,
    SIZED,
    Decimal,
    Fields,
    Joined,
    Many,
    TableSpec,
)
from sluicegate.engine.timers import DERIVED_TIMER_PREFIX, TIMER_PREFIX
from sluicegate.schemas.records import RunEventKind
from sluicegate.testing import TestDriver


@dataclass(frozen=True)
class Inner:
    n: int
    name: str


@dataclass(frozen=True)
class Row:
    a: int
    b: int | None
    flag: bool
    ratio: float
    text: str
    note: str | None
    data: bytes
    inner: Inner | None
    many: tuple[Inner, ...]


ROW = Fields(Row, nested={"inner": Fields(Inner), "many": Many(Fields(Inner))})

_int64 = st.integers(-(2**63), 2**63 - 1)
_inner = st.builds(Inner, _int64, st.text())


@given(st.builds(Row, _int64, _int64 | st.none(), st.booleans(),
                 st.floats(allow_nan=False), st.text(), st.text() | st.none(), st.binary(),
                 _inner | st.none(), st.lists(_inner, max_size=4).map(tuple)))
def test_a_struct_row_round_trips_through_its_bytes(row: Row) -> None:
    raw = ROW.encode(row)
    assert raw[:1] == b"\x01"
    assert ROW.decode(raw) == row


def test_a_struct_row_is_compact() -> None:
    @dataclass(frozen=True)
    class Deadlines:
        finish: int | None
        lease: int | None
        until: int | None

    # A version byte, three 8-byte integers and one byte of None bits.
    assert len(Fields(Deadlines).encode(Deadlines(1, None, 3))) == 1 + 24 + 1


def test_a_row_of_the_release_before_is_read_and_one_without_a_reader_is_refused() -> None:
    @dataclass(frozen=True)
    class Pair:
        count: int
        name: str

    codec = text_fields(Pair)
    assert codec.decode(b"12\x1fab") == Pair(12, "ab")
    assert codec.decode(codec.legacy_encode(Pair(7, "x"))) == Pair(7, "x")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a Pair row"):
        Fields(Pair).decode(b"12\x1fab")


def test_a_field_of_an_unknown_type_needs_a_codec() -> None:
    @dataclass(frozen=True)
    class Odd:
        items: list[int]

    with pytest.raises(TypeError, match=r"Odd\.items"):
        Fields(Odd)


_KEY_TEXT = st.text(alphabet=st.characters(min_codepoint=0x20, exclude_categories=("Cs",)))


@given(st.lists(st.tuples(_KEY_TEXT, st.text()), min_size=2, max_size=8))
def test_key_codecs_read_in_the_order_of_their_parts(keys: list[tuple[str, str]]) -> None:
    sized = sorted(keys, key=lambda k: SIZED.encode(k))
    assert [SIZED.decode(SIZED.encode(k)) for k in sized] == sized
    # A sized key groups by its first part: the rows of one first part are contiguous.
    firsts = [k[0] for k in sized]
    assert all(firsts.index(f) + firsts.count(f) - 1 == len(firsts) - 1 - firsts[::-1].index(f)
               for f in set(firsts))
    joined = Joined(Decimal(20), INTEGER)
    numbers = [(abs(hash(a)) % 10**6, len(b) - 3) for a, b in keys]
    assert sorted(numbers) == [joined.decode(raw) for raw in
                               sorted(joined.encode(n) for n in numbers)]


class Order(BaseModel):
    orderId: str
    tenant: str = "t"


class Deleted(BaseModel):
    orderId: str


# One workflow per control, each leaving something parked at the end of the scenario.
APP = App([
    Workflow(name="gated", payload=Order, idempotency=Idempotency(key="orderId"),
             concurrency=Concurrency(limit=1, key="tenant", fair_by="orderId"),
             cancel_on=[CancelOn(event="order.deleted", schema=Deleted,
                                 match="event.orderId == payload.orderId")]),
    Workflow(name="paced", payload=Order, throttle=Throttle(limit=1, period="1h", key="tenant")),
    Workflow(name="twice", payload=Order, throttle=[
        Throttle(limit=1, period="1h", key="tenant"), Throttle(limit=2, period="1h")]),
    Workflow(name="quiet", payload=Order, debounce=Debounce(key="orderId", period="1h")),
    Workflow(name="one", payload=Order, singleton=Singleton(key="tenant", mode="cancel")),
    Workflow(name="queued", payload=Order, singleton=Singleton(key="tenant", mode="queue")),
    Workflow(name="floored", payload=Order, concurrency=Concurrency(
        limit=2, key="tenant", fair_by="orderId", floor=1)),
    Workflow(name="rated", payload=Order, rate_limit=RateLimit(limit=1, period="1h")),
])


def _table_of(tables: tuple[TableSpec, ...], key: bytes) -> TableSpec | None:
    """The declared table a row belongs to: the one with the longest prefix of its key."""
    found = [t for t in tables if key.startswith(t.prefix)]
    return max(found, key=lambda t: len(t.prefix)) if found else None


def test_every_row_a_stage_writes_is_in_a_table_it_declares_and_decodes_there() -> None:
    with TestDriver(APP, Settings(partitions=2)) as driver:
        for n in range(6):
            for wf in ("gated", "paced", "twice", "quiet", "one", "rated", "queued",
                       "floored"):
                driver.start(wf, {"orderId": f"o{n % 3}", "tenant": f"t{n % 2}"})
        driver.start("gated", {"orderId": "later"}, at=driver.now_ms + 3_600_000)
        driver.event("order.deleted", {"orderId": "o1"})
        driver.commit()
        first = driver.admitted[0]
        driver.report(first.execution_id, RunEventKind.started)
        driver.commit()
        seen: set[str] = set()
        for name, state in driver.tasks[0].states.items():
            if state.store is None:
                continue
            stage = state.stage
            names = [t.name for t in stage.tables]
            assert len(names) == len(set(names)), f"{name} declares a table twice: {names}"
            for partition in range(2):
                store = driver.store(name, partition).store
                for key, value in store.items(b""):
                    if key.startswith((TIMER_PREFIX, DERIVED_TIMER_PREFIX)):
                        continue
                    table = _table_of(stage.tables, key)
                    assert table is not None, f"{name}: row {key!r} is in no table it declares"
                    table.value.decode(value)
                    if table.derived:
                        assert key.startswith(stage.derived)
                    seen.add(f"{name}.{table.name}")
        # The scenario reached the rows of every control.
        assert {"concurrency.holders", "concurrency.queue", "throttle.keys", "throttle.several",
                "defer.bursts", "singleton.holds", "ratelimit.windows", "runs.runs",
                "identity.spent", "identity.cancelOn.kept", "singleton.waiting",
                "concurrency.floor.lane_of"} <= seen, sorted(seen)
