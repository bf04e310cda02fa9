"""Declarations the cancelOn and bulk-operation tests run against (seed 000's examples)."""

from pydantic import BaseModel

from sluicegate.declare import App, CancelOn, Debounce, Workflow


class Tour(BaseModel):
    rowId: str
    issueKey: str


class JiraIssueDeleted(BaseModel):
    issueKey: str


ISSUE_DELETED = "jira.issue.deleted"

_on_delete = CancelOn(event=ISSUE_DELETED, schema=JiraIssueDeleted,
                      match="event.issueKey == payload.issueKey")

# Seed 000's tourNarration: a run that may sleep for hours when its issue is deleted.
tour = Workflow(name="tourNarration", payload=Tour, cancel_on=[_on_delete])

# Edits of a row collapse for a minute: a queued start that must not run after the delete.
edits = Workflow(name="tourEdits", payload=Tour, debounce=Debounce(key="rowId", period="1m"),
                 cancel_on=[_on_delete])

# No cancelOn: the event never touches it.
plain = Workflow(name="plainTour", payload=Tour)

app = App([tour, edits, plain])
