"""Settings are one checked object (issue 36, point 6): a value a setting does not take is
one line naming the variable, what it got and what it takes; a Kafka client setting
sluicegate sets itself is refused, not dropped; the engine's deadlines and budgets are
settings; docs/configuration.md is generated from them and kept up to date."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sluicegate
from sluicegate.config import (
    KAFKA_PREFIX,
    OTHER_VARIABLES,
    REGISTRY_PREFIX,
    RUNTIME_KAFKA,
    VARIABLES,
    Settings,
    SettingsError,
    markdown,
)
from sluicegate.engine.runtime import producer_tuning
from sluicegate.engine.transactions import CallHung, TransactionalProducer

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(sluicegate.__file__).parent
PAGE = ROOT / "docs" / "configuration.md"


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SLUICEGATE_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SLUICEGATE_PARTITIONS", "abc",
     "SLUICEGATE_PARTITIONS='abc': it takes a whole number from 1 to 10000"),
    ("SLUICEGATE_PARTITIONS", "0",
     "SLUICEGATE_PARTITIONS='0': it takes a whole number from 1 to 10000"),
    ("SLUICEGATE_DEPLOYMENT_CAP", "-1",
     "SLUICEGATE_DEPLOYMENT_CAP='-1': it takes a whole number, at least 0"),
    ("SLUICEGATE_POISON_AFTER", "two",
     "SLUICEGATE_POISON_AFTER='two': it takes a whole number from 1 to 100"),
    ("SLUICEGATE_NAMESPACE", "my topics",
     "SLUICEGATE_NAMESPACE='my topics': it takes a topic name prefix of at most 100 letters,"
     " digits, `.`, `_` and `-`"),
    ("SLUICEGATE_SCHEMA_REGISTRY_URL", "registry:8081",
     "SLUICEGATE_SCHEMA_REGISTRY_URL='registry:8081': it takes empty, or an http:// or"
     " https:// URL"),
])
def test_a_value_a_setting_does_not_take_names_the_variable_what_it_got_and_what_it_takes(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as raised:
        Settings()
    assert str(raised.value) == message


def test_a_value_given_in_code_is_checked_too_and_names_its_variable() -> None:
    with pytest.raises(SettingsError, match=r"^Settings\(partitions=0\) \(SLUICEGATE_PARTITIONS\):"
                                            r" it takes a whole number from 1 to 10000$"):
        Settings(partitions=0)
    with pytest.raises(SettingsError, match="SLUICEGATE_COMMIT_INTERVAL_MS"):
        Settings().with_(commit_interval_ms=20_000)


def test_the_engine_budgets_and_deadlines_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_POISON_AFTER", "3")
    monkeypatch.setenv("SLUICEGATE_RESTORE_STEP_MS", "250")
    monkeypatch.setenv("SLUICEGATE_CALL_TIMEOUT_MS", "2000")
    settings = Settings()
    assert (settings.poison_after, settings.restore_step_ms, settings.call_timeout_ms) == (
        3, 250, 2000)


def test_the_transactional_calls_take_their_deadline_from_the_settings() -> None:
    settings = Settings(bootstrap="127.0.0.1:1", call_timeout_ms=100, hang_grace_ms=0)
    producer = TransactionalProducer(settings.client_config(), lambda: False, settings)
    began = time.monotonic()
    # A call that takes 5 s outlives a deadline of 0.1 s: given up as hung, not waited for.
    with pytest.raises(CallHung):
        producer._call(time.sleep, 5.0, what="a slow call")
    assert time.monotonic() - began < 5.0


@pytest.mark.parametrize(("variable", "key"), [
    ("SLUICEGATE_KAFKA_SESSION_TIMEOUT_MS", "session.timeout.ms"),
    ("SLUICEGATE_KAFKA_TRANSACTION_TIMEOUT_MS", "transaction.timeout.ms"),
    ("SLUICEGATE_KAFKA_ISOLATION_LEVEL", "isolation.level"),
    ("SLUICEGATE_KAFKA_BOOTSTRAP_SERVERS", "bootstrap.servers"),
])
def test_a_kafka_setting_sluicegate_sets_itself_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch, variable: str, key: str) -> None:
    monkeypatch.setenv(variable, "45000")
    with pytest.raises(SettingsError) as raised:
        Settings()
    message = str(raised.value)
    assert message.startswith(f"{variable}=45000: sluicegate sets {key} itself (")
    assert message.endswith("so it would be ignored; unset it") and "\n" not in message


def test_other_kafka_settings_pass_through_to_every_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("SLUICEGATE_KAFKA_MESSAGE_MAX_BYTES", "2000000")
    config = Settings().client_config(**{"group.id": "g"})
    assert config["sasl.mechanism"] == "PLAIN" and config["message.max.bytes"] == "2000000"


def test_a_kafka_setting_given_in_code_that_sluicegate_sets_is_refused_naming_the_code() -> None:
    with pytest.raises(SettingsError, match=r"^Settings\(kafka=\{'linger.ms': '50'\}\): "
                                            r"sluicegate sets linger.ms itself"):
        Settings(kafka={"linger.ms": "50"})


def test_a_client_that_sets_a_setting_the_user_gave_refuses_rather_than_drops_it() -> None:
    settings = Settings(kafka={"queue.buffering.max.kbytes": "1024"})
    with pytest.raises(SettingsError, match=r"sluicegate sets queue\.buffering\.max\.kbytes"):
        settings.client_config(**{"queue.buffering.max.kbytes": "2048"})


def _client_settings_in_the_code() -> set[str]:
    """Every Kafka client setting the package gives a client: the keywords and literal
    dicts of each `client_config(...)` call, and the worker producer's tuning."""
    found: set[str] = set(producer_tuning(Settings()))
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "client_config"):
                continue
            for keyword in node.keywords:
                if keyword.arg is not None:
                    found.add(keyword.arg)
                elif isinstance(keyword.value, ast.Dict):
                    # Literal dicts, also those given under a condition inside it.
                    found.update(k.value for d in ast.walk(keyword.value)
                                 if isinstance(d, ast.Dict) for k in d.keys
                                 if isinstance(k, ast.Constant) and isinstance(k.value, str))
                elif isinstance(keyword.value, ast.Call):  # **self._clients.config(...)
                    found.add("error_cb")
    return found | {"bootstrap.servers", "logger"}


def test_runtime_kafka_lists_every_client_setting_sluicegate_sets_and_no_other() -> None:
    in_code = _client_settings_in_the_code()
    assert sorted(in_code - RUNTIME_KAFKA.keys()) == [], "add each to config.RUNTIME_KAFKA"
    assert sorted(RUNTIME_KAFKA.keys() - in_code) == [], "no client sets these any more"


def test_every_sluicegate_variable_the_package_reads_is_on_the_configuration_page() -> None:
    named = {m for path in PACKAGE.rglob("*.py")
             for m in re.findall(r"SLUICEGATE_[A-Z_]*[A-Z]", path.read_text(encoding="utf-8"))}
    known = {v.env for v in VARIABLES} | OTHER_VARIABLES.keys()
    unknown = sorted(n for n in named - known
                     if not n.startswith((KAFKA_PREFIX, REGISTRY_PREFIX))
                     and n + "_" not in (KAFKA_PREFIX, REGISTRY_PREFIX))
    assert unknown == [], "declare each in config.VARIABLES or OTHER_VARIABLES"


def test_the_configuration_page_is_generated_from_the_settings() -> None:
    assert PAGE.read_text(encoding="utf-8") == markdown(), (
        "regenerate it: python -m sluicegate.config --markdown > docs/configuration.md")


def test_the_page_is_what_the_module_prints() -> None:
    done = subprocess.run([sys.executable, "-m", "sluicegate.config", "--markdown"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == markdown()
