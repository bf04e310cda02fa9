"""Declarations the concurrency stage's integration tests run against (workers in other
processes load them as `tests.apps.concurrency`)."""

from pydantic import BaseModel

from sluicegate.declare import App, Concurrency, Priority, Timeouts, Workflow


class TenantJob(BaseModel):
    tenant: str
    n: int


class Report(BaseModel):
    urgent: bool
    n: int


class Boosted(BaseModel):
    account: str
    boost: int = 0
    n: int


# At most 5 in flight per tenant (seed 000's shape).
per_tenant = Workflow(name="perTenant", payload=TenantJob,
                      concurrency=Concurrency(limit=5, key="tenant"))

# Two workflows sharing one pool of 3 slots (seed 000's `pool: 'openai'`).
embed = Workflow(name="embed", payload=TenantJob, concurrency=Concurrency(limit=3, pool="openai"))
summarize = Workflow(name="summarize", payload=TenantJob,
                     concurrency=Concurrency(limit=3, pool="openai"))

# A pool of 4 shared by every tenant, each tenant its own lane (the narrower, keyed limit
# comes first on the route and names the lane).
fair_job = Workflow(name="fairJob", payload=TenantJob, concurrency=[
    Concurrency(limit=1000, key="tenant"), Concurrency(limit=4, pool="gpu"),
])

# The same shape with the fairness declared on the pool itself: no dummy limit in front.
fair_by_tenant = Workflow(name="fairByTenant", payload=TenantJob, concurrency=Concurrency(
    limit=1, pool="shared", fair_by="tenant", weights={"gold": 2}))

# One at a time; urgent ones overtake the waiting normal ones.
report = Workflow(name="report", payload=Report, concurrency=1,
                  priority=Priority(expr="urgent ? 100 : 0"))
# The same without a priority: first come, first served.
plain = Workflow(name="plain", payload=Report, concurrency=1)

# Seed 003's shape: one run at a time overall, at most 5 per account, and a boost in
# seconds of waiting time ("as if it had waited 2 minutes longer").
by_account = Workflow(name="byAccount", payload=Boosted,
                      priority=Priority(expr="boost", mode="age"),
                      concurrency=[Concurrency(limit=1), Concurrency(limit=5, key="account")])

# A suspended run frees its slot (seed 003's steps), or keeps it (seed 000's runs).
stepper = Workflow(name="stepper", payload=TenantJob,
                   concurrency=Concurrency(limit=1, mode="steps"))
runner = Workflow(name="runner", payload=TenantJob, concurrency=Concurrency(limit=1))

# At most 2 waiting, and none waiting longer than a minute.
bounded = Workflow(name="bounded", payload=TenantJob,
                   concurrency=Concurrency(limit=1, max_queued=2),
                   timeouts=Timeouts(start="1 minute"))

# One in flight per tenant: which start of a tenant came first decides which one runs.
one_per_tenant = Workflow(name="soloJob", payload=TenantJob,
                          concurrency=Concurrency(limit=1, key="tenant"))

app = App([per_tenant, embed, summarize, fair_job, fair_by_tenant, report, plain, by_account,
           stepper, runner, bounded, one_per_tenant])
