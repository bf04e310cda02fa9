"""Declarations for cancelOn discarding queued starts: one workflow per queue a start can
wait in (concurrency, throttle, batch, debounce, pause, a delayed `at`), all cancelled by
seed 000's `jira.issue.deleted`."""

from pydantic import BaseModel

from sluicegate.declare import (
    App,
    Batch,
    CancelOn,
    Concurrency,
    Debounce,
    Throttle,
    Workflow,
)
from tests.apps.operations import ISSUE_DELETED, JiraIssueDeleted, Tour


class Tours(BaseModel):
    items: list[Tour]


_on_delete = CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                      match="event.issueKey == payload.issueKey")

# One run at a time: the second start waits for the slot.
slot_tour = Workflow(name="slotTour", payload=Tour, concurrency=Concurrency(limit=1),
                     cancel_on=[_on_delete])
# One start a minute: the second waits for its turn.
pace_tour = Workflow(name="paceTour", payload=Tour,
                     throttle=Throttle(limit=1, period="1m"), cancel_on=[_on_delete])
# `match` reads the run's payload, so an item is judged as a batch of one.
_on_delete_item = CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                           match="event.issueKey == payload.items[0].issueKey")

# Items of a row batch for a minute.
batch_tour = Workflow(
    name="batchTour", payload=Tours, batch=Batch(item=Tour, key="rowId", max_size=10,
                                                 timeout="1m"),
    cancel_on=[_on_delete_item])
# Edits of a row collapse for a minute, then take one of five slots: a group defer lets go
# still passes a queue stage.
edit_tour = Workflow(name="editTour", payload=Tour, debounce=Debounce(key="rowId", period="1m"),
                     concurrency=Concurrency(limit=5), cancel_on=[_on_delete])
# The same two controls, one slot for the whole workflow: a group defer lets go waits
# there while another run holds it.
edit_slot_tour = Workflow(name="editSlotTour", payload=Tour,
                          debounce=Debounce(key="rowId", period="1m"),
                          concurrency=Concurrency(limit=1), cancel_on=[_on_delete])
# A row's items batched for a minute, then a queue stage: the batch run passes concurrency.
batch_slot_tour = Workflow(
    name="batchSlotTour", payload=Tours, batch=Batch(item=Tour, key="rowId", max_size=10,
                                                     timeout="1m"),
    concurrency=Concurrency(limit=5), cancel_on=[_on_delete_item])
# No control: its starts wait only while it is paused, or for their `at`.
paused_tour = Workflow(name="pausedTour", payload=Tour, cancel_on=[_on_delete])
later_tour = Workflow(name="laterTour", payload=Tour, cancel_on=[_on_delete])

app = App([slot_tour, pace_tour, batch_tour, edit_tour, edit_slot_tour, batch_slot_tour,
           paused_tour, later_tour])
