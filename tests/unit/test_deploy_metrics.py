"""The names the alert rules (deploy/prometheus) and the dashboard (deploy/grafana) read
are names the worker and the inspect server export: taken from the code's own metric
definitions (a worker's registry, and the inspect server's collector over a view where
every metric has a sample), never from a list kept by hand. A name may be awaited only
while nothing exports it yet, so the exemption goes away when its metric arrives."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.admission.limits import LimitChange
from sluicegate.admission.overrides import Target
from sluicegate.ops.services.flow import FlowView, KeyFlow, PoolFlow, WorkflowFlow
from sluicegate.ops.services.metrics import FlowCollector, InputOffsets, WaitBounds, WorkerMetrics
from sluicegate.ops.services.overview import OUTCOMES
from sluicegate.schemas.records import OverrideRow

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "sluicegate.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "sluicegate.json"

# Metrics a rule is written against before the code exports them: the name and why.
AWAITED: dict[str, str] = {}
# Series Prometheus itself makes.
PROMETHEUS_OWN = {"up", "ALERTS"}

_FUNCTION_OR_KEYWORD = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}


def exported_names() -> set[str]:
    """Every sample name a worker and the inspect server write, from their definitions."""
    worker = WorkerMetrics()
    worker.commit_seconds.observe(0.01)
    worker.lag.labels("sg.starts", "0").set(0)
    tiers = LimitChange("tiers", "k", 3)
    view = FlowView(now_ms=0, workflows=(WorkflowFlow(
        workflow="w", paused=True, limit=1,
        keys=(KeyFlow(key="k", queued=1, waiting_ms=1000, in_flight=3, limit=3,
                      limit_row=tiers, declared=1),)),),
        pools=(PoolFlow("gpu", ("w",), in_flight=1, limit=2),))
    override = OverrideRow(control="throttle", budget="w", at_ms=0, limit=2,
                           period_ms=1000, declared=1)
    registry = CollectorRegistry()
    registry.register(FlowCollector(
        lambda: view, lambda: [("w", "admitted", 1)], declared=["w"], outcomes=OUTCOMES,
        bounds={"w": WaitBounds(start_timeout_s=60, period_s=10)}, dead_letters=lambda: 0,
        inputs=lambda: [InputOffsets("sg.starts", 0, committed=1, end=2)],
        overrides=lambda: {"throttle:w": override},
        limits=[Target("throttle", "w", 1, ("w",), 1000)]))
    names = set()
    for reg in (worker.registry, registry):
        for family in text_string_to_metric_families(generate_latest(reg).decode()):
            names.update(sample.name for sample in family.samples)
    return names


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def series_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: what is left once strings, label
    matchers, ranges, grouping clauses, function calls and numbers are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    # Grafana's label_values(series, label) reads the series, not the label.
    text = re.sub(r"\blabel_values\(\s*([^,()]*?)\s*,\s*\w+\s*\)", r" \1 ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _FUNCTION_OR_KEYWORD:
            continue
        names.add(name)
    return names


@dataclass(frozen=True)
class Used:
    exported: set[str]  # names the code must export
    awaited: set[str]


def used_metric_names() -> Used:
    """The names the rules and the dashboard read, without recorded ones (rules' outputs)
    and Prometheus's own; awaited names apart."""
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    used: set[str] = set()
    for expr in [rule["expr"] for rule in _rules()] + _dashboard_exprs():
        used |= series_names(expr)
    used -= recorded | PROMETHEUS_OWN
    return Used(exported=used - set(AWAITED), awaited=used & set(AWAITED))


def test_series_names_reads_a_promql_expression() -> None:
    assert series_names(
        'sum by (workflow, le) (rate(sluicegate_x_bucket{a="b", c=~"on(d)"}[5m])) '
        '> on (workflow) group_left 2 * level:recorded:rate5m unless up == 1e3') == {
        "sluicegate_x_bucket", "level:recorded:rate5m", "up"}
    assert series_names("label_values(sluicegate_queued, workflow)") == {"sluicegate_queued"}


def test_every_metric_the_rules_and_the_dashboard_read_is_exported() -> None:
    exported = exported_names()
    used = used_metric_names()
    assert used.exported, "no metric names found in the rules and the dashboard"
    assert used.exported - exported == set(), "read but never exported"
    assert used.awaited == set(AWAITED), "an awaited name no rule reads any more"


def test_an_awaited_metric_is_not_exported_yet() -> None:
    # When the code exports it, the exemption goes: delete it from AWAITED.
    assert set(AWAITED) & {n.removesuffix("_total") for n in exported_names()} == set()


def test_every_recorded_name_the_dashboard_reads_is_recorded_by_the_rules() -> None:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    read = {name for expr in _dashboard_exprs() for name in series_names(expr) if ":" in name}
    assert read, "the dashboard reads no recorded series"
    assert read <= recorded, read - recorded


def test_every_alert_says_how_severe_and_what_happened() -> None:
    alerts = [rule for rule in _rules() if "alert" in rule]
    assert len({rule["alert"] for rule in alerts}) == len(alerts)
    for rule in alerts:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_dashboard_panels_have_their_queries_and_places() -> None:
    doc = json.loads(DASHBOARD.read_text())
    titles = [panel["title"] for panel in doc["panels"]]
    assert len(set(titles)) == len(titles)
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert [t["refId"] for t in panel["targets"]] == [
            chr(65 + i) for i in range(len(panel["targets"]))]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
