"""Declarations the singleton stage's integration tests run against."""

from pydantic import BaseModel

from sluicegate.declare import App, Debounce, Singleton, Throttle, Workflow


class Rebuild(BaseModel):
    siteId: str
    note: str = ""


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

app = App([rebuild, latest, settled, spaced])
