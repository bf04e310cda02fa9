"""The seeds' examples, declared as sluicegate workflows.

`load_app("examples.declarations")` loads them; every process (workers, SDK, CLI) can. Keys
are expressions over the payload; seed 003's `event.data.<field>` spelling is accepted too
(`index-document` uses it).
"""

from __future__ import annotations

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    FailureReport,
    Idempotency,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
    Workflow,
)

# --- seed 000 ------------------------------------------------------------------------------


class Tour(BaseModel):
    rowId: str
    tenantId: str
    editedAt: int
    issueKey: str | None = None


class JiraIssueDeleted(BaseModel):
    issueKey: str


# Twenty edits mint twenty identities; debounce admits one, fifteen minutes after the last.
tour_narration = Workflow(
    name="tourNarration",
    payload=Tour,
    idempotency=Idempotency(key="'tour:' + rowId + ':' + editedAt"),
    debounce=Debounce(key="'tour:' + rowId", period="15 minutes", timeout="1 hour"),
    concurrency=Concurrency(limit=5, key="tenantId"),
    timeouts=Timeouts(start="1 hour", finish="10 minutes"),
    cancel_on=[CancelOn(event="jira.issue.deleted", schema=JiraIssueDeleted,
                        match="event.issueKey == payload.issueKey")],
    on_failure="narrationFailed",
)

narration_failed = Workflow(
    name="narrationFailed",
    payload=FailureReport,
    idempotency="'failed:' + (run_id == null ? 'none' : run_id) + ':' + failed_at",
)


class Job(BaseModel):
    tenantId: str
    text: str


# Two workflows calling one provider share ten slots, not ten each.
embeddings = Workflow(name="embeddings", payload=Job,
                      concurrency=Concurrency(limit=10, pool="openai", key="tenantId"))
summarize = Workflow(name="summarize", payload=Job,
                     concurrency=Concurrency(limit=10, pool="openai", key="tenantId"))

# --- seed 003 ------------------------------------------------------------------------------


class CrmSync(BaseModel):
    accountId: str


# At most 5 at once per account, and 50 at once in all.
sync_crm = Workflow(
    name="sync-crm",
    payload=CrmSync,
    concurrency=[Concurrency(limit=50), Concurrency(limit=5, key="accountId", mode="steps")],
)


class PartnerChange(BaseModel):
    id: str


# Two functions share one limit through the same constant key at account scope.
partner_limit = Concurrency(limit=10, key="'partner-api'", scope="account")
push_orders = Workflow(name="push-orders", payload=PartnerChange, concurrency=partner_limit)
push_stock = Workflow(name="push-stock", payload=PartnerChange, concurrency=partner_limit)


class ImageUploaded(BaseModel):
    userId: str
    imageId: str


# 60 a minute per user (one a second), plus 10 at once after a quiet time.
resize_image = Workflow(
    name="resize-image",
    payload=ImageUploaded,
    throttle=Throttle(limit=60, period="1m", burst=10, key="userId"),
)


class StockLow(BaseModel):
    productId: str


# At most one alert per product every 4 hours; the rest are dropped.
low_stock_alert = Workflow(
    name="low-stock-alert",
    payload=StockLow,
    rate_limit=RateLimit(limit=1, period="4h", key="productId"),
)


class DocumentEdited(BaseModel):
    documentId: str


# Run once a document has had no edits for 5 minutes; never wait more than 30 in all.
index_document = Workflow(
    name="index-document",
    payload=DocumentEdited,
    debounce=Debounce(period="5m", key="event.data.documentId", timeout="30m"),
)


class Click(BaseModel):
    siteId: str
    x: int
    y: int


class Clicks(BaseModel):
    items: list[Click]


# Up to 100 clicks per run, or what came in 10 seconds, per site.
save_clicks = Workflow(
    name="save-clicks",
    payload=Clicks,
    batch=Batch(item=Click, max_size=100, timeout="10s", key="siteId"),
)


class ReportRequested(BaseModel):
    accountId: str
    plan: str


# Enterprise reports waiting for a slot go first, as if they had waited 2 minutes longer.
generate_report = Workflow(
    name="generate-report",
    payload=ReportRequested,
    concurrency=Concurrency(limit=10),
    priority=Priority(expr="plan == 'enterprise' ? 120 : 0", mode="age"),
)


class OrderPaid(BaseModel):
    orderId: str


# One receipt per order, however many order/paid events come for it; kept 3 days after.
send_receipt = Workflow(
    name="send-receipt",
    payload=OrderPaid,
    idempotency=Idempotency(key="orderId", ttl="3 days"),
)


class SearchRebuild(BaseModel):
    siteId: str


# One rebuild at a time per site; while one runs, a new request starts no run.
rebuild_search = Workflow(
    name="rebuild-search",
    payload=SearchRebuild,
    singleton=Singleton(key="siteId", mode="skip"),
)


class Note(BaseModel):
    text: str


# No control at all: the passthrough.
note = Workflow(name="note", payload=Note)

app = App([
    tour_narration, narration_failed, embeddings, summarize, sync_crm, push_orders, push_stock,
    resize_image, low_stock_alert, index_document, save_clicks, generate_report, send_receipt,
    rebuild_search, note,
])
