"""Declarations as data: shorthands, compiled keys, versions, loading, the origin matrix."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import (
    CONTROL_ORDER,
    App,
    Batch,
    CancelOn,
    Concurrency,
    Control,
    Debounce,
    DeclarationError,
    FailureReport,
    Idempotency,
    Origin,
    Priority,
    Throttle,
    Timeouts,
    Workflow,
    applies,
    load_app,
)

ROOT = Path(__file__).resolve().parents[2]
NO_KEY = Settings(encryption_keys="")


class Tour(BaseModel):
    rowId: str
    tenantId: str
    editedAt: int


class Deleted(BaseModel):
    rowId: str


def tour(**changes: object) -> Workflow:
    options: dict[str, object] = {
        "name": "tourNarration",
        "payload": Tour,
        "idempotency": Idempotency(key="'tour:' + rowId + ':' + editedAt"),
        "debounce": Debounce(key="'tour:' + rowId", period="15 minutes", timeout="1 hour"),
        "concurrency": [Concurrency(limit=5, key="tenantId")],
        "timeouts": Timeouts(start="1 hour", finish="10 minutes"),
    }
    options.update(changes)
    return Workflow(**options)


PAYLOAD = {"rowId": "r1", "tenantId": "t1", "editedAt": 7}


# --- the declaration as built ---------------------------------------------------------------


def test_a_workflow_compiles_its_keys_against_its_payload() -> None:
    wf = tour()
    assert wf.problems == ()
    assert wf.debounce is not None and wf.idempotency is not None
    assert wf.debounce.period_ms == 900_000 and wf.debounce.timeout_ms == 3_600_000
    assert wf.debounce.key_expr.text(PAYLOAD) == "tour:r1"
    assert wf.idempotency.key_expr is not None
    assert wf.idempotency.key_expr.text(PAYLOAD) == "tour:r1:7"
    assert wf.concurrency[0].key_expr.text(PAYLOAD) == "t1"
    assert wf.timeouts is not None and wf.timeouts.start_ms == 3_600_000


def test_shorthands_mean_their_long_forms() -> None:
    wf = Workflow(name="f", payload=Tour, idempotency="rowId", priority="editedAt",
                  concurrency=Concurrency(limit=3))
    assert wf.idempotency == Idempotency(key="rowId").bind(Tour)
    assert wf.priority is not None and wf.priority.mode == "strict"
    assert wf.priority.value(PAYLOAD) == 7.0
    assert len(wf.concurrency) == 1 and wf.concurrency[0].limit == 3
    assert Workflow(name="g", payload=Tour, concurrency=4).concurrency[0].limit == 4


def test_an_omitted_key_is_one_key_for_the_whole_workflow() -> None:
    wf = Workflow(name="f", payload=Tour, throttle=Throttle(limit=10, period="1m"))
    (throttle,) = wf.throttle
    assert throttle.key_expr.is_constant
    assert throttle.key_expr.text(PAYLOAD) == throttle.key_expr.text({}) == ""


def test_one_throttle_or_several_and_one_keeps_the_version_it_had() -> None:
    one = Throttle(limit=10, period="1m", key="id")
    wf = Workflow(name="f", payload=Tour, throttle=one)
    assert wf.throttle == (wf.throttle[0],) and Workflow(
        name="f", payload=Tour, throttle=[one]).version == wf.version
    # The version one throttle had when a workflow could declare only one.
    assert wf.version == "83151a159c644cb9"
    both = Workflow(name="f", payload=Tour, throttle=[one, Throttle(limit=100, period="1m")])
    assert len(both.throttle) == 2 and both.valid and both.version != wf.version


def test_idempotency_without_a_key_dedupes_by_explicit_id_only() -> None:
    wf = Workflow(name="f", payload=Tour, idempotency=Idempotency(ttl="3 days"))
    assert wf.idempotency is not None
    assert wf.idempotency.key_expr is None
    assert wf.idempotency.ttl_ms == 3 * 86_400_000
    assert Idempotency(key="rowId").ttl_ms is None  # permanent by default


def test_one_option_object_can_serve_two_workflows_with_different_payloads() -> None:
    class Other(BaseModel):
        tenantId: int

    shared = Concurrency(limit=10, key="tenantId")
    a = Workflow(name="a", payload=Tour, concurrency=shared)
    b = Workflow(name="b", payload=Other, concurrency=shared)
    assert a.concurrency[0].key_expr.text({"tenantId": "x"}) == "x"
    assert b.concurrency[0].key_expr.text({"tenantId": 5}) == "5"
    with pytest.raises(RuntimeError, match="not bound"):
        _ = shared.key_expr


def test_options_are_frozen() -> None:
    wf = tour()
    with pytest.raises(ValueError, match="frozen"):
        wf.name = "other"
    assert wf.debounce is not None
    with pytest.raises(ValueError, match="frozen"):
        wf.debounce.period = "1m"


def test_batch_key_and_if_read_the_item_and_starts_are_validated_against_it() -> None:
    class Click(BaseModel):
        siteId: str
        x: int

    class Clicks(BaseModel):
        items: list[Click]

    wf = Workflow(name="save-clicks", payload=Clicks,
                  batch=Batch(item=Click, max_size=100, timeout="10s", key="siteId",
                              **{"if": "x > 0"}))
    assert wf.problems == ()
    assert wf.batch is not None and wf.batch.if_expr is not None
    assert wf.batch.key_expr.text({"siteId": "s"}) == "s"
    assert wf.batch.if_expr.matches({"x": 1}) and not wf.batch.if_expr.matches({"x": 0})
    assert wf.batch.max_bytes == 4 * 1024 * 1024 and wf.batch.timeout_ms == 10_000
    assert wf.start_model is Click
    assert tour().start_model is Tour


def test_cancel_on_match_reads_the_event_and_the_payload() -> None:
    wf = tour(cancel_on=CancelOn(event="row.deleted", schema=Deleted,
                                 match="event.rowId == payload.rowId", within="1h"))
    entry = wf.cancel_on[0]
    assert entry.match_expr.matches({"event": {"rowId": "r1"}, "payload": PAYLOAD})
    assert not entry.match_expr.matches({"event": {"rowId": "r2"}, "payload": PAYLOAD})
    assert entry.cancel_reason == "cancelOn:row.deleted"
    assert entry.within_ms == 3_600_000


def test_priority_in_age_mode_clamps_at_run_time() -> None:
    class Job(BaseModel):
        boost: int

    wf = Workflow(name="f", payload=Job, concurrency=1, priority=Priority(expr="boost",
                                                                         mode="age"))
    assert wf.priority is not None
    assert wf.priority.value({"boost": 5000}) == 600.0
    assert wf.priority.value({"boost": -5000}) == -600.0
    assert wf.priority.value({}) == 0.0


def test_declared_controls_lists_them_in_evaluation_order_and_none_is_the_passthrough() -> None:
    assert tour().declared_controls == ("idempotency", "debounce", "concurrency")
    assert Workflow(name="n", payload=Tour).declared_controls == ()
    assert tour().defers and not Workflow(name="n", payload=Tour).defers


def test_concurrency_lease_defaults_to_an_hour() -> None:
    assert Concurrency(limit=1).lease_ms == 3_600_000


def test_the_failure_report_has_the_documented_fields() -> None:
    report = FailureReport(workflow="f", payload={"a": 1}, reason="timeouts.start",
                           failed_at=1_700_000_000_000)
    assert report.model_dump() == {
        "workflow": "f", "payload": {"a": 1}, "error_tag": None, "error_message": None,
        "run_id": None, "execution_id": None, "reason": "timeouts.start",
        "failed_at": 1_700_000_000_000,
    }


# --- version --------------------------------------------------------------------------------


def test_the_same_declaration_has_the_same_version() -> None:
    assert tour().version == tour().version
    assert len(tour().version) == 16 and int(tour().version, 16) >= 0


def test_the_version_ignores_how_durations_and_expressions_are_spelled() -> None:
    respelled = tour(debounce=Debounce(key='"tour:"+rowId', period="15m", timeout="60 minutes"))
    assert respelled.version == tour().version


def test_the_version_ignores_the_order_of_concurrency_limits() -> None:
    a = Concurrency(limit=50)
    b = Concurrency(limit=5, key="tenantId")
    assert tour(concurrency=[a, b]).version == tour(concurrency=[b, a]).version


@pytest.mark.parametrize("change", [
    {"debounce": Debounce(key="'tour:' + rowId", period="16 minutes", timeout="1 hour")},
    {"concurrency": [Concurrency(limit=6, key="tenantId")]},
    {"concurrency": [Concurrency(limit=5, key="tenantId", mode="steps")]},
    {"idempotency": Idempotency(key="'tour:' + rowId + ':' + editedAt", ttl="3d")},
    {"timeouts": Timeouts(start="1 hour")},
    {"encrypt_payloads": True},
    {"name": "tourNarration2"},
])
def test_a_changed_option_changes_the_version(change: dict[str, object]) -> None:
    assert tour(**change).version != tour().version


def test_a_changed_payload_schema_changes_the_version() -> None:
    class Tour(BaseModel):  # same name, one more field
        rowId: str
        tenantId: str
        editedAt: int
        note: str = ""

    assert tour(payload=Tour).version != tour().version


def test_versions_are_the_same_in_another_process() -> None:
    code = ("from sluicegate.declare import load_app\n"
            "app = load_app('examples.declarations')\n"
            "print(sorted((w.name, w.version) for w in app))")
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                              capture_output=True, text=True)
        outputs.add(done.stdout)
    here = load_app("examples.declarations")
    assert outputs == {str(sorted((w.name, w.version) for w in here)) + "\n"}


# --- loading --------------------------------------------------------------------------------


def test_the_examples_load() -> None:
    app = load_app("examples.declarations")
    assert {"tourNarration", "narrationFailed", "index-document", "save-clicks",
            "low-stock-alert", "send-receipt", "rebuild-search", "resize-image", "sync-crm",
            "push-orders", "push-stock", "generate-report", "embeddings", "summarize",
            "note"} <= set(app.workflows)
    assert app.get("tourNarration") is app.workflows["tourNarration"]
    assert app.get("nope") is None
    assert load_app("examples.declarations:app") is app


def test_the_examples_share_budgets_as_the_seeds_say() -> None:
    app = load_app("examples.declarations")
    assert app["embeddings"].concurrency[0].shared_budget == "pool:openai"
    assert (app["push-orders"].concurrency[0].shared_budget
            == app["push-stock"].concurrency[0].shared_budget is not None)
    assert app["sync-crm"].concurrency[0].shared_budget is None


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_loading_bad_declarations_raises_every_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _module(tmp_path, monkeypatch, "bad_decls", """
        from pydantic import BaseModel
        from sluicegate.config import Settings
        from sluicegate.declare import App, Debounce, Singleton, Workflow

        class P(BaseModel):
            rowId: str

        app = App([
            Workflow(name="a", payload=P, debounce=Debounce(period="1m", key="rowid")),
            Workflow(name="b", payload=P, singleton=Singleton(key="rowId")),
        ], settings=Settings(encryption_keys=""))
    """)
    with pytest.raises(DeclarationError) as caught:
        load_app(name)
    assert [p.split(":")[0] for p in caught.value.problems] == ["workflow a", "workflow b"]


def test_loading_a_missing_module_or_attribute_is_a_declaration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DeclarationError, match="cannot import 'no_such_module_here'"):
        load_app("no_such_module_here")
    name = _module(tmp_path, monkeypatch, "not_an_app", "app = 42\n")
    with pytest.raises(DeclarationError, match=r"not_an_app\.app is a int, not a sluicegate App"):
        load_app(name)
    with pytest.raises(DeclarationError, match=r"not_an_app\.other is nothing"):
        load_app(f"{name}:other")


def test_loading_with_settings_judges_encryption_against_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _module(tmp_path, monkeypatch, "encrypted_decls", """
        from pydantic import BaseModel
        from sluicegate.config import Settings
        from sluicegate.declare import App, Workflow

        class P(BaseModel):
            rowId: str

        app = App([Workflow(name="a", payload=P, encrypt_payloads=True)],
                  settings=Settings(encryption_keys="k1:AAAA"))
    """)
    assert load_app(name).settings.encryption_keys == "k1:AAAA"
    with pytest.raises(DeclarationError, match="no encryption key is configured"):
        load_app(name, NO_KEY)


# --- origins --------------------------------------------------------------------------------


@pytest.mark.parametrize(("control", "origins"), [
    ("concurrency", {"event", "direct", "cron", "invoke"}),
    ("priority", {"event", "direct", "cron", "invoke"}),
    ("throttle", {"event", "direct", "cron"}),
    ("singleton", {"event", "direct", "cron"}),
    ("rate_limit", {"event"}),
    ("debounce", {"event"}),
    ("batch", {"event"}),
    ("idempotency", {"event"}),
])
def test_which_controls_apply_to_which_origin_follows_seed_003(
    control: str, origins: set[str]
) -> None:
    assert {o.value for o in Origin if applies(control, o)} == origins
    assert applies(control, "event")


def test_an_unknown_control_or_origin_is_an_error_not_a_no() -> None:
    with pytest.raises(ValueError, match="unknown control 'ratelimit'"):
        applies("ratelimit", Origin.event)
    with pytest.raises(ValueError):
        applies("throttle", "webhook")


def test_app_settings_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_ENCRYPTION_KEYS", "k1:AAAA")
    App([Workflow(name="a", payload=Tour, encrypt_payloads=True)])
    monkeypatch.setenv("SLUICEGATE_ENCRYPTION_KEYS", "")
    with pytest.raises(DeclarationError):
        App([Workflow(name="a", payload=Tour, encrypt_payloads=True)])


def test_one_control_has_one_enum_member_under_all_its_names() -> None:
    assert Control.of("rateLimit") is Control.of("rate_limit") is Control.rate_limit
    assert (Control.rate_limit.option, Control.rate_limit.stage) == ("rate_limit", "ratelimit")
    assert Control.debounce.stage == Control.batch.stage == "defer"
    assert Control.priority.stage is None
    # The order a start meets them, as declarations list them.
    assert tuple(c.option for c in Control) == CONTROL_ORDER
    # The ledger and the route name a control by its declared name.
    assert f"{Control.rate_limit}" == "rateLimit"
