"""Traces from producer to engine on the real broker (docs/decisions/traces.md): a producer's
span, the worker's decision spans and the engine's span share one trace through a start
that waited in a concurrency queue; read from the SDK's in-memory exporter with the worker
in this process, and from an OTLP/HTTP receiver with the worker in its own."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from sluicegate.client import Client, Engine
from sluicegate.client.engine import Delivery
from sluicegate.config import Settings
from sluicegate.declare import load_app
from sluicegate.topology.admin import create_topics
from tests.integration.kafka_helpers import WorkerProcess, WorkerThread

pytestmark = pytest.mark.broker

APP = "tests.apps.concurrency"
WORKFLOW = "plain"  # one run at a time


def _until(what: str, found: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = found()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def _next_admitted(engine: Engine, timeout: float = 60.0) -> Delivery:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        delivery = engine.poll(0.2)
        if delivery is not None and delivery.admitted is not None:
            return delivery
    raise AssertionError(f"no admitted start within {timeout}s")


def _queued_start_traced(settings: Settings, queued: Callable[[str], bool]) -> tuple[Any, str]:
    """The scene both tests share: a first start takes the workflow's one slot, a second,
    produced in a span of its own, waits in the queue (`queued(request_id)` says when the
    worker has decided so), and is admitted when the engine ends the first run; the engine
    runs it in `Delivery.span()`. The second's producer span and execution id."""
    tracer = trace.get_tracer("test producer")
    app = load_app(APP)
    with Client(app=app, settings=settings) as client, \
            Engine(settings=settings, group=f"engine-{uuid.uuid4().hex[:6]}") as engine:
        client.start(WORKFLOW, {"urgent": False, "n": 1})
        first = _next_admitted(engine)
        engine.started(first)
        with tracer.start_as_current_span("produce second") as producer:
            handle = client.start(WORKFLOW, {"urgent": False, "n": 2})
        client.flush()
        _until("the second start is queued", lambda: queued(handle.request_id))
        assert first.admitted is not None
        engine.completed(first.admitted.execution_id, WORKFLOW)
        second = _next_admitted(engine)
        assert second.admitted is not None and second.admitted.request_ids == [
            handle.request_id]
        with second.span():
            engine.started(second)
            engine.completed(second.admitted.execution_id, WORKFLOW)
        return producer, second.admitted.execution_id


def test_a_queued_start_is_one_trace_from_producer_through_the_worker_to_the_engine(
        settings: Settings, recorded_spans: Any) -> None:
    create_topics(settings)

    def decided(request_id: str, outcome: str) -> list[Any]:
        return [s for s in recorded_spans.get_finished_spans()
                if s.attributes.get("sluicegate.request_id") == request_id
                and s.attributes.get("sluicegate.outcome") == outcome]

    with WorkerThread(load_app(APP), settings):
        producer, execution_id = _queued_start_traced(
            settings, lambda request_id: decided(request_id, "queued"))
    request_id = next(s.attributes["sluicegate.request_id"]
                      for s in recorded_spans.get_finished_spans()
                      if s.attributes.get("sluicegate.execution_id") == execution_id)
    (queued,) = decided(request_id, "queued")
    (admitted,) = decided(request_id, "admitted")
    (run,) = [s for s in recorded_spans.get_finished_spans() if s.name == f"run {WORKFLOW}"
              and s.attributes["sluicegate.execution_id"] == execution_id]
    ids = producer.get_span_context()
    for span in (queued, admitted, run):
        assert span.context.trace_id == ids.trace_id, span.name
        assert span.parent is not None and span.parent.span_id == ids.span_id, span.name
    assert queued.attributes["sluicegate.control"] == "concurrency"
    assert queued.attributes["sluicegate.queue_position"] == 0
    assert admitted.attributes["sluicegate.waited_ms"] > 0


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest."""

    spans: list[Any]
    lock: threading.Lock

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    self.spans.extend((resource.resource, span) for span in scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def _otlp_receiver() -> Iterator[tuple[str, list[Any], threading.Lock]]:
    spans: list[Any] = []
    lock = threading.Lock()
    handler = type("Receiver", (_Receiver,), {"spans": spans, "lock": lock})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans, lock
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_given_an_otlp_endpoint_exports_its_decision_spans_in_the_producers_trace(
        settings: Settings, recorded_spans: Any, tmp_path: Path) -> None:
    create_topics(settings)
    with _otlp_receiver() as (endpoint, received, lock):
        def decided(request_id: str, outcome: str) -> list[Any]:
            with lock:
                return [span for _, span in received if any(
                    a.key == "sluicegate.request_id" and a.value.string_value == request_id
                    for a in span.attributes) and any(
                    a.key == "sluicegate.outcome" and a.value.string_value == outcome
                    for a in span.attributes)]

        worker = WorkerProcess(settings, APP, tmp_path / "worker",
                               SLUICEGATE_OTEL_ENDPOINT=endpoint,
                               SLUICEGATE_OTEL_SERVICE_NAME="traced-worker",
                               OTEL_BSP_SCHEDULE_DELAY="100").start()
        try:
            producer, execution_id = _queued_start_traced(
                settings, lambda request_id: decided(request_id, "queued"))
            ids = producer.get_span_context()

            def admitted() -> list[Any]:
                with lock:
                    return [(resource, span) for resource, span in received if any(
                        a.key == "sluicegate.execution_id"
                        and a.value.string_value == execution_id for a in span.attributes)
                        and span.name == f"admitted {WORKFLOW}"]

            ((resource, span),) = _until("the admitted span is exported", admitted)
        finally:
            assert worker.stop() == 0, worker.log_tail()
    assert span.trace_id == ids.trace_id.to_bytes(16, "big")
    assert span.parent_span_id == ids.span_id.to_bytes(8, "big")
    assert {a.key: a.value.string_value for a in resource.attributes}[
        "service.name"] == "traced-worker"
    (run,) = [s for s in recorded_spans.get_finished_spans() if s.name == f"run {WORKFLOW}"]
    assert run.context.trace_id == ids.trace_id
