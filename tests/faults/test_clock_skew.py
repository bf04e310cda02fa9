"""A worker whose records the broker refuses for their timestamps (its clock is too far
from the broker's) says so in one ERROR line and commits nothing meanwhile
(docs/decisions/runtime-faults.md).

The refusal is made by the topic's bound, not by the worker's clock (which is the
system's, as librdkafka stamps records with it): the ledger takes no record stamped before
the broker's clock. How soon the worker then commits again once the bound is lifted is
not asserted: under load, the broker's transaction state for the worker took minutes to
clear after that refusal (this simulation also meets the broker's own transaction markers
on that topic, which a clock that is truly ahead does not)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from confluent_kafka.admin import ConfigResource, ResourceType

from sluicegate.client import Client
from sluicegate.config import Settings
from sluicegate.topology.admin import create_topics
from sluicegate.topology.topics import Topics
from tests.apps.faults import app
from tests.faults.harness import APP, MARKS, Outcomes, alter_configs
from tests.integration.kafka_helpers import WorkerProcess

pytestmark = MARKS

REFUSED = "refuses the timestamps"


def _ledger_takes_timestamps_behind(settings: Settings, bound_ms: str | None) -> None:
    """How far behind the broker's clock the ledger takes a record's timestamp (None: the
    broker's default). At 0, every record the worker stamps is refused, as a worker's
    whose clock runs an hour ahead is by the default bound the other way."""
    alter_configs(settings, ConfigResource(ResourceType.TOPIC, Topics(settings).ledger),
                  {"message.timestamp.before.max.ms": bound_ms})


def test_refused_timestamps_are_said_in_one_line_and_nothing_commits_until_they_are_taken(
        settings: Settings, tmp_path: Path) -> None:
    settings = dataclasses.replace(settings, partitions=1)
    create_topics(settings)
    worker = WorkerProcess(settings, APP, tmp_path / "w")
    outcomes = Outcomes(settings)
    try:
        with Client(app=app, settings=settings, replies=False) as client:
            worker.start()
            first = client.submit("note", {"text": "before"}).request_id
            client.flush()
            outcomes.wait_until_decided({first}, timeout_s=60)
            _ledger_takes_timestamps_behind(settings, "0")
            refused = {client.submit("note", {"text": f"n{i}"}).request_id for i in range(10)}
            client.flush()
            worker.until_logged(REFUSED)
            outcomes.settle(6.0)  # several aborted cycles, backing off
            assert not refused & set(outcomes.final()), "a cycle committed meanwhile"
            assert worker.alive, worker.log_tail()
    finally:
        _ledger_takes_timestamps_behind(settings, None)
        if worker.alive:
            assert worker.stop() == 0, worker.log_tail()
        outcomes.close()
    log = worker.log.read_text()
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and REFUSED in errors[0] and "clock" in errors[0], errors
