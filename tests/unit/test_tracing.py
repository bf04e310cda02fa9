"""Traces from producer to engine (docs/decisions/traces.md): the W3C trace context a start
request carries goes on with every record sluicegate writes for that start, and the worker
records a span per decision when it records spans at all."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from pydantic import BaseModel

from sluicegate import tracing
from sluicegate.client.engine import Delivery
from sluicegate.config import Settings, SettingsError
from sluicegate.declare import App, Concurrency, Singleton, Timeouts, Workflow
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord, Origin, RunEventKind, StartRequest
from sluicegate.testing import TestDriver, Written

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()
TRACE = [("traceparent", TRACEPARENT), ("tracestate", b"acme=7")]


class Job(BaseModel):
    tenant: str
    n: int


def _app() -> App:
    return App([
        Workflow(name="job", payload=Job, concurrency=Concurrency(limit=1, key="tenant"),
                 timeouts=Timeouts(start="1 minute")),
        Workflow(name="plain", payload=Job),
        Workflow(name="latest", payload=Job, singleton=Singleton(key="tenant", mode="cancel")),
    ])


def _rows(driver: TestDriver, request_id: str) -> list[tuple[LedgerRecord, Written]]:
    return [(row, written) for written in driver.sent(driver.topics.ledger)
            if (row := codec.decode(LedgerRecord, written.value)).request_id == request_id]


def _admitted(driver: TestDriver, execution_id: str) -> Written:
    (written,) = [w for w in driver.sent(driver.topics.admitted)
                  if w.key == execution_id.encode()]
    return written


def test_a_queued_start_carries_its_trace_context_to_its_ledger_rows_and_its_admission() -> None:
    with TestDriver(_app()) as driver:
        first = driver.start("job", {"tenant": "t1", "n": 1})
        queued = driver.start("job", {"tenant": "t1", "n": 2},
                              headers=[*TRACE, ("x-producer-own", b"not carried")])
        driver.report(first.execution_id, RunEventKind.started)
        driver.report(first.execution_id, RunEventKind.completed)

        rows = _rows(driver, queued.request.request_id)
        assert [row.outcome.value for row, _ in rows] == ["queued", "admitted"]
        assert [written.headers for _, written in rows] == [TRACE, TRACE]
        assert _admitted(driver, queued.execution_id).headers == TRACE
        # A start without a trace context: its records carry no headers at all.
        assert [w.headers for _, w in _rows(driver, first.request.request_id)] == [None]
        assert _admitted(driver, first.execution_id).headers is None


def test_a_start_that_waits_out_its_timeout_is_expired_in_its_trace() -> None:
    with TestDriver(_app()) as driver:
        driver.start("job", {"tenant": "t1", "n": 1})
        waiting = driver.start("job", {"tenant": "t1", "n": 2}, headers=TRACE)
        driver.advance(61_000)
        (expired, written) = _rows(driver, waiting.request.request_id)[-1]
        assert expired.outcome.value == "expired"
        assert written.headers == TRACE


def test_a_rejected_start_is_dead_lettered_and_ledgered_in_its_trace() -> None:
    with TestDriver(_app()) as driver:
        request = StartRequest(request_id="r-unknown", workflow="nope", payload=b"{}",
                               origin=Origin.event, requested_at_ms=driver.clock.now_ms())
        driver.pipe(driver.topics.starts, request, "r-unknown", headers=TRACE)
        (letter,) = driver.sent(driver.topics.deadletter)
        assert letter.headers == TRACE
        ((row, written),) = _rows(driver, "r-unknown")
        assert row.outcome.value == "rejected"
        assert written.headers == TRACE


def test_a_delayed_start_keeps_its_trace_context_until_its_time_and_then_lets_it_go() -> None:
    with TestDriver(_app()) as driver:
        later = driver.clock.now_ms() + 30_000
        delayed = driver.start("plain", {"tenant": "t1", "n": 1}, at=later, headers=TRACE)
        assert [w.headers for _, w in _rows(driver, delayed.request.request_id)] == [TRACE]
        driver.advance(30_000)
        assert _admitted(driver, delayed.execution_id).headers == TRACE
        identity = driver.store("identity", delayed.partition)
        assert not [key for key, _ in identity.items(b"\x00S\x00trace")]


def test_a_singleton_replacement_cancels_the_incumbent_in_the_replacements_trace() -> None:
    with TestDriver(_app()) as driver:
        driver.start("latest", {"tenant": "t1", "n": 1})
        driver.start("latest", {"tenant": "t1", "n": 2}, headers=TRACE)
        (command,) = driver.sent(driver.topics.commands)
        assert command.headers == TRACE


@pytest.mark.parametrize("traceparent", [
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
    b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # no trace id
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # no parent id
    b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
    b"\xff\xfe",
])
def test_a_malformed_traceparent_is_not_carried_on(traceparent: bytes) -> None:
    assert tracing.trace_of([("traceparent", traceparent), ("tracestate", b"a=1")]) is None


def test_a_tracestate_longer_than_512_bytes_is_dropped_and_the_traceparent_kept() -> None:
    assert tracing.trace_of([("tracestate", b"a=" + b"x" * 511),
                             ("traceparent", TRACEPARENT)]) == [("traceparent", TRACEPARENT)]
    assert tracing.trace_of([("traceparent", TRACEPARENT.decode())]) == [
        ("traceparent", TRACEPARENT)]


def test_the_worker_records_a_span_per_decision_as_a_child_of_the_start_trace(
        recorded_spans: Any) -> None:
    with TestDriver(_app()) as driver:
        first = driver.start("job", {"tenant": "t1", "n": 1})
        queued = driver.start("job", {"tenant": "t1", "n": 2}, headers=TRACE)
        driver.advance(5_000)
        driver.report(first.execution_id, RunEventKind.completed)
    spans = {s.name: s for s in recorded_spans.get_finished_spans()
             if s.attributes["sluicegate.request_id"] == queued.request.request_id}
    assert set(spans) == {"queued job", "admitted job"}
    for span in spans.values():
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.parent is not None and f"{span.parent.span_id:016x}" == PARENT_ID
    queued_span, admitted_span = spans["queued job"], spans["admitted job"]
    assert queued_span.attributes["sluicegate.workflow"] == "job"
    assert queued_span.attributes["sluicegate.control"] == "concurrency"
    assert queued_span.attributes["sluicegate.key"] == "t1"
    assert queued_span.attributes["sluicegate.outcome"] == "queued"
    assert queued_span.attributes["sluicegate.queue_position"] == 0
    assert "1 of 1 slots" in queued_span.attributes["sluicegate.reason"]
    assert admitted_span.attributes["sluicegate.waited_ms"] == 5_000
    assert admitted_span.attributes["sluicegate.execution_id"] == queued.execution_id
    # The first start came without a trace context: its decision span is a trace of its own.
    (own,) = [s for s in recorded_spans.get_finished_spans()
              if s.attributes["sluicegate.request_id"] == first.request.request_id]
    assert own.parent is None and f"{own.context.trace_id:032x}" != TRACE_ID


def test_a_failed_decision_span_says_why(recorded_spans: Any) -> None:
    with TestDriver(_app()) as driver:
        request = StartRequest(request_id="r-unknown", workflow="nope", payload=b"{}",
                               origin=Origin.event, requested_at_ms=driver.clock.now_ms())
        driver.pipe(driver.topics.starts, request, "r-unknown", headers=TRACE)
    (span,) = recorded_spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "unknown workflow 'nope'"


def test_no_span_is_recorded_while_the_worker_does_not_record_spans() -> None:
    assert tracing.spans is None
    with TestDriver(_app()) as driver:
        driver.start("job", {"tenant": "t1", "n": 1}, headers=TRACE)
        assert len(driver.admitted) == 1


def test_the_sdk_injects_the_callers_current_span_and_the_engine_continues_it(
        recorded_spans: Any, _tracer_provider: Any) -> None:
    from opentelemetry import trace

    assert tracing.current_trace() is None  # no span is current
    tracer = trace.get_tracer("a producer")
    with TestDriver(_app()) as driver, tracer.start_as_current_span("produce") as producing:
        started = driver.start("plain", {"tenant": "t1", "n": 1})
    (admitted,) = driver.admitted
    delivery = Delivery(admitted=admitted, trace=_admitted(driver, started.execution_id).headers)
    with delivery.span() as running:
        assert running.is_recording()
    ids = producing.get_span_context()
    finished = {s.name: s for s in recorded_spans.get_finished_spans()}
    run = finished["run plain"]
    assert run.context.trace_id == ids.trace_id
    assert run.parent is not None and run.parent.span_id == ids.span_id
    assert run.attributes["sluicegate.execution_id"] == started.execution_id
    assert finished["admitted plain"].context.trace_id == ids.trace_id


@pytest.mark.parametrize(("settings", "environ", "endpoint"), [
    ({}, {}, None),
    ({"otel_endpoint": "http://collector:4318/"}, {"OTEL_SDK_DISABLED": "true"},
     "http://collector:4318/v1/traces"),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
     "http://collector:4318/v1/traces"),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
          "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/traces"}, "http://b:4318/traces"),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_SDK_DISABLED": "TRUE"}, None),
])
def test_where_the_worker_exports_its_spans(settings: dict[str, str], environ: dict[str, str],
                                            endpoint: str | None) -> None:
    assert tracing.otlp_endpoint(Settings(**settings), environ) == endpoint


def test_an_otlp_protocol_other_than_http_is_refused_in_one_line() -> None:
    with pytest.raises(SettingsError, match=r"OTEL_EXPORTER_OTLP_PROTOCOL='grpc'.*4318"):
        tracing.otlp_endpoint(Settings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4317",
                                           "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})


def test_an_otel_endpoint_that_is_no_url_is_refused_naming_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_OTEL_ENDPOINT", "collector:4318")
    with pytest.raises(SettingsError, match="SLUICEGATE_OTEL_ENDPOINT='collector:4318'"):
        Settings()


def test_a_worker_that_records_no_spans_loads_no_opentelemetry() -> None:
    """The extra is optional, and off costs no import: a worker's stages deciding a start
    with a trace context carry it on without loading OpenTelemetry."""
    probe = (
        "import sys\n"
        "from pydantic import BaseModel\n"
        "from sluicegate.declare import App, Workflow\n"
        "from sluicegate.schemas.records import Origin, StartRequest\n"
        "from sluicegate.testing import TestDriver\n"
        "class Job(BaseModel):\n"
        "    n: int\n"
        "with TestDriver(App([Workflow(name='job', payload=Job)])) as driver:\n"
        "    driver.pipe(driver.topics.starts, StartRequest(request_id='r', workflow='job',\n"
        "                payload=b'{\"n\": 1}', origin=Origin.event, requested_at_ms=1), 'r',\n"
        f"                headers=[('traceparent', {TRACEPARENT!r})])\n"
        "    assert driver.sent(driver.topics.admitted)[0].headers\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["[]"]
