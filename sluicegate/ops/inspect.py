"""`sluicegate inspect serve`: the flow view over HTTP, a small dashboard, and /metrics.

Endpoints (docs/operations.md):

- `GET /`: the dashboard (sluicegate/ops/dashboard/index.html).
- `GET /inspect/workflows/flow-control[?workflow=W]`: the flow view as JSON, the same
  document `sluicegate workflows flow --format json` prints.
- `POST /inspect/workflows/<name>/pause` `{"reason": ..., "by": ...}` and `.../unpause`:
  the control row, written as `sluicegate workflows pause|unpause` writes it.
- `POST /inspect/bulk/preview` and `/inspect/bulk/apply`: cancel-many / replay-many,
  through a `BulkOps` (the seam to `sluicegate.ops.bulk`); a preview answers
  `{"matched": N, "truncated": bool, "runs": [...]}`.
- `GET /metrics`: Prometheus (sluicegate.ops.metrics.FlowCollector).

The standard library's threading HTTP server is enough for an operator's page; one lock
serialises reads of the sources (a DuckDB connection and Kafka consumers are not shared
between threads).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import typer

from sluicegate.config import Settings

if TYPE_CHECKING:
    from sluicegate.ops.flow import FlowReader

# sluicegate.ops.flow (DuckDB) and prometheus_client are imported when the server starts,
# so that every other `sluicegate` command starts as fast as before.

log = logging.getLogger(__name__)

app = typer.Typer(help="The flow view over HTTP, a dashboard, and Prometheus metrics.",
                  no_args_is_help=True)

FLOW_PATH = "/inspect/workflows/flow-control"
BULK_VERBS = ("cancel", "replay")
REPLAY_MODES = ("redrive", "retry")


class RequestError(ValueError):
    """A request that cannot be carried out as asked; the message says why."""


class BulkOps(Protocol):
    """cancel-many / replay-many as the dashboard calls them. `request` has `verb`
    (cancel|replay), `workflow`, `status`, `mode` (replay), `reason` (cancel) and `limit`
    (checked by `check_bulk` first). preview returns {"matched", "truncated", "runs"};
    apply returns {"truncated", "results": [{"execution_id", "outcome", "reason"}]}."""

    def preview(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def apply(self, request: dict[str, Any]) -> dict[str, Any]: ...


class NoBulkOps:
    """What serves the bulk endpoints when no BulkOps was given."""

    def preview(self, request: dict[str, Any]) -> dict[str, Any]:
        raise RequestError("bulk operations are not available in this server")

    apply = preview


class ModuleBulkOps:
    """The bulk operations of `sluicegate.ops.bulk`, in the shapes the dashboard reads.
    An apply acts only on the runs its preview listed (`only`), never on more."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def preview(self, request: dict[str, Any]) -> dict[str, Any]:
        from sluicegate.ops import bulk

        if request["verb"] == "cancel":
            result = bulk.preview_cancel(self.settings, _required(request, "workflow"),
                                         request["limit"])
        else:
            result = bulk.preview_replay(self.settings, _status(request), request["mode"],
                                         request["limit"], workflow=request.get("workflow"))
        return {"matched": len(result.succeeded), "truncated": result.truncated,
                "runs": [r.execution_id for r in result.succeeded],
                "skipped": len(result.skipped)}

    def apply(self, request: dict[str, Any]) -> dict[str, Any]:
        from sluicegate.ops import bulk

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


class InspectServer:
    """The HTTP server and the sources it reads, on a thread of its own."""

    def __init__(self, settings: Settings, reader: FlowReader, bulk: BulkOps | None = None,
                 host: str = "127.0.0.1", port: int = 8787) -> None:
        from prometheus_client import CollectorRegistry

        from sluicegate.ops.metrics import FlowCollector

        self.settings = settings
        self.reader = reader
        self.bulk: BulkOps = bulk or NoBulkOps()
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.registry.register(FlowCollector(lambda: self.flow(None), self.decisions))
        self.page = files("sluicegate.ops.dashboard").joinpath("index.html").read_bytes()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def flow(self, workflow: str | None) -> Any:
        with self.lock:
            return self.reader.view(workflow)

    def decisions(self) -> list[tuple[str, str, int]]:
        with self.lock:
            rows = self.reader.db.query(
                "SELECT workflow, outcome, count(*) FROM ledger GROUP BY ALL ORDER BY ALL").rows
        return [(str(w), str(o), int(n)) for w, o, n in rows]

    def set_paused(self, workflow: str, paused: bool, reason: str | None,
                   by: str | None) -> None:
        from sluicegate.ops.workflows import write_control
        from sluicegate.schemas.records import ControlRow

        write_control(self.settings, ControlRow(
            workflow=workflow, paused=paused, at_ms=time.time_ns() // 1_000_000,
            reason=reason, by=by or "dashboard"))

    def start(self) -> InspectServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name="inspect-http")
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.reader.close()

    def __enter__(self) -> InspectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler(server: InspectServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, server.page, "text/html; charset=utf-8")
            elif url.path == FLOW_PATH:
                workflow = parse_qs(url.query).get("workflow", [None])[0]
                self._json(HTTPStatus.OK, server.flow(workflow).to_json())
            elif url.path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                self._send(HTTPStatus.OK, generate_latest(server.registry),
                           CONTENT_TYPE_LATEST)
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})

        def do_POST(self) -> None:
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            try:
                body = self._body()
                if (len(parts) == 4 and parts[:2] == ["inspect", "workflows"]
                        and parts[3] in ("pause", "unpause")):
                    reason = str(body.get("reason") or "").strip() or None
                    if parts[3] == "pause" and reason is None:
                        raise RequestError("a pause needs a reason (it is recorded on the row)")
                    server.set_paused(parts[2], parts[3] == "pause", reason, body.get("by"))
                    self._json(HTTPStatus.OK, {"workflow": parts[2],
                                               "paused": parts[3] == "pause"})
                elif parts[:2] == ["inspect", "bulk"] and parts[2:] in (["preview"], ["apply"]):
                    request = check_bulk(body)
                    op = server.bulk.preview if parts[2] == "preview" else server.bulk.apply
                    self._json(HTTPStatus.OK, op(request))
                else:
                    self._json(HTTPStatus.NOT_FOUND, {"error": f"no such action: {self.path}"})
            except ValueError as exc:  # RequestError, or a bulk function refusing
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
            except Exception as exc:
                log.exception("POST %s failed", self.path)
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR,
                           {"error": f"{type(exc).__name__}: {exc}"})

        def _body(self) -> dict[str, Any]:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as exc:
                raise RequestError(f"the body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return body

        def _json(self, status: HTTPStatus, doc: Any) -> None:
            self._send(status, json.dumps(doc).encode(), "application/json")

        def _send(self, status: HTTPStatus, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

    return Handler


def open_server(settings: Settings, *, db: Path | str = ":memory:", declared: list[str] | None
                = None, bulk: BulkOps | None = None, host: str = "127.0.0.1",
                port: int = 8787) -> InspectServer:
    """A server on `settings`' topics; `db` is the ledger copy (in memory by default, so
    the server never holds the file `sluicegate ledger` uses)."""
    from sluicegate.ops.flow import FlowReader
    from sluicegate.ops.ledger import LedgerDb

    reader = FlowReader(settings, LedgerDb(db), declared or [])
    try:
        return InspectServer(settings, reader, bulk, host, port)
    except BaseException:
        reader.close()
        raise


@app.command("serve")
def serve(
    port: Annotated[int, typer.Option(help="The port to listen on.")] = 8787,
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
    app_spec: Annotated[str | None, typer.Option(
        "--app", help="Module with the declarations: list every declared workflow.")] = None,
    db: Annotated[Path | None, typer.Option(
        "--db", help="Keep the ledger copy in this DuckDB file (default: in memory).")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help="Kafka bootstrap servers.", envvar="SLUICEGATE_BOOTSTRAP")] = None,
    namespace: Annotated[str | None, typer.Option(
        help="Topic name prefix (default sg.).", envvar="SLUICEGATE_NAMESPACE")] = None,
) -> None:
    """Serve the dashboard, the flow view as JSON, and /metrics until Ctrl-C."""
    from sluicegate.ops.cli import _settings

    settings = _settings(bootstrap, namespace)
    declared: list[str] = []
    if app_spec is not None:
        from sluicegate.declare import load_app

        declared = sorted(load_app(app_spec, settings).workflows)
    server = open_server(settings, db=db or ":memory:", declared=declared,
                         bulk=ModuleBulkOps(settings), host=host, port=port)
    typer.echo(f"serving {server.url}/ (flow: {server.url}{FLOW_PATH}, metrics: "
               f"{server.url}/metrics)")
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        server.reader.close()
