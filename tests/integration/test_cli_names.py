"""Names an operator types are checked, on the real entry point and a real broker: a
typo is a usage error (exit 2) with a did-you-mean, never a row that pauses nothing; an
unpause of a workflow that is not paused says so; `forget` removes a control row of a
workflow that no longer exists."""

from __future__ import annotations

import time

import pytest

from sluicegate.admission.control import ControlTable
from sluicegate.config import Settings
from sluicegate.ops.services.control import write_control
from sluicegate.schemas.records import ControlRow
from sluicegate.topology.admin import create_topics
from tests.integration.cli import on

pytestmark = pytest.mark.broker


def _rows(settings: Settings) -> dict[str, ControlRow]:
    table = ControlTable(settings)
    try:
        table.catch_up()
        return dict(table.rows)
    finally:
        table.close()


def _one_error(ran_stderr: str) -> str:
    (line,) = [line for line in ran_stderr.splitlines() if line.strip()]
    return line


def test_a_misspelt_workflow_is_refused_with_the_name_it_resembles(settings: Settings) -> None:
    create_topics(settings)
    paused = on(settings, "workflows", "pause", "generateReport", "--reason", "deploying",
                "--app", "examples.demo")
    assert paused.code == 0, paused.stderr

    # Without --app: checked against what the cluster has seen (here, the pause row).
    typo = on(settings, "workflows", "pause", "generateReprot", "--reason", "x")
    assert typo.code == 2
    assert _one_error(typo.stderr) == (
        "error: no workflow 'generateReprot' seen by this cluster (pass --app to check "
        "against the declarations instead); did you mean 'generateReport'?")
    assert set(_rows(settings)) == {"generateReport"}, "no phantom pause row"

    flow = on(settings, "workflows", "flow", "--workflow", "generateReprot")
    assert flow.code == 2 and "did you mean 'generateReport'?" in _one_error(flow.stderr)
    declared = on(settings, "workflows", "flow", "--workflow", "generateReprot", "--app",
                  "examples.demo")
    assert declared.code == 2
    assert _one_error(declared.stderr) == ("error: no workflow 'generateReprot' declared in "
                                           "examples.demo; did you mean 'generateReport'?")

    cancel = on(settings, "workflows", "cancel-many", "--workflow", "nosuch", "--reason", "x",
                "--limit", "5")
    assert cancel.code == 2 and "no workflow 'nosuch'" in _one_error(cancel.stderr)
    replay = on(settings, "workflows", "replay-many", "--workflow", "nosuch", "--status",
                "failed", "--mode", "retry", "--limit", "5", "--app", "examples.demo")
    assert replay.code == 2 and "declared in examples.demo" in _one_error(replay.stderr)

    # The right name still works, and flow shows the limit beside in_flight.
    shown = on(settings, "workflows", "flow", "--workflow", "generateReport", "--app",
               "examples.demo")
    assert shown.code == 0, shown.stderr
    assert shown.stdout.startswith("generateReport  PAUSED (deploying)  queued=0 ")
    assert "in_flight=0/2" in shown.stdout


def test_unpause_of_a_workflow_that_is_not_paused_says_so_and_writes_nothing(
        settings: Settings) -> None:
    create_topics(settings)
    ran = on(settings, "workflows", "unpause", "sendReceipt", "--app", "examples.demo")
    assert ran.code == 0, ran.stderr
    assert ran.stdout.strip() == "sendReceipt is not paused: nothing to unpause"
    assert "drain" not in ran.stdout
    assert _rows(settings) == {}


def test_forget_removes_the_control_row_of_a_workflow_that_does_not_exist(
        settings: Settings) -> None:
    create_topics(settings)
    # A phantom pause row, as a typo made before names were checked.
    write_control(settings, ControlRow(workflow="generateReprot", paused=True,
                                       at_ms=int(time.time() * 1000), reason="x"))
    assert "generateReprot  PAUSED" in on(settings, "workflows", "flow").stdout

    declared = on(settings, "workflows", "forget", "generateReport", "--app", "examples.demo")
    assert declared.code == 2 and "is declared in examples.demo" in declared.stderr
    typo = on(settings, "workflows", "forget", "generateReprt", "--app", "examples.demo")
    assert typo.code == 2 and "did you mean 'generateReprot'?" in typo.stderr

    gone = on(settings, "workflows", "forget", "generateReprot", "--app", "examples.demo")
    assert gone.code == 0, gone.stderr
    assert gone.stdout.strip() == "forgot generateReprot: its control row (paused) is deleted"
    assert _rows(settings) == {}
    assert "generateReprot" not in on(settings, "workflows", "flow").stdout


def test_a_declaration_error_under_a_broker_command_is_one_line(settings: Settings) -> None:
    ran = on(settings, "workflows", "flow", "--app", "tests.apps.misspelt")
    assert ran.code == 2 and "Traceback" not in ran.stderr
    assert _one_error(ran.stderr).startswith("error: workflow misspelt: debounce key: ")
