"""Declarations of the wait estimate's integration test: a per-tenant limit followed by a
pool wide enough never to hold a start, so the wait at the first is the whole wait."""

from sluicegate.declare import App, Concurrency, Workflow
from tests.apps.concurrency import TenantJob

# At most 5 in flight per tenant, then a pool of 1000 shared by every tenant.
per_tenant_pooled = Workflow(name="perTenantPooled", payload=TenantJob, concurrency=[
    Concurrency(limit=5, key="tenant"), Concurrency(limit=1000, pool="wide")])

app = App([per_tenant_pooled])
