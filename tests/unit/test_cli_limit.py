"""`sluicegate workflows limit` refuses what it cannot do before it talks to Kafka: exit
code 2 and a line that says what to give (docs/decisions/cli-errors.md)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sluicegate.ops.cli.root import app as cli

APP = ["--app", "tests.apps.overrides", "--bootstrap", "127.0.0.1:1"]


@pytest.mark.parametrize(("args", "says"), [
    (["partnerCall", "--reason", "r", *APP], "give one of --concurrency N"),
    (["partnerCall", "--concurrency", "2", "--clear", "--reason", "r", *APP],
     "give one of --concurrency N"),
    (["partnerCall", "--concurrency", "2", *APP], "--reason is required"),
    (["partnerCall", "--concurrency", "2", "--reason", "r", "--bootstrap", "127.0.0.1:1"],
     "--app is required"),
    (["partnerCall", "--clear", "--control", "pause", "--reason", "r", *APP],
     "--control must be concurrency, throttle or rate-limit"),
    (["alert", "--rate-limit", "ten a minute", "--reason", "r", *APP],
     "a rate is LIMIT/PERIOD, as 10/1m or 100/1h"),
])
def test_a_limit_it_cannot_change_is_refused_with_what_to_give(args: list[str],
                                                                says: str) -> None:
    result = CliRunner().invoke(cli, ["workflows", "limit", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output
