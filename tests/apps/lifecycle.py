"""Declarations for the run-lifecycle tests: timeouts.finish, onFailure, pause, blocking
callers."""

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    FailureReport,
    Priority,
    RateLimit,
    Singleton,
    Throttle,
    Timeouts,
    Workflow,
)


class Job(BaseModel):
    jobId: str


class Ranked(BaseModel):
    n: int
    rank: int


# Failures of the others land here; a handler declares no onFailure of its own.
job_failed = Workflow(name="jobFailed", payload=FailureReport)
# A run may take at most 10 seconds once admitted.
slow = Workflow(name="slowJob", payload=Job, timeouts=Timeouts(finish="10s"),
                on_failure="jobFailed")
# One run per job at a time, for at most 10 seconds: the overrun frees the key.
solo = Workflow(name="soloJob", payload=Job, singleton=Singleton(key="jobId", mode="skip"),
                timeouts=Timeouts(finish="10s"), on_failure="jobFailed")
# No controls at all: failures reported by the engine still reach the handler.
flaky = Workflow(name="flakyJob", payload=Job, on_failure="jobFailed")
# Passthrough with a priority: only a pause parks its starts, and they drain by rank.
ranked = Workflow(name="rankedJob", payload=Ranked, priority=Priority(expr="rank"))
# Workflows whose starts can wait in the admission queue: blocking callers are refused.
gated = Workflow(name="gatedJob", payload=Job, concurrency=2)
debounced = Workflow(name="debouncedJob", payload=Job,
                     debounce=Debounce(key="jobId", period="5s"))
throttled = Workflow(name="throttledJob", payload=Job,
                     throttle=Throttle(limit=1, period="1s"))
# A slot leased for 1 minute to a run that goes silent.
leased = Workflow(name="leasedJob", payload=Job,
                  concurrency=Concurrency(limit=1, lease="1m"), on_failure="jobFailed")

# One slot, and a start may wait at most 5 seconds for it.
expiring = Workflow(name="expiringJob", payload=Job, concurrency=1,
                    timeouts=Timeouts(start="5s"), on_failure="jobFailed")
# One run per job a minute; the excess is dropped.
limited = Workflow(name="limitedJob", payload=Job,
                   rate_limit=RateLimit(limit=1, period="1m", key="jobId"))



class Jobs(BaseModel):
    items: list[Job]


# Batches of up to 10 jobs, or what came in 10 seconds.
batched = Workflow(name="batchedJobs", payload=Jobs,
                   batch=Batch(item=Job, max_size=10, timeout="10s"))

app = App([job_failed, slow, solo, flaky, ranked, gated, debounced, throttled, leased,
           expiring, limited, batched])
# The same after flakyJob was removed from the declarations.
without_flaky = App([job_failed, slow, solo, ranked, gated, debounced, throttled, leased,
                     expiring, limited, batched])
