"""Load-time validation: every rule, each reported as `workflow f: <option> <field> ...`,
all of them together in one DeclarationError."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    DeclarationError,
    FailureReport,
    Idempotency,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
    Workflow,
)

NO_KEY = Settings(encryption_keys="")
WITH_KEY = Settings(encryption_keys="k1:c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0MTI=")


class P(BaseModel):
    tenantId: str
    rowId: str
    plan: str = "free"


class Item(BaseModel):
    siteId: str


class Items(BaseModel):
    items: list[Item]


class Deleted(BaseModel):
    issueKey: str


def problems(*workflows: Workflow, settings: Settings = NO_KEY) -> list[str]:
    with pytest.raises(DeclarationError) as caught:
        App(list(workflows), settings=settings)
    assert str(caught.value).splitlines() == caught.value.problems
    return caught.value.problems


def only_problem(**options: Any) -> str:
    found = problems(Workflow(name="f", payload=options.pop("payload", P), **options))
    assert len(found) == 1, found
    return found[0]


# --- combinations ---------------------------------------------------------------------------


def test_throttle_with_rate_limit_is_a_load_error() -> None:
    message = only_problem(throttle=Throttle(limit=1, period="1m"),
                           rate_limit=RateLimit(limit=1, period="1m"))
    assert message.startswith("workflow f: throttle and rate_limit cannot both be declared")


def test_batch_with_debounce_is_a_load_error() -> None:
    message = only_problem(payload=Items, batch=Batch(item=Item, max_size=10, timeout="10s"),
                           debounce=Debounce(period="1m"))
    assert message.startswith("workflow f: batch and debounce cannot both be declared")


def test_timeouts_start_without_a_deferring_control_is_a_load_error() -> None:
    message = only_problem(timeouts=Timeouts(start="1h"), singleton=Singleton(mode="skip"))
    assert message.startswith("workflow f: timeouts start needs a deferring control")
    assert "could never fire" in message


@pytest.mark.parametrize("control", [
    {"debounce": Debounce(period="1m")},
    {"throttle": Throttle(limit=1, period="1m")},
    {"concurrency": Concurrency(limit=1)},
])
def test_timeouts_start_with_a_deferring_control_loads(control: dict[str, Any]) -> None:
    App([Workflow(name="f", payload=P, timeouts=Timeouts(start="1h"), **control)], settings=NO_KEY)


def test_singleton_without_a_mode_is_a_load_error() -> None:
    assert only_problem(singleton=Singleton(key="tenantId")).startswith(
        "workflow f: singleton mode is required")


def test_cancel_on_without_a_match_is_a_load_error() -> None:
    message = only_problem(cancel_on=[CancelOn(event="jira.issue.deleted", schema=Deleted,
                                               match=None)])
    assert message.startswith("workflow f: cancel_on 'jira.issue.deleted' match is required")
    assert "match='true'" in message


# --- expressions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "prefix"),
    [
        ({"debounce": Debounce(period="1m", key="'t:' + rowid")}, "debounce key:"),
        ({"idempotency": "tenantID"}, "idempotency key:"),
        ({"rate_limit": RateLimit(limit=1, period="1m", key="nope")}, "rate_limit key:"),
        ({"throttle": Throttle(limit=1, period="1m", key="nope")}, "throttle key:"),
        ({"singleton": Singleton(key="nope", mode="skip")}, "singleton key:"),
        ({"concurrency": Concurrency(limit=1, key="nope")}, "concurrency key:"),
        ({"concurrency": Concurrency(limit=1), "priority": "nope ? 1 : 0"}, "priority expr:"),
    ],
)
def test_an_expression_naming_a_missing_field_is_a_load_error_naming_it(
    options: dict[str, Any], prefix: str
) -> None:
    message = only_problem(**options)
    assert message.startswith(f"workflow f: {prefix} unknown field")


def test_a_batch_if_reads_the_item_and_a_missing_field_there_is_an_error() -> None:
    message = only_problem(payload=Items, batch=Batch(item=Item, max_size=10, timeout="10s",
                                                      **{"if": "tenantId == 'x'"}))
    assert message.startswith("workflow f: batch if: unknown field 'tenantId' in Item")


def test_a_cancel_on_match_naming_a_missing_event_field_is_an_error() -> None:
    message = only_problem(cancel_on=CancelOn(event="e", schema=Deleted,
                                              match="event.issueKy == payload.rowId"))
    assert message.startswith("workflow f: cancel_on match: event: unknown field 'issueKy'")
    assert "did you mean 'issueKey'?" in message


def test_an_expression_that_does_not_parse_is_a_load_error_with_its_position() -> None:
    message = only_problem(debounce=Debounce(period="1m", key="upper(rowId)"))
    assert message.startswith("workflow f: debounce key: function calls are not part")
    assert "at column 6" in message


# --- ranges ---------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["rate_limit", "throttle", "concurrency"])
@pytest.mark.parametrize("limit", [0, 100_001])
def test_limits_must_be_between_1_and_100000(option: str, limit: int) -> None:
    made = {"rate_limit": lambda: RateLimit(limit=limit, period="1m"),
            "throttle": lambda: Throttle(limit=limit, period="1m"),
            "concurrency": lambda: Concurrency(limit=limit)}[option]()
    assert only_problem(**{option: made}) == (
        f"workflow f: {option} limit must be between 1 and 100,000 (got {limit})")


@pytest.mark.parametrize("kind", [Throttle, RateLimit])
@pytest.mark.parametrize(("period", "shown"), [("500ms", "500ms"), ("8d", "8d")])
def test_throttle_and_rate_limit_period_must_be_between_1s_and_7d(
    kind: type[Throttle] | type[RateLimit], period: str, shown: str
) -> None:
    option = kind(limit=1, period=period)
    assert only_problem(**{option.option_name: option}) == (
        f"workflow f: {option.option_name} period must be between 1s and 7d (got {shown})")


@pytest.mark.parametrize("field", ["period", "timeout"])
def test_debounce_period_and_timeout_must_be_between_1s_and_7d(field: str) -> None:
    values = {"period": "1m", field: "8 days"}
    assert only_problem(debounce=Debounce(**values)) == (
        f"workflow f: debounce {field} must be between 1s and 7d (got 8d)")


@pytest.mark.parametrize("size", [0, 101])
def test_batch_max_size_must_be_between_1_and_100(size: int) -> None:
    assert only_problem(payload=Items, batch=Batch(item=Item, max_size=size, timeout="10s")) == (
        f"workflow f: batch max_size must be between 1 and 100 (got {size})")


def test_batch_timeout_must_be_between_1s_and_1h() -> None:
    assert only_problem(payload=Items, batch=Batch(item=Item, max_size=10, timeout="2h")) == (
        "workflow f: batch timeout must be between 1s and 1h (got 2h)")


def test_batch_max_bytes_must_be_positive() -> None:
    message = only_problem(payload=Items,
                           batch=Batch(item=Item, max_size=10, timeout="1s", max_bytes=0))
    assert message == "workflow f: batch max_bytes must be more than 0 bytes (got 0)"


def test_throttle_burst_cannot_be_negative() -> None:
    assert only_problem(throttle=Throttle(limit=5, period="1m", burst=-1)) == (
        "workflow f: throttle burst must be between 0 and 100,000 (got -1)")


def test_max_queued_must_be_at_least_1_when_set() -> None:
    assert only_problem(throttle=Throttle(limit=5, period="1m", max_queued=0)) == (
        "workflow f: throttle max_queued must be at least 1 when set (got 0)")


def test_debounce_and_batch_take_no_queue_cap_since_each_key_holds_one_bounded_group() -> None:
    assert only_problem(debounce=Debounce(period="1m", max_queued=3)) == (
        "workflow f: debounce max_queued: Extra inputs are not permitted")


def test_a_duration_that_does_not_parse_is_a_load_error() -> None:
    message = only_problem(debounce=Debounce(period="15 minuts"))
    assert message.startswith("workflow f: debounce period: '15 minuts' is not a duration")


def test_a_bare_number_for_a_duration_is_a_load_error_explaining_why() -> None:
    message = only_problem(timeouts=Timeouts(finish=600))
    assert message.startswith("workflow f: timeouts finish: 600 is not a duration")
    assert "Value error" not in message


def test_timeouts_must_be_at_least_a_second() -> None:
    assert only_problem(timeouts=Timeouts(finish="10ms")) == (
        "workflow f: timeouts finish must be at least 1s (got 10ms)")


# --- concurrency ----------------------------------------------------------------------------


def test_at_most_two_concurrency_limits_per_workflow() -> None:
    message = only_problem(concurrency=[Concurrency(limit=50), Concurrency(limit=5, key="rowId"),
                                        Concurrency(limit=2, key="tenantId")])
    assert message == "workflow f: concurrency declares 3 limits; at most 2 are allowed"


def test_two_concurrency_limits_with_the_same_scope_and_key_are_a_load_error() -> None:
    message = only_problem(concurrency=[Concurrency(limit=50, key="tenantId"),
                                        Concurrency(limit=5, key=" tenantId ")])
    assert message.startswith("workflow f: concurrency declares two limits with the same scope "
                              "and key")


@pytest.mark.parametrize("scope", ["account", "env"])
def test_concurrency_scope_account_or_env_requires_a_key(scope: str) -> None:
    assert only_problem(concurrency=Concurrency(limit=5, scope=scope)).startswith(
        f"workflow f: concurrency scope {scope!r} requires a key")


def test_concurrency_pool_and_shared_scope_together_are_a_load_error() -> None:
    message = only_problem(concurrency=Concurrency(limit=5, pool="openai", key="'x'",
                                                   scope="account"))
    assert message.startswith("workflow f: concurrency pool 'openai' and scope 'account'")


def test_several_throttles_cannot_share_a_throttle_pool() -> None:
    message = only_problem(throttle=[Throttle(limit=10, period="1m", key="'x'"),
                                     Throttle(limit=1, period="1s", pool="partner")])
    assert message.startswith("workflow f: throttle pool cannot be shared by a workflow "
                              "that declares several throttles")


def test_members_of_one_pool_declaring_different_limits_are_a_load_error() -> None:
    found = problems(
        Workflow(name="embeddings", payload=P, concurrency=Concurrency(limit=10, pool="openai")),
        Workflow(name="summarize", payload=P, concurrency=Concurrency(limit=8, pool="openai")),
    )
    assert found == [
        "workflow summarize: concurrency pool 'openai' declares limit 8, but workflow "
        "embeddings declares 10; every member of a shared budget must declare the same limit"
    ]


def test_workflows_sharing_an_account_key_with_different_limits_are_a_load_error() -> None:
    found = problems(
        Workflow(name="push-orders", payload=P,
                 concurrency=Concurrency(limit=10, key="'partner-api'", scope="account")),
        Workflow(name="push-stock", payload=P,
                 concurrency=Concurrency(limit=5, key='"partner-api"', scope="env")),
    )
    assert len(found) == 1
    assert found[0].startswith("workflow push-stock: concurrency shared by key")
    assert "workflow push-orders declares 10" in found[0]


def test_concurrency_weights_need_a_fairness_key_and_whole_numbers_from_1_to_100() -> None:
    assert only_problem(concurrency=Concurrency(limit=2, weights={"gold": 3})) == (
        "workflow f: concurrency weights need fair_by: they weigh the values of the fairness "
        "key")
    assert only_problem(concurrency=Concurrency(limit=2, fair_by="tenantId",
                                                weights={"gold": 0})) == (
        "workflow f: concurrency weights['gold'] must be a whole number from 1 to 100 (got 0)")


def test_a_misspelt_fairness_key_is_a_load_error_naming_the_field() -> None:
    assert only_problem(concurrency=Concurrency(limit=2, fair_by="tenantID")).startswith(
        "workflow f: concurrency fair_by: unknown field 'tenantID' in P; did you mean "
        "'tenantId'?")


def test_members_of_one_pool_declaring_fairness_differently_are_a_load_error() -> None:
    found = problems(
        Workflow(name="embeddings", payload=P, concurrency=Concurrency(
            limit=4, pool="gpu", fair_by="tenantId", weights={"acme": 2})),
        Workflow(name="summarize", payload=P, concurrency=Concurrency(
            limit=4, pool="gpu", fair_by="plan")),
    )
    assert found == [
        "workflow summarize: concurrency pool 'gpu' declares fair_by with weights {}, but "
        "workflow embeddings declares fair_by with weights {'acme': 2}; every member of a "
        "shared budget must declare fairness alike (its expression may differ)"
    ]


def test_members_of_one_throttle_pool_declaring_different_paces_are_a_load_error() -> None:
    found = problems(
        Workflow(name="push", payload=P, throttle=Throttle(limit=10, period="1m", pool="crm")),
        Workflow(name="pull", payload=P, throttle=Throttle(limit=10, period="1h", pool="crm")),
    )
    assert found == [
        "workflow pull: throttle pool 'crm' declares limit 10 per 1h, burst 0, max_queued "
        "None, but workflow push declares limit 10 per 1m, burst 0, max_queued None; every "
        "member of a throttle pool must declare the same limit, period, burst and max_queued"
    ]
    assert only_problem(throttle=Throttle(limit=1, period="1m", pool="c r m")).startswith(
        "workflow f: throttle pool 'c r m' is not a valid pool name")


def test_an_invalid_pool_name_is_a_load_error() -> None:
    assert only_problem(concurrency=Concurrency(limit=1, pool="open ai")).startswith(
        "workflow f: concurrency pool 'open ai' is not a valid pool name")


# --- priority -------------------------------------------------------------------------------


@pytest.mark.parametrize("expr", ["700", "plan == 'enterprise' ? 1200 : 0", "-601"])
def test_priority_in_age_mode_outside_600_seconds_is_a_load_error(expr: str) -> None:
    message = only_problem(concurrency=Concurrency(limit=10), priority=Priority(expr=expr,
                                                                                mode="age"))
    assert message.startswith("workflow f: priority in age mode must be between -600 and 600")


def test_priority_in_strict_mode_takes_any_number() -> None:
    App([Workflow(name="f", payload=P, concurrency=Concurrency(limit=1),
                  priority=Priority(expr="plan == 'x' ? 5000 : 0"))], settings=NO_KEY)


# --- batch shape ----------------------------------------------------------------------------


def test_a_debounce_handing_over_every_event_needs_a_payload_with_events() -> None:
    class Edit(BaseModel):
        rowId: str

    class Wrong(BaseModel):
        items: list[Edit]

    found = problems(Workflow(name="w", payload=Wrong, debounce=Debounce(
        key="rowId", period="5s", events=Edit, max_events=0)))
    assert found == [
        "workflow w: debounce max_events must be between 1 and 1,000 (got 0)",
        "workflow w: debounce events: its payload must have a field events: list[Edit], "
        "every event of the window the run receives; Wrong has no field events",
    ]


def test_a_batch_payload_without_items_is_a_load_error() -> None:
    message = only_problem(payload=P, batch=Batch(item=Item, max_size=10, timeout="10s"))
    assert message == ("workflow f: batch item: its payload must have a field items: list[Item], "
                       "the batch the run receives; P has no field items")


def test_a_batch_payload_whose_items_are_another_model_is_a_load_error() -> None:
    class Wrong(BaseModel):
        items: list[Deleted]

    message = only_problem(payload=Wrong, batch=Batch(item=Item, max_size=10, timeout="10s"))
    assert message.startswith("workflow f: batch item: its payload must have a field items: "
                              "list[Item]")


# --- encryption and onFailure ---------------------------------------------------------------


def test_encrypt_payloads_without_an_encryption_key_is_a_load_error() -> None:
    message = only_problem(encrypt_payloads=True)
    assert message.startswith("workflow f: encrypt_payloads is declared but no encryption key "
                              "is configured")
    App([Workflow(name="f", payload=P, encrypt_payloads=True)], settings=WITH_KEY)


def test_on_failure_naming_an_undeclared_workflow_is_a_load_error() -> None:
    assert only_problem(on_failure="narrationFailed") == (
        "workflow f: on_failure names 'narrationFailed', which is not a declared workflow")


def test_on_failure_naming_a_workflow_without_the_failure_report_payload_is_a_load_error() -> None:
    found = problems(Workflow(name="f", payload=P, on_failure="g"),
                     Workflow(name="g", payload=P))
    assert found == ["workflow f: on_failure names 'g', whose payload P is not FailureReport "
                     "(declare payload=FailureReport or a subclass)"]


def test_a_failure_report_subclass_is_a_valid_handler_payload() -> None:
    class Report(FailureReport):
        team: str = "core"

    App([Workflow(name="f", payload=P, on_failure="g"), Workflow(name="g", payload=Report)],
        settings=NO_KEY)


def test_an_on_failure_handler_declaring_on_failure_is_a_load_error() -> None:
    found = problems(
        Workflow(name="f", payload=P, on_failure="g"),
        Workflow(name="g", payload=FailureReport, on_failure="h"),
        Workflow(name="h", payload=FailureReport),
    )
    assert found == ["workflow g: is the on_failure handler of f and declares on_failure 'h' "
                     "itself; there is no onFailure for an onFailure (a failing handler is "
                     "logged, not re-notified)"]


def test_an_encrypted_workflow_whose_failure_handler_is_not_encrypted_is_a_load_error() -> None:
    found = problems(
        Workflow(name="f", payload=P, on_failure="g", encrypt_payloads=True),
        Workflow(name="g", payload=FailureReport),
        settings=WITH_KEY,
    )
    assert found == ["workflow f: encrypt_payloads is set but its on_failure handler 'g' does "
                     "not set it; the failure report carries the payload, so the handler must "
                     "keep it encrypted too"]


# --- names, types, and collecting everything ------------------------------------------------


def test_duplicate_workflow_names_are_a_load_error() -> None:
    found = problems(Workflow(name="f", payload=P), Workflow(name="f", payload=P))
    assert found == ["workflow f: is declared twice; workflow names must be unique"]


def test_an_invalid_workflow_name_is_a_load_error() -> None:
    found = problems(Workflow(name="my flow", payload=P))
    assert found[0].startswith("workflow my flow: name 'my flow' is not a valid workflow name")


def test_a_pydantic_type_error_in_an_option_names_the_workflow_option_and_field() -> None:
    assert only_problem(concurrency=Concurrency(limit="five")) == (
        "workflow f: concurrency limit: Input should be a valid integer, unable to parse string "
        "as an integer")


def test_a_type_error_in_an_option_given_as_a_dict_names_the_workflow_too() -> None:
    found = problems(Workflow(name="f", payload=P, debounce={"period": "1m", "typo": 1}))
    assert found == ["workflow f: debounce typo: Extra inputs are not permitted"]


def test_a_type_error_in_the_workflow_itself_names_the_workflow() -> None:
    found = problems(Workflow(name="f", payload=dict, throttle=Throttle(limit="x", period="1m")))
    assert found == [
        "workflow f: payload: Input should be a subclass of BaseModel",
        "workflow f: throttle limit: Input should be a valid integer, unable to parse string "
        "as an integer",
    ]


def test_a_singleton_mode_outside_skip_cancel_and_queue_is_a_type_error() -> None:
    assert only_problem(singleton=Singleton(mode="replace")).startswith(
        "workflow f: singleton mode: Input should be 'skip', 'cancel' or 'queue'")


def test_something_that_is_not_a_workflow_is_a_load_error() -> None:
    with pytest.raises(DeclarationError) as caught:
        App(["tourNarration"], settings=NO_KEY)  # type: ignore[list-item]
    assert caught.value.problems == ["item 0 of the app is a str, not a Workflow"]


def test_every_problem_of_every_workflow_is_reported_together() -> None:
    found = problems(
        Workflow(name="a", payload=P, throttle=Throttle(limit=0, period="1m"),
                 rate_limit=RateLimit(limit=1, period="1m", key="rowid")),
        Workflow(name="b", payload=P, singleton=Singleton(), idempotency=Idempotency(ttl="x")),
        Workflow(name="c", payload=P, on_failure="nowhere", encrypt_payloads=True),
    )
    assert [p.split(":")[0] for p in found] == ["workflow a"] * 3 + ["workflow b"] * 2 + [
        "workflow c"] * 2
