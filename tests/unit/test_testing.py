"""The test driver itself: it keys, hands over, fires timers, commits and restarts as the
worker does."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Debounce, Workflow
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import Outcome, RunEventKind, RunStatus
from sluicegate.testing import TestDriver
from sluicegate.topology.keys import identity_store_key


class Edit(BaseModel):
    rowId: str
    text: str = ""


DEBOUNCED = Workflow(name="edit", payload=Edit, debounce=Debounce(key="rowId", period="1m"))
ONE_AT_A_TIME = Workflow(name="one", payload=Edit, idempotency="rowId",
                         concurrency=Concurrency(limit=1))
APP = App([DEBOUNCED, ONE_AT_A_TIME])


def test_a_start_is_keyed_and_placed_as_the_sdk_and_identity_place_it() -> None:
    with TestDriver(APP, Settings(partitions=4)) as driver:
        started = driver.start("one", {"rowId": "r1"})
        assert started.key == identity_store_key("one", "r1")
        assert started.partition == partition_for(started.key, 4)
        (written,) = driver.sent(driver.topics.starts)
        assert (written.key, written.partition) == (started.key, started.partition)
        (admitted,) = driver.admitted
        assert admitted.execution_id == started.execution_id
        assert driver.ledger[-1].request_id == started.request_id == "req-1"


def test_an_admission_is_handed_over_to_the_runs_stage_and_never_written_to_its_topic(
) -> None:
    with TestDriver(APP) as driver:
        started = driver.start("one", {"rowId": "r1"})
        assert driver.sent(driver.topics.stage("runs")) == []
        assert driver.runs == [], "the runs table is written at commit"
        driver.commit()
        (row,) = driver.runs
        assert (row.execution_id, row.status) == (started.execution_id, RunStatus.admitted)


def test_time_fires_each_timer_at_its_due_time_in_order() -> None:
    with TestDriver(APP) as driver:
        t0 = driver.now_ms
        driver.start("edit", {"rowId": "a"})
        driver.advance(30_000)
        driver.start("edit", {"rowId": "b"})
        driver.advance(59_999)
        assert len(driver.admitted) == 1
        assert driver.ledger[-1].decided_at_ms == t0 + 60_000, "at its due time, not at the end"
        driver.advance(1)
        assert [a.admitted_at_ms - t0 for a in driver.admitted] == [60_000, 90_000]


def test_an_engine_report_ends_the_run_and_frees_its_slot() -> None:
    with TestDriver(APP) as driver:
        first = driver.start("one", {"rowId": "r1"})
        second = driver.start("one", {"rowId": "r2"})
        assert [a.execution_id for a in driver.admitted] == [first.execution_id]
        driver.report(first.execution_id, RunEventKind.completed)
        assert [a.execution_id for a in driver.admitted] == [first.execution_id,
                                                             second.execution_id]


def test_a_paused_workflow_waits_and_goes_on_when_unpaused() -> None:
    with TestDriver(APP) as driver:
        driver.pause("one", reason="deploy")
        started = driver.start("one", {"rowId": "r1"})
        assert (driver.ledger[-1].outcome, driver.ledger[-1].deferral) == (
            Outcome.queued, "pause")
        driver.unpause("one")
        assert [a.execution_id for a in driver.admitted] == [started.execution_id]


def test_a_restart_drops_what_was_not_committed_and_reads_its_input_again(
        tmp_path: Path) -> None:
    with TestDriver(APP, state_dir=tmp_path) as driver:
        driver.start("edit", {"rowId": "a", "text": "first"})
        driver.commit()
        driver.start("edit", {"rowId": "a", "text": "second"})
        assert [r.outcome for r in driver.ledger] == [Outcome.queued, Outcome.collapsed,
                                                      Outcome.queued]
        driver.restart()
        # The second start was read again by the new stages: its rows once, not twice.
        assert [r.outcome for r in driver.ledger] == [Outcome.queued, Outcome.collapsed,
                                                      Outcome.queued]
        driver.advance(60_000)
        (admitted,) = driver.admitted
        assert b"second" in admitted.payload
    assert tmp_path.exists(), "a directory given is the caller's"


def test_a_restart_with_other_declarations_builds_new_stages() -> None:
    with TestDriver(APP) as driver:
        driver.start("one", {"rowId": "r1"})
        driver.start("one", {"rowId": "r2"})
        driver.commit()
        raised = Workflow(name="one", payload=Edit, idempotency="rowId",
                          concurrency=Concurrency(limit=2))
        driver.restart(App([DEBOUNCED, raised]))
        assert len(driver.admitted) == 2


def test_over_several_partitions_each_key_is_judged_where_its_partition_is() -> None:
    with TestDriver(APP, Settings(partitions=3)) as driver:
        rows = [f"r{i}" for i in range(12)]
        for row in rows:
            driver.start("edit", {"rowId": row})
            driver.start("edit", {"rowId": row})
        assert all(driver.store("defer", p).changes for p in range(3)), (
            "each partition's task holds bursts of its keys")
        driver.advance(60_000)
        assert len(driver.admitted) == len(rows)
        queued = driver.sent(driver.topics.stage("defer"))
        assert {w.partition for w in queued} == {0, 1, 2}
        assert all(w.partition == partition_for(w.key or b"", 3) for w in queued)


def test_an_engine_report_on_a_run_never_admitted_says_to_name_its_workflow() -> None:
    with TestDriver(APP) as driver, pytest.raises(ValueError, match="pass its workflow"):
        driver.report("nobody", RunEventKind.completed)
