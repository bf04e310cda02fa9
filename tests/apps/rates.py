"""Declarations the rateLimit and throttle tests run against (seed 003's examples)."""

from pydantic import BaseModel

from sluicegate.declare import App, FailureReport, RateLimit, Throttle, Timeouts, Workflow


class LowStock(BaseModel):
    productId: str


class Upload(BaseModel):
    userId: str
    imageId: str
    urgent: bool = False


# At most one alert per product every 4 hours; extra events start no run (seed 003).
low_stock_alert = Workflow(name="lowStockAlert", payload=LowStock,
                           rate_limit=RateLimit(limit=1, period="4h", key="productId"))
# At most 60 a minute per user, one a second, plus 10 at once after a quiet time.
resize_image = Workflow(name="resizeImage", payload=Upload,
                        throttle=Throttle(limit=60, period="1m", burst=10, key="userId"))
# One an hour in all, and no more than two waiting.
push_partner = Workflow(name="pushPartner", payload=Upload,
                        throttle=Throttle(limit=1, period="1h", max_queued=2))
# One each 5 s per user; a start may wait 12 s for its turn, urgent ones first.
sync_crm = Workflow(name="syncCrm", payload=Upload,
                    throttle=Throttle(limit=1, period="5s", key="userId"),
                    priority="urgent ? 100 : 0", timeouts=Timeouts(start="12s"),
                    on_failure="throttleFailed")
throttle_failed = Workflow(name="throttleFailed", payload=FailureReport)
# Two workflows sharing one pace per user: one call a minute to the partner's API between
# them (a throttle pool).
partner_push = Workflow(name="partnerPush", payload=Upload,
                        throttle=Throttle(limit=1, period="1m", key="userId", pool="partner"))
partner_pull = Workflow(name="partnerPull", payload=Upload,
                        throttle=Throttle(limit=1, period="1m", key="userId", pool="partner"))

# One call each 10 s per user and two each 10 s in all (several throttles): a start goes
# when both have room. At most three wait for the pace in all.
call_partner = Workflow(name="callPartner", payload=Upload,
                        throttle=[Throttle(limit=1, period="10s", key="userId"),
                                  Throttle(limit=2, period="10s", max_queued=3)],
                        timeouts=Timeouts(start="1m"), on_failure="throttleFailed")

# The same two paces with nothing else declared (no cap, no timeout).
paced_twice = Workflow(name="pacedTwice", payload=Upload,
                       throttle=[Throttle(limit=1, period="10s", key="userId"),
                                 Throttle(limit=2, period="10s")])

app = App([low_stock_alert, resize_image, push_partner, sync_crm, throttle_failed,
           partner_push, partner_pull, call_partner, paced_twice])
# callPartner redeclared with its per-user throttle only.
call_partner_per_user = App([throttle_failed, Workflow(
    name="callPartner", payload=Upload, throttle=Throttle(limit=1, period="10s", key="userId"),
    on_failure="throttleFailed")])
# callPartner taken out of the declarations (its handler stays).
without_call_partner = App([throttle_failed])
# The same, after syncCrm was taken out of the declarations (its handler stays).
without_sync_crm = App([low_stock_alert, resize_image, push_partner, throttle_failed,
                        partner_push, partner_pull])
# The same, after partnerPush left the pool's declarations.
without_partner_push = App([low_stock_alert, resize_image, push_partner, sync_crm,
                            throttle_failed, partner_pull])
