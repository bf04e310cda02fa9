"""Traces from producer to engine: the W3C trace context a start carries, and the spans
sluicegate records with OpenTelemetry (docs/decisions/traces.md).

A start request may carry `traceparent` (and `tracestate`) headers: the SDK injects the
caller's current context, any other producer may set them. Every record sluicegate writes
for that start carries them on (`trace_of` picks them out of a record's headers), so an
engine continues the trace. Recording spans is the worker's option, off unless an OTLP
endpoint is configured: `spans` is then the one object that records them, and None
otherwise, so a decision pays one test of it.

OpenTelemetry is an optional dependency (`sluicegate[otel]`). Nothing here imports it
until tracing is configured, or until the SDK or the Engine asks for a context and finds
its API installed.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from sluicegate.config import Settings, SettingsError

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# Kafka record headers, as the client gives and takes them (engine.stage.Headers).
Headers = list[tuple[str, str | bytes | None]]

# version-traceid-parentid-flags, lower-case hex; a later version may add fields after it.
_TRACEPARENT = re.compile(rb"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[!-~]*)?")
_MAX_TRACEPARENT_BYTES = 256
# W3C Trace Context asks a vendor to carry at least 512 characters of tracestate; a longer
# one is dropped, the traceparent kept.
MAX_TRACESTATE_BYTES = 512
# Where an OTLP/HTTP receiver takes spans, under its root.
_OTLP_PATH = "/v1/traces"


def _bytes(value: str | bytes | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def trace_of(headers: Headers | None) -> Headers | None:
    """The W3C trace context among a record's `headers`, to carry on: its `traceparent`
    when well formed, and its `tracestate` when short enough; None without a traceparent
    (a malformed one is dropped rather than carried)."""
    if not headers:
        return None
    parent = state = None
    for name, value in headers:
        if name == TRACEPARENT:
            parent = _bytes(value)
        elif name == TRACESTATE:
            state = _bytes(value)
    if (parent is None or len(parent) > _MAX_TRACEPARENT_BYTES
            or _TRACEPARENT.fullmatch(parent) is None or parent.startswith(b"ff")
            or parent[3:35] == b"0" * 32 or parent[36:52] == b"0" * 16):
        return None
    if state is not None and 0 < len(state) <= MAX_TRACESTATE_BYTES:
        return [(TRACEPARENT, parent), (TRACESTATE, state)]
    return [(TRACEPARENT, parent)]


def _carrier(trace: Headers) -> dict[str, str]:
    return {name: value.decode("ascii", "replace") if isinstance(value, bytes) else value
            for name, value in trace if value is not None}


# -- the worker's spans ----------------------------------------------------------------

class Spans:
    """Records spans with one OpenTelemetry tracer provider: the worker's decision spans,
    each a child of the trace its start carries."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("sluicegate")
        self._propagator = TraceContextTextMapPropagator()
        self._kind = SpanKind.CONSUMER
        self._error = (Status, StatusCode.ERROR)

    def record(self, name: str, trace: Headers | None, attributes: Mapping[str, Any],
               error: str | None = None) -> None:
        """One span, begun and ended now: a child of `trace` (a record's trace headers),
        or a trace of its own without one. Attributes that are None are left out; `error`
        marks the span failed, with why."""
        parent = self._propagator.extract(_carrier(trace)) if trace else None
        span = self._tracer.start_span(
            name, context=parent, kind=self._kind,
            attributes={k: v for k, v in attributes.items() if v is not None})
        if error is not None:
            status, code = self._error
            span.set_status(status(code, error))
        span.end()


# The worker's span recorder: None while tracing is off (the default).
spans: Spans | None = None


def otlp_endpoint(settings: Settings, environ: Mapping[str, str] | None = None) -> str | None:
    """Where the worker exports its spans (OTLP over HTTP): `SLUICEGATE_OTEL_ENDPOINT`'s
    `/v1/traces`, else the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as it is, else
    `OTEL_EXPORTER_OTLP_ENDPOINT`'s `/v1/traces`; None (tracing off) without any, or with
    `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`."""
    env = os.environ if environ is None else environ
    if settings.otel_endpoint:
        return settings.otel_endpoint.rstrip("/") + _OTLP_PATH
    if (env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
            or env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"):
        return None
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if endpoint is None and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + _OTLP_PATH
    if endpoint and protocol.strip() != "http/protobuf":
        raise SettingsError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: sluicegate exports "
                            "its spans by OTLP over HTTP (http/protobuf); point it at the "
                            "collector's HTTP port (4318)")
    return endpoint or None


def configure(settings: Settings) -> bool:
    """Record the worker's spans, exported by OTLP/HTTP in batches, when an endpoint is
    configured (`otlp_endpoint`); whether it is. Without one this changes nothing (a test
    may have installed its own provider with `use`). Tracing configured without
    OpenTelemetry installed is a `SettingsError` saying what to install."""
    endpoint = otlp_endpoint(settings)
    if endpoint is None:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise SettingsError(f"tracing is configured (spans to {endpoint}), but OpenTelemetry"
                            f" is not installed ({exc}): pip install 'sluicegate[otel]'"
                            ) from exc
    service = settings.otel_service_name or os.environ.get("OTEL_SERVICE_NAME") or "sluicegate"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    use(provider)
    return True


def use(provider: Any | None) -> None:
    """Record spans with `provider` (an OpenTelemetry SDK `TracerProvider`), or stop
    recording them (None)."""
    global spans
    spans = None if provider is None else Spans(provider)


def shutdown() -> None:
    """Export the spans still buffered and stop recording (the worker, as it stops)."""
    global spans
    if spans is not None:
        recorder, spans = spans, None
        recorder.provider.shutdown()


# -- the SDK's and the Engine's side: OpenTelemetry's API, when installed ----------------

_api: Any = None
_api_resolved = False


def _opentelemetry() -> Any:
    """OpenTelemetry's API (`opentelemetry.propagate` and `opentelemetry.trace`), looked
    for once; None when it is not installed."""
    global _api, _api_resolved
    if not _api_resolved:
        try:
            from opentelemetry import propagate, trace
            _api = (propagate, trace)
        except ImportError:
            _api = None
        _api_resolved = True
    return _api


def current_trace() -> Headers | None:
    """The caller's current trace context as the headers a start request carries (through
    OpenTelemetry's configured propagator); None when OpenTelemetry is not installed or no
    span is current."""
    api = _opentelemetry()
    if api is None:
        return None
    carrier: dict[str, str] = {}
    api[0].inject(carrier)
    return trace_of([(name, value.encode()) for name, value in carrier.items()])


@contextlib.contextmanager
def continued(name: str, trace: Headers | None,
              attributes: Mapping[str, Any]) -> Iterator[Any]:
    """A span `name`, current while the block runs, that continues the trace in `trace`
    (a record's trace headers; without them, a trace of its own), recorded with the
    process's own OpenTelemetry tracer provider. Yields the span, or None when
    OpenTelemetry is not installed."""
    api = _opentelemetry()
    if api is None:
        yield None
        return
    propagate, otel_trace = api
    parent = propagate.extract(_carrier(trace)) if trace else None
    tracer = otel_trace.get_tracer("sluicegate.engine")
    with tracer.start_as_current_span(
            name, context=parent, kind=otel_trace.SpanKind.CONSUMER,
            attributes={k: v for k, v in attributes.items() if v is not None}) as span:
        yield span
