"""The test driver itself: it keys, hands over, fires timers, commits and restarts as the
worker does; and, for a long run, runs some stages and keeps some topics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from sluicegate.client.producer import StartBuilder
from sluicegate.config import Settings
from sluicegate.declare import App, Concurrency, Debounce, Workflow
from sluicegate.engine.stage import InputRecord
from sluicegate.schemas import codec
from sluicegate.schemas.murmur2 import partition_for
from sluicegate.schemas.records import AdmittedStart, Outcome, RunEventKind, RunStatus
from sluicegate.testing import TestDriver
from sluicegate.topology.keys import identity_store_key
from sluicegate.topology.topics import Topics


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


def _one_ends_and_the_next_goes(driver: TestDriver) -> None:
    first = driver.start("one", {"rowId": "r1"})
    driver.start("one", {"rowId": "r2"})
    driver.report(first.execution_id, RunEventKind.completed, workflow="one")
    driver.commit()
    driver.start("one", {"rowId": "r3"})
    driver.restart()  # what r3 led to is dropped, and r3 read again


def test_a_driver_keeping_some_topics_counts_the_others_as_one_keeping_all_lists_them(
) -> None:
    topics = Topics(Settings(partitions=1))
    with TestDriver(APP) as full, TestDriver(APP, keep=(topics.admitted,)) as lean:
        for driver in (full, lean):
            _one_ends_and_the_next_goes(driver)
        assert lean.admitted == full.admitted
        for topic in {w.topic for w in full.sent()}:
            assert lean.count(topic) == full.count(topic) == len(full.sent(topic)), topic
        with pytest.raises(ValueError, match="not kept"):
            lean.ledger  # noqa: B018 - the property raises
        assert [w.topic for w in lean.sent()] == [topics.admitted] * 2


def test_take_reads_a_topic_from_where_the_last_take_left_off() -> None:
    with TestDriver(APP) as driver:
        first = driver.start("one", {"rowId": "r1"})
        second = driver.start("one", {"rowId": "r2"})
        admitted = driver.topics.admitted
        assert [codec.decode(AdmittedStart, w.value).execution_id for w in driver.take(admitted)
                ] == [first.execution_id]
        assert driver.take(admitted) == []
        driver.report(first.execution_id, RunEventKind.completed)
        assert [codec.decode(AdmittedStart, w.value).execution_id for w in driver.take(admitted)
                ] == [second.execution_id]
        assert len(driver.sent(admitted)) == 2


def test_a_driver_of_some_stages_writes_what_is_sent_to_the_others_unprocessed() -> None:
    with TestDriver(APP, stages=("identity", "runs")) as driver:
        driver.start("one", {"rowId": "r1"})
        assert len(driver.sent(driver.topics.stage("concurrency"))) == 1
        assert driver.admitted == [], "no concurrency stage let it through"
    with pytest.raises(ValueError, match="no stage concurency"):
        TestDriver(APP, stages=("identity", "concurency"))


def test_process_gives_a_stage_records_as_read_from_its_input_written_nowhere() -> None:
    with TestDriver(APP) as driver:
        request, key = StartBuilder(APP, driver.settings).build("one", {"rowId": "r1"})
        driver.process("identity", [InputRecord(driver.topics.starts, 0, 0, key,
                                                codec.encode(request), driver.now_ms)])
        assert [row.request_id for row in driver.ledger] == [request.request_id]
        assert len(driver.admitted) == 1
        assert driver.sent(driver.topics.starts) == []


def test_in_a_cycle_the_timers_due_fire_at_its_end_and_then_it_commits() -> None:
    with TestDriver(APP) as driver:
        driver.start("edit", {"rowId": "a"})  # its quiet period ends in a minute
        with driver.cycle():
            driver.clock.advance(60_000)  # the wall clock goes on during a worker's cycle
            driver.start("edit", {"rowId": "b"})
            assert driver.admitted == [], "a's timer waits for the cycle's end"
            with pytest.raises(RuntimeError, match="inside a cycle"):
                driver.commit()
        (run,) = driver.admitted
        assert json.loads(run.payload)["rowId"] == "a"
        assert [row.execution_id for row in driver.runs] == [run.execution_id], (
            "committed")


def test_a_cycle_whose_body_raises_fires_nothing_and_commits_nothing() -> None:
    with TestDriver(APP) as driver:
        with pytest.raises(KeyError), driver.cycle():
            driver.start("one", {"rowId": "r1"})
            raise KeyError("the test's own failure")
        assert len(driver.admitted) == 1
        assert driver.runs == [], "not committed"
