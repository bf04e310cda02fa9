"""The inspect server: the operator's console, its JSON, and /metrics
(`sluicegate inspect serve`, sluicegate/ops/cli/inspect.py).

A Starlette application under uvicorn, thin over `sluicegate.ops.services`
(docs/decisions/inspect-server.md). Endpoints (docs/operations.md):

- `GET /`: the console (sluicegate/ops/dashboard/), the write token injected.
- `GET /inspect/workflows/flow-control[?workflow=W]`: the flow view, as
  `sluicegate workflows flow --format json` prints it.
- `GET /inspect/overview`: per workflow, decisions by outcome (totals and per minute
  over the last hour), queued and in flight beside the limit, the queue's depth and
  oldest wait per minute over the last hour, the pause.
- `GET /inspect/waiting[?workflow=W&key=K]`: each waiting start and why
  (sluicegate.ops.services.waiting).
- `GET /inspect/runs/<ID>`: a run or request, whole (sluicegate.ops.services.runs).
- `GET /inspect/deadletters[?limit=N]`: recent dead letters with their reasons.
- `GET /inspect/decisions[?workflow=W&limit=N]`: the newest ledger rows (the live tail).
- `POST /inspect/workflows/<W>/pause|unpause`, `POST /inspect/bulk/preview|apply`,
  `POST /inspect/limits/preview|apply` (an override of a concurrency limit, a throttle or
  a rateLimit; with --app).
- `GET /metrics`: Prometheus (sluicegate.ops.services.metrics.FlowCollector).

Safety: it listens on 127.0.0.1 unless told otherwise; it answers only requests whose
`Host` is one of its own names (a DNS-rebinding page cannot read it); a POST needs
`Authorization: Bearer <token>`, `Content-Type: application/json`, and no cross-site
`Origin` / `Sec-Fetch-Site`. When Kafka cannot be read, every endpoint that needs it
answers 503 with the reason, within about `PROBE_S`.

One lock serialises reads of the sources (a DuckDB connection and Kafka consumers are
not shared between threads); the endpoints run their blocking part in a worker thread.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sluicegate.config import Settings

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from sluicegate.declare import App
    from sluicegate.ops.services.deadletters import DeadLetterCount
    from sluicegate.ops.services.flow import FlowReader, FlowView
    from sluicegate.ops.services.metrics import InputOffsets
    from sluicegate.ops.services.runs import RunsIndex

# Starlette, uvicorn, DuckDB and prometheus_client are imported when the server starts,
# so that every other `sluicegate` command starts as fast as before.

log = logging.getLogger(__name__)

FLOW_PATH = "/inspect/workflows/flow-control"
BULK_VERBS = ("cancel", "replay")
REPLAY_MODES = ("redrive", "retry")
TOKEN_ENV = "SLUICEGATE_INSPECT_TOKEN"
# How long a request waits to learn that Kafka does not answer, and how long that answer
# is then given at once to the requests that follow.
PROBE_S = 1.5
DOWN_FOR_S = 2.0
# How long a request waits for the one before it to finish reading the sources.
BUSY_S = 30.0
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class RequestError(ValueError):
    """A request that cannot be carried out as asked (400); the message says why."""


class Refused(Exception):
    """A request this server does not act on (401/403/404/415/503): `status`, `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Unavailable(Refused):
    """Kafka cannot be read: 503 with the reason."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message)


class BulkOps(Protocol):
    """cancel-many / replay-many as the console calls them. `request` has `verb`
    (cancel|replay), `workflow`, `status`, `mode` (replay), `reason` (cancel) and `limit`
    (checked by `check_bulk` first). preview returns {"matched", "truncated", "runs":
    [execution ids], "listed": [{execution_id, workflow, status, detail}], "skipped":
    [{execution_id, workflow, status, detail}]}; apply returns {"truncated", "results":
    [{"execution_id", "outcome", "reason"}]}."""

    def preview(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def apply(self, request: dict[str, Any]) -> dict[str, Any]: ...


class NoBulkOps:
    """What serves the bulk endpoints when no BulkOps was given."""

    def preview(self, request: dict[str, Any]) -> dict[str, Any]:
        raise RequestError("bulk operations are not available in this server")

    apply = preview


class ModuleBulkOps:
    """The bulk operations of `sluicegate.ops.services.bulk`, in the shapes the console reads.
    An apply acts only on the runs its preview listed (`only`), never on more."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def preview(self, request: dict[str, Any]) -> dict[str, Any]:
        from sluicegate.ops.services import bulk

        if request["verb"] == "cancel":
            result = bulk.preview_cancel(self.settings, _required(request, "workflow"),
                                         request["limit"])
        else:
            result = bulk.preview_replay(self.settings, _status(request), request["mode"],
                                         request["limit"], workflow=request.get("workflow"))

        def listed(runs: list[bulk.RunResult]) -> list[dict[str, Any]]:
            return [{"execution_id": r.execution_id, "workflow": r.workflow,
                     "status": r.status, "detail": r.detail} for r in runs]

        return {"matched": len(result.succeeded), "truncated": result.truncated,
                "runs": [r.execution_id for r in result.succeeded],
                "listed": listed(result.succeeded), "skipped": listed(result.skipped),
                "ineligible": result.ineligible}

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        from sluicegate.ops.services import bulk

        only = request.get("only")
        if not isinstance(only, list):
            raise RequestError("apply acts on the runs a preview listed: preview first")
        if request["verb"] == "cancel":
            result = bulk.apply_cancel(self.settings, _required(request, "workflow"),
                                       request["reason"], request["limit"], only=only)
        else:
            result = bulk.apply_replay(self.settings, _status(request), request["mode"],
                                       request["limit"], workflow=request.get("workflow"),
                                       reason=request.get("reason"), only=only)
        results = [{"execution_id": r.execution_id, "outcome": outcome, "reason": r.detail}
                   for outcome, runs in (("succeeded", result.succeeded),
                                         ("failed", result.failed),
                                         ("skipped", result.skipped))
                   for r in runs]
        return {"truncated": result.truncated, "results": results}


def _required(request: dict[str, Any], name: str) -> str:
    value = str(request.get(name) or "").strip()
    if not value:
        raise RequestError(f"{name} is required for a {request['verb']}")
    return value


def _status(request: dict[str, Any]) -> Any:
    from sluicegate.schemas.records import RunStatus

    try:
        return RunStatus(_required(request, "status"))
    except ValueError as exc:
        raise RequestError(f"status must be one of {', '.join(RunStatus)}") from exc


# The controls an override changes, as a console's request names them.
LIMIT_CONTROLS = ("concurrency", "throttle", "rateLimit")


@dataclass(frozen=True, slots=True)
class LimitRequest:
    """A console's override, as `workflows limit` takes it: of a concurrency limit
    (`concurrency`), a throttle or a rateLimit (`rate`: `LIMIT/PERIOD`, as 10/1m)."""

    workflow: str | None
    pool: str | None
    nth: int
    concurrency: int | None  # None: clear (or a rate)
    reason: str | None
    by: str
    control: str = "concurrency"
    rate: str | None = None  # None: clear (or a concurrency limit)


def check_limit(body: dict[str, Any]) -> LimitRequest:
    """A workflow or a pool, a positive limit (a rate for a throttle or a rateLimit) or
    `clear`, as the command line asks."""
    def text(name: str) -> str | None:
        value = body.get(name)
        return str(value).strip() or None if value is not None else None

    control = body.get("control") or "concurrency"
    if control not in LIMIT_CONTROLS:
        raise RequestError(f"control must be one of {', '.join(LIMIT_CONTROLS)}")
    concurrency, rate, clear = body.get("concurrency"), text("rate"), bool(body.get("clear"))
    if control == "concurrency":
        if rate is not None:
            raise RequestError("a concurrency limit is a number (concurrency), not a rate")
        if clear == (concurrency is not None):
            raise RequestError("give concurrency (a positive number), or clear: true")
        if concurrency is not None and (not isinstance(concurrency, int)
                                        or isinstance(concurrency, bool) or concurrency < 1):
            raise RequestError("concurrency must be a positive number")
    else:
        if concurrency is not None:
            raise RequestError(f"a {control} is a rate (rate: LIMIT/PERIOD, as 10/1m), not "
                               "concurrency")
        if clear == (rate is not None):
            raise RequestError(f"give the {control}'s rate (LIMIT/PERIOD, as 10/1m), or "
                               "clear: true")
    nth = body.get("nth", 1)
    if nth not in (1, 2):
        raise RequestError("nth must be 1 or 2 (which of the workflow's limits)")
    return LimitRequest(text("workflow"), text("pool"), nth, concurrency, text("reason"),
                        text("by") or "dashboard", control, rate)


def check_bulk(request: dict[str, Any]) -> dict[str, Any]:
    """The rules of SPEC.md section 4, before anything is asked of BulkOps: a positive
    --limit (no "all"), --reason for a cancel, --mode for a replay (no default)."""
    verb = request.get("verb")
    if verb not in BULK_VERBS:
        raise RequestError(f"verb must be one of {', '.join(BULK_VERBS)}")
    limit = request.get("limit")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise RequestError("limit is required: a positive number of runs (there is no 'all')")
    if verb == "cancel" and not str(request.get("reason") or "").strip():
        raise RequestError("reason is required for a cancel: it is recorded on every run")
    if verb == "replay" and request.get("mode") not in REPLAY_MODES:
        raise RequestError("mode is required for a replay: redrive or retry")
    return request


# -- request checks --------------------------------------------------------------------


def host_name(host_header: str) -> str:
    """The name part of a Host header: `[::1]:8787` -> `::1`, `a.b:80` -> `a.b`."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0].lower()
    return host_header.rsplit(":", 1)[0].lower() if ":" in host_header else host_header.lower()


def allowed_hosts(bind: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The Host names this server answers to: loopback, the address it is bound to, the
    machine's names when bound to every interface, and those given."""
    names = {*LOOPBACK_NAMES, bind.lower(), *(h.lower() for h in extra)}
    if bind in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def cross_site(headers: dict[str, str], scheme: str) -> str | None:
    """Why a state-changing request comes from another site (None: it does not). The
    browser sets `Sec-Fetch-Site` and `Origin`; a page on another origin cannot hide
    them, and a client that is not a browser sends neither."""
    origin = headers.get("origin")
    if origin is not None:
        own = f"{scheme}://{headers.get('host', '')}"
        if origin.lower() != own.lower():
            return f"refused: Origin {origin} is not this server ({own})"
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return f"refused: a {site} request cannot change anything here (Sec-Fetch-Site)"
    return None


def check_write(headers: dict[str, str], scheme: str, token: str) -> None:
    """A POST's checks, in order: same origin (403), the token (401), JSON (415)."""
    problem = cross_site(headers, scheme)
    if problem is not None:
        raise Refused(403, problem)
    given = headers.get("authorization", "")
    scheme_word, _, value = given.partition(" ")
    if scheme_word.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()):
        raise Refused(401, "a change needs the header `Authorization: Bearer <token>`: the "
                           "token `inspect serve` printed, or SLUICEGATE_INSPECT_TOKEN")
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise Refused(415, "a change is a JSON body (Content-Type: application/json)")


# -- the sources -----------------------------------------------------------------------


class Sources:
    """What the console reads, behind one lock: the flow view's reader (ledger copy, runs,
    control rows), the runs index for lookups, and a probe that says quickly when Kafka
    cannot be reached."""

    def __init__(self, settings: Settings, reader: FlowReader, runs: RunsIndex,
                 app: App | None = None, declared: tuple[str, ...] = (),
                 app_spec: str | None = None) -> None:
        from confluent_kafka.admin import AdminClient

        self.settings = settings
        self.reader = reader
        self.runs = runs
        self.app = app
        self.declared = frozenset(declared or (app.workflows if app is not None else ()))
        # How a refusal names what a workflow was checked against.
        self.where = (f"declared in {app_spec}" if app_spec else "declared" if self.declared
                      else "seen by this cluster (start the server with --app to check "
                           "against the declarations)")
        self.lock = threading.Lock()
        self._admin = AdminClient(settings.client_config())
        self._dead_letters: DeadLetterCount | None = None
        self._down_until = 0.0
        self._down_reason = ""

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The lock, once Kafka answered (Unavailable otherwise)."""
        from confluent_kafka import KafkaException

        from sluicegate.ops.services.ledger import LedgerSqlError

        if not self.lock.acquire(timeout=BUSY_S):
            raise Unavailable(f"the server is still busy with an earlier read after {BUSY_S:g}s")
        try:
            self._probe()
            yield
        except (KafkaException, TimeoutError, LedgerSqlError) as exc:
            raise Unavailable(f"Kafka could not be read: {exc}") from None
        finally:
            self.lock.release()

    def _probe(self) -> None:
        """Kafka answers, and has the ledger topic. A client kept open, so that asking
        costs a round trip, not a new connection (`kafkautil.require_broker` makes one
        per call, for a command that asks once)."""
        from confluent_kafka import KafkaException

        from sluicegate.topology.topics import Topics

        now = time.monotonic()
        if now < self._down_until:
            raise Unavailable(self._down_reason)
        topic = Topics(self.settings).ledger
        try:
            meta = self._admin.list_topics(timeout=PROBE_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else exc
            reason = error.str() if hasattr(error, "str") else str(error)
            self._down_reason = (
                f"no Kafka broker answered at {self.settings.bootstrap} within {PROBE_S:g}s "
                f"({reason}); `sluicegate kafka status` says whether the local one runs")
            self._down_until = time.monotonic() + DOWN_FOR_S
            raise Unavailable(self._down_reason) from None
        if topic not in meta.topics:
            raise Unavailable(f"Kafka at {self.settings.bootstrap} has no topic {topic}: "
                              "run `sluicegate topics create` (or check --namespace)")

    def flow(self, workflow: str | None = None) -> FlowView:
        """A fresh flow view (it brings the ledger copy, runs and pauses up to date)."""
        with self.reading():
            return self.reader.view(workflow)

    def check_workflow(self, name: str) -> None:
        """404 for a workflow that is not declared (with --app) or, without declarations,
        never seen by the cluster (docs/decisions/names-checked.md)."""
        from sluicegate.ops.services.names import UnknownName, check_workflow, seen_workflows

        known = self.declared or seen_workflows(
            self.reader.db, self.reader.runs.live.values(), self.reader.control.rows)
        try:
            check_workflow(name, known, where=self.where)
        except UnknownName as exc:
            raise Refused(404, str(exc)) from None

    def dead_letters(self) -> int | None:
        """How many dead letters were written so far (read on from the last call); None
        until the count has once reached the end of the topic."""
        from sluicegate.ops.services.deadletters import DeadLetterCount

        if self._dead_letters is None:
            self._dead_letters = DeadLetterCount(self.settings)
        return self._dead_letters(timeout_s=PROBE_S)

    def input_offsets(self) -> list[InputOffsets]:
        """The workers' group's committed offsets and lag per input partition."""
        from sluicegate.ops.services.metrics import input_offsets

        return input_offsets(self._admin, self.settings, timeout_s=PROBE_S)

    def close(self) -> None:
        self.reader.close()
        self.runs.close()
        if self._dead_letters is not None:
            self._dead_letters.close()


# -- the application -------------------------------------------------------------------


def _int(value: str | None, default: int, lo: int, hi: int) -> int:
    if value is None or value == "":
        return default
    try:
        n = int(value)
    except ValueError:
        raise RequestError(f"{value!r} is not a number") from None
    return max(lo, min(hi, n))


def _page(name: str) -> bytes:
    return files("sluicegate.ops.dashboard").joinpath(name).read_bytes()


def build_app(sources: Sources, bulk: BulkOps, token: str,
              hosts: frozenset[str]) -> Starlette:
    """The Starlette application: routes, the Host check, errors as JSON."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send

    from sluicegate.admission.overrides import targets
    from sluicegate.ops.services import overrides
    from sluicegate.ops.services import runs as runs_mod
    from sluicegate.ops.services.control import set_paused as write_pause
    from sluicegate.ops.services.deadletters import recent
    from sluicegate.ops.services.metrics import FlowCollector, wait_bounds
    from sluicegate.ops.services.overview import OUTCOMES, decisions, overview
    from sluicegate.ops.services.waiting import waiting_starts

    registry = CollectorRegistry()

    def decided() -> list[tuple[str, str, int]]:
        rows = sources.reader.db.query(
            "SELECT workflow, outcome, count(*) FROM ledger GROUP BY ALL ORDER BY ALL").rows
        return [(str(w), str(o), int(n)) for w, o, n in rows]

    # Collected by `metrics` below, under the lock, as every other request reads.
    registry.register(FlowCollector(
        lambda: sources.reader.view(None), decided, declared=sources.declared,
        outcomes=OUTCOMES, bounds=wait_bounds(sources.app),
        dead_letters=sources.dead_letters, inputs=sources.input_offsets,
        overrides=lambda: sources.reader.control.overrides,
        limits=targets(sources.app) if sources.app is not None else ()))

    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
               "Referrer-Policy": "no-referrer"}
    page_headers = {**headers, "X-Frame-Options": "DENY", "Content-Security-Policy":
                    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                    "form-action 'none'; base-uri 'none'"}
    shell = _page("index.html").decode().replace(
        "{{TOKEN}}", html.escape(token, quote=True))

    def as_json(doc: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(doc, status_code=status, headers=headers)

    Handler = Callable[[Request], Awaitable[Response]]

    def read(fn: Callable[[Request], Any]) -> Handler:
        """A GET whose document `fn` makes under the lock, in a worker thread."""
        async def endpoint(request: Request) -> Response:
            def work() -> Any:
                with sources.reading():
                    return fn(request)
            return as_json(await run_in_threadpool(work))
        return endpoint

    def write(fn: Callable[[Request, dict[str, Any]], Any]) -> Handler:
        """A POST: checked (origin, token, JSON), then `fn` in a worker thread."""
        async def endpoint(request: Request) -> Response:
            check_write({k.lower(): v for k, v in request.headers.items()},
                        request.url.scheme, token)
            try:
                body = json.loads(await request.body() or b"{}")
            except ValueError as exc:
                raise RequestError(f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return as_json(await run_in_threadpool(fn, request, body))
        return endpoint

    async def index(request: Request) -> Response:
        return Response(shell, media_type="text/html; charset=utf-8", headers=page_headers)

    def static(name: str, media_type: str) -> Handler:
        data = _page(name)

        async def endpoint(request: Request) -> Response:
            return Response(data, media_type=media_type, headers=headers)
        return endpoint

    def workflow_param(request: Request) -> str | None:
        name = request.query_params.get("workflow") or None
        if name is not None:
            sources.check_workflow(name)
        return name

    def flow_doc(request: Request) -> Any:
        view = sources.reader.view(None)
        name = workflow_param(request)
        if name is not None:
            view = sources.reader.view(name)
        return view.to_json()

    def overview_doc(request: Request) -> Any:
        return overview(sources.reader.db, sources.reader.view(None), sources.declared)

    def waiting_doc(request: Request) -> Any:
        view = sources.reader.view(None)
        name = workflow_param(request)
        key = request.query_params.get("key")
        starts = waiting_starts(
            sources.reader.db, {w.workflow: w.pause for w in view.workflows if w.pause},
            app=sources.app, deployment_cap=sources.settings.deployment_cap,
            workflow=name, key=key, limit=_int(request.query_params.get("limit"), 500, 1,
                                                5000), now_ms=view.now_ms,
            overrides=sources.reader.control.overrides,
            key_limits=(sources.reader.key_limits.rows
                        if sources.reader.key_limits is not None else None))
        return {"now_ms": view.now_ms, "waiting": [w.to_json() for w in starts]}

    def run_doc(request: Request) -> Any:
        view = sources.reader.view(None)
        sources.runs.refresh()
        try:
            return runs_mod.lookup(sources.reader.db, sources.runs,
                                   request.path_params["ident"],
                                   {w.workflow: w.pause for w in view.workflows if w.pause},
                                   view.now_ms)
        except runs_mod.NotFound as exc:
            raise Refused(404, str(exc)) from None

    def deadletters_doc(request: Request) -> Any:
        limit = _int(request.query_params.get("limit"), 50, 1, 1000)
        return {"deadletters": recent(sources.settings, limit)}

    def decisions_doc(request: Request) -> Any:
        sources.reader.view(None)
        name = workflow_param(request)
        limit = _int(request.query_params.get("limit"), 50, 1, 1000)
        return {"decisions": decisions(sources.reader.db, name, limit)}

    def set_paused(request: Request, body: dict[str, Any]) -> Any:
        name, action = request.path_params["workflow"], request.path_params["action"]
        if action not in ("pause", "unpause"):
            raise Refused(404, f"no such action: {action} (pause or unpause)")
        reason = str(body.get("reason") or "").strip() or None
        if action == "pause" and reason is None:
            raise RequestError("a pause needs a reason (it is recorded on the row)")
        with sources.reading():
            sources.reader.view(None)
            sources.check_workflow(name)
            write_pause(sources.settings, name, action == "pause", reason,
                        str(body.get("by") or "dashboard"))
        return {"workflow": name, "paused": action == "pause"}

    def set_limit(request: Request, body: dict[str, Any]) -> Any:
        """Preview an override (what it changes now), or apply it: a row every worker
        reads, and a ledger row per workflow the limit judges."""
        op = request.path_params["op"]
        if op not in ("preview", "apply"):
            raise Refused(404, f"no such action: {op} (preview or apply)")
        asked = check_limit(body)
        if sources.app is None:
            raise Refused(409, "an override replaces a declared limit: start `inspect serve` "
                               "with --app to change one")
        if op == "apply" and asked.reason is None:
            raise RequestError("an override needs a reason (it is recorded on the row and "
                               "the ledger)")
        with sources.reading():
            sources.reader.view(None)
            try:
                rate = None if asked.rate is None else overrides.parse_rate(asked.rate)
                limit = asked.concurrency if rate is None else rate[0]
                target = overrides.target_of(sources.app, asked.workflow, asked.control,
                                             pool=asked.pool, nth=asked.nth)
                current = sources.reader.control.overrides
                if op == "preview":
                    held = (overrides.held_by_key(target, sources.reader.runs.live.values())
                            if asked.control == "concurrency" else {})
                    table = sources.reader.key_limits
                    own = ({key: row.limit for (name, key), row in table.rows.items()
                            if name == target.per_key and row.limit is not None}
                           if table is not None and target.per_key is not None else {})
                    return overrides.preview(
                        target, current, limit, held,
                        overrides.waiting_by_key(target, sources.app, sources.reader.db),
                        period_ms=None if rate is None else rate[1],
                        key_limits=own).to_json()
                change = overrides.change_limit(
                    sources.settings, sources.app, asked.workflow,
                    concurrency=asked.concurrency,
                    rate_limit=rate if asked.control == "rateLimit" else None,
                    throttle=rate if asked.control == "throttle" else None,
                    control=asked.control, pool=asked.pool, nth=asked.nth,
                    reason=asked.reason or "", by=asked.by, current=current)
            except overrides.OverrideError as exc:
                raise RequestError(str(exc)) from None
        return {"done": change.text(), "before": change.before, "after": change.after,
                "old": change.old, "new": change.new, "written": change.row is not None}

    def bulk_op(request: Request, body: dict[str, Any]) -> Any:
        request_doc = check_bulk(body)
        with sources.reading():
            if request_doc.get("workflow"):
                sources.reader.view(None)
                sources.check_workflow(str(request_doc["workflow"]))
            if request.path_params["op"] not in ("preview", "apply"):
                raise Refused(404, f"no such action: {request.path_params['op']} (preview or "
                                   "apply)")
            op = bulk.preview if request.path_params["op"] == "preview" else bulk.apply
            return op(request_doc)

    async def metrics(request: Request) -> Response:
        def work() -> bytes:
            with sources.reading():
                return bytes(generate_latest(registry))
        return Response(await run_in_threadpool(work), media_type=CONTENT_TYPE_LATEST)

    async def refused(request: Request, exc: Exception) -> Response:
        status = exc.status if isinstance(exc, Refused) else 400
        if status == 401:
            return JSONResponse({"error": str(exc)}, status_code=status,
                                headers={**headers, "WWW-Authenticate": "Bearer"})
        return as_json({"error": str(exc)}, status)

    async def failed(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        return as_json({"error": f"{type(exc).__name__}: {exc}"}, 500)

    async def not_found(request: Request, exc: Exception) -> Response:
        return as_json({"error": f"no such page: {request.url.path}"}, 404)

    async def wrong_method(request: Request, exc: Exception) -> Response:
        return as_json({"error": f"{request.method} is not served at {request.url.path}"},
                       405)

    routes = [
        Route("/", index), Route("/index.html", index),
        Route("/console.js", static("console.js", "text/javascript; charset=utf-8")),
        Route("/console.css", static("console.css", "text/css; charset=utf-8")),
        Route(FLOW_PATH, read(flow_doc)),
        Route("/inspect/overview", read(overview_doc)),
        Route("/inspect/waiting", read(waiting_doc)),
        Route("/inspect/runs/{ident:path}", read(run_doc)),
        Route("/inspect/deadletters", read(deadletters_doc)),
        Route("/inspect/decisions", read(decisions_doc)),
        Route("/inspect/workflows/{workflow}/{action:str}", write(set_paused),
              methods=["POST"]),
        Route("/inspect/bulk/{op:str}", write(bulk_op), methods=["POST"]),
        Route("/inspect/limits/{op:str}", write(set_limit), methods=["POST"]),
        Route("/metrics", metrics),
    ]

    class HostCheck:
        """Answer only requests addressed to this server by one of its names: a page whose
        domain was pointed at 127.0.0.1 (DNS rebinding) must not read the token."""

        def __init__(self, inner: ASGIApp) -> None:
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                raw = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
                if host_name(raw) not in hosts:
                    response = PlainTextResponse(
                        f"this server does not answer to the host {raw!r} (--allowed-host "
                        "adds a name)", status_code=421)
                    await response(scope, receive, send)
                    return
            await self.inner(scope, receive, send)

    application = Starlette(routes=routes, exception_handlers={
        Refused: refused, RequestError: refused, ValueError: refused, Exception: failed,
        404: not_found, 405: wrong_method})
    application.add_middleware(HostCheck)
    return application


# -- the server ------------------------------------------------------------------------


class InspectServer:
    """uvicorn serving `build_app` on a socket of its own; `start` runs it on a thread
    (tests, embedding), `serve_forever` on this one (the command)."""

    def __init__(self, sources: Sources, bulk: BulkOps | None = None, *,
                 host: str = "127.0.0.1", port: int = 8787, token: str | None = None,
                 allowed: tuple[str, ...] = ()) -> None:
        import uvicorn

        self.sources = sources
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM)[0]
        self.socket = socket.socket(family, kind, proto)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(address)
        self.socket.listen(64)
        self.port = int(self.socket.getsockname()[1])
        self.app = build_app(sources, bulk or NoBulkOps(), self.token,
                             allowed_hosts(host, allowed))
        self.server: uvicorn.Server = uvicorn.Server(uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off"))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def flow(self, workflow: str | None = None) -> FlowView:
        return self.sources.flow(workflow)

    def serve_forever(self) -> None:
        """Until Ctrl-C / SIGTERM (uvicorn's own signal handling)."""
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.sources.close()

    def start(self) -> InspectServer:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.socket])),
            daemon=True, name="inspect-http")
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the inspect server did not start")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()
        self.sources.close()

    def __enter__(self) -> InspectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_server(settings: Settings, *, db: Path | str = ":memory:",
                declared: list[str] | None = None, app: App | None = None,
                bulk: BulkOps | None = None, host: str = "127.0.0.1", port: int = 8787,
                token: str | None = None, allowed_hosts: tuple[str, ...] = (),
                app_spec: str | None = None) -> InspectServer:
    """A server on `settings`' topics; `db` is the ledger copy (in memory by default, so
    the server never holds the file `sluicegate ledger` uses). `app` (or just `declared`
    names) are the declarations: names are checked against them, limits shown."""
    from sluicegate.ops.services.flow import FlowReader
    from sluicegate.ops.services.ledger import LedgerDb
    from sluicegate.ops.services.runs import RunsIndex

    names = tuple(declared or (sorted(app.workflows) if app is not None else ()))
    reader = FlowReader.of(settings, LedgerDb(db), app, names)
    # The lookups read the flow view's runs table: one reader of sg.runs per server.
    sources = Sources(settings, reader, RunsIndex(settings, reader.runs), app, names,
                      app_spec)
    try:
        return InspectServer(sources, bulk, host=host, port=port, token=token,
                             allowed=allowed_hosts)
    except BaseException:
        sources.close()
        raise
