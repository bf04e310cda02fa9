"""Declarations the debounce, batch and delayed-start integration tests run against."""

from pydantic import BaseModel, model_validator

from sluicegate.declare import App, Batch, Debounce, FailureReport, Timeouts, Workflow


class Edit(BaseModel):
    rowId: str
    editedAt: int


class Edits(BaseModel):
    events: list[Edit]


class Click(BaseModel):
    siteId: str
    n: int = 0


class Clicks(BaseModel):
    items: list[Click]


class Row(BaseModel):
    table: str
    urgent: bool = False
    body: str = ""


class Rows(BaseModel):
    items: list[Row]

    @model_validator(mode="after")
    def _no_poison(self) -> "Rows":
        # What only the whole batch can judge: checked when the batch runs.
        if any(row.body == "poison" for row in self.items):
            raise ValueError("a batch may not carry a poison row")
        return self


# Seed 000's "twenty edits, one run": every edit is its own identity, one run per row.
tour = Workflow(
    name="tourNarration", payload=Edit, idempotency="rowId + ':' + editedAt",
    debounce=Debounce(key="'tour:' + rowId", period="15 minutes"),
)
capped = Workflow(
    name="tourCapped", payload=Edit,
    debounce=Debounce(key="rowId", period="5 minutes", timeout="30 minutes"),
)
# No cap: timeouts.start is the starvation guard.
guarded = Workflow(
    name="tourGuarded", payload=Edit,
    debounce=Debounce(key="rowId", period="5 minutes"),
    timeouts=Timeouts(start="1 hour"), on_failure="reportFailure",
)
# Every edit of the quiet window handed to the run, in arrival order (inngest issue 3695),
# at most 5 per run.
every_edit = Workflow(
    name="tourEveryEdit", payload=Edits,
    debounce=Debounce(key="rowId", period="15 minutes", events=Edit, max_events=5),
)
# Seed 003's save-clicks.
clicks = Workflow(
    name="saveClicks", payload=Clicks,
    batch=Batch(item=Click, key="siteId", max_size=100, timeout="10s"),
)
rows = Workflow(
    name="importRows", payload=Rows,
    batch=Batch(item=Row, key="table", max_size=100, timeout="10s", max_bytes=120,
                if_="!urgent"),
    on_failure="reportFailure",
)
report = Workflow(name="reportFailure", payload=FailureReport)
note = Workflow(name="note", payload=Edit)

app = App([tour, capped, guarded, every_edit, clicks, rows, report, note])
# The same deployment after tourNarration was removed from the declarations.
without_tour = App([capped, guarded, every_edit, clicks, rows, report, note])
