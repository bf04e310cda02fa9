"""Declarations the upgrade test runs against (tests/faults/test_upgrade.py): a workflow
per kind of state a worker leaves behind, every one keyed by `account`. The test copies
this file into the tree of the release before, so both workers load the same
declarations: it may import nothing from the tests but itself."""

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    RateLimit,
    Singleton,
    Throttle,
    Workflow,
)


class Job(BaseModel):
    account: str
    n: int


class Jobs(BaseModel):
    items: list[Job]


MINUTE_MS = 60_000
GATE_LIMIT = 2

# Waiting on timers: a debounce group a quiet minute long, a batch flushed a minute after
# its first item (and delayed starts: `note` with an `at`).
debounced = Workflow(name="debounced", payload=Job,
                     debounce=Debounce(key="account", period="1m"))
batched = Workflow(name="batched", payload=Jobs,
                   batch=Batch(item=Job, key="account", max_size=10, timeout="1m"))
# No control: a delayed start, and markers. `reindex` is paused while its starts come.
note = Workflow(name="note", payload=Job)
reindex = Workflow(name="reindex", payload=Job)
# Queued behind a limit whose slots runs in flight hold: per account, and one slot shared
# by every account served round-robin (its queue has lanes and a total).
gated = Workflow(name="gated", payload=Job,
                 concurrency=Concurrency(limit=GATE_LIMIT, key="account"))
fair = Workflow(name="fair", payload=Job,
                concurrency=Concurrency(limit=1, pool="shared", fair_by="account"))
# Queued behind a pace of one a minute per account.
paced = Workflow(name="paced", payload=Job,
                 throttle=Throttle(limit=1, period="1m", key="account"))
# A hold a run in flight keeps: newcomers are skipped while it runs.
solo = Workflow(name="solo", payload=Job, singleton=Singleton(key="account", mode="skip"))
# Spent keys: one run per account, ever; one an hour.
receipt = Workflow(name="receipt", payload=Job, idempotency="account")
alert = Workflow(name="alert", payload=Job,
                 rate_limit=RateLimit(limit=1, period="1h", key="account"))

app = App([debounced, batched, note, reindex, gated, fair, paced, solo, receipt, alert])
