"""Declarations the singleton stage's integration tests run against."""

from pydantic import BaseModel

from sluicegate.declare import App, CancelOn, Debounce, Singleton, Throttle, Timeouts, Workflow


class Rebuild(BaseModel):
    siteId: str
    note: str = ""


class SiteDeleted(BaseModel):
    siteId: str


SITE_DELETED = "site.deleted"


# Seed 003's rebuild-search: one run at a time per site, newcomers stand down.
rebuild = Workflow(name="rebuildSearch", payload=Rebuild,
                   singleton=Singleton(key="siteId", mode="skip"))
# Only the newest request matters: a newcomer evicts the run in progress.
latest = Workflow(name="latestOnly", payload=Rebuild,
                  singleton=Singleton(key="siteId", mode="cancel"))
# Seed 000's case for cancel timing: the replacement waits out its debounce first.
settled = Workflow(name="settledOnly", payload=Rebuild,
                   debounce=Debounce(key="siteId", period="10s"),
                   singleton=Singleton(key="siteId", mode="cancel"))
# A replacement that a later control queues: throttle spaces starts 10 s apart.
spaced = Workflow(name="spacedLatest", payload=Rebuild,
                  singleton=Singleton(key="siteId", mode="cancel"),
                  throttle=Throttle(limit=1, period="10s"))

# One rebuild at a time, and the newest request waits for it (issue 35, point 4).
queued = Workflow(name="nextRebuild", payload=Rebuild,
                  singleton=Singleton(key="siteId", mode="queue"))
# The same, composed: a quiet period first, a bounded wait, and a delete that discards it.
guarded = Workflow(name="guardedRebuild", payload=Rebuild,
                   debounce=Debounce(key="siteId", period="10s"),
                   singleton=Singleton(key="siteId", mode="queue"),
                   timeouts=Timeouts(start="1 hour"),
                   cancel_on=[CancelOn(event=SITE_DELETED, schema=SiteDeleted,
                                       match="event.siteId == payload.siteId")])

app = App([rebuild, latest, settled, spaced, queued, guarded])
