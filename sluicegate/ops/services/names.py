"""Names an operator types, checked before anything acts on them.

A workflow named on the command line or over HTTP must be one the declarations given
declare, or, where none were given, one the cluster has seen: a start or decision in the
ledger, a live run in the runs table, or a row on the control table. A typo is refused
with the nearest names ("did you mean"), never turned into a pause row that pauses
nothing (docs/decisions/names-checked.md).

`check_workflow` is the pure part; `known_workflows` gathers the names for a process
that has no reader open, and `seen_workflows` for one that has (the inspect server).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.config import Settings

if TYPE_CHECKING:
    from sluicegate.declare import App
    from sluicegate.ops.services.ledger import LedgerDb
    from sluicegate.schemas.records import ControlRow, RunRow


class UnknownName(ValueError):
    """A name that is not among the known ones; the message says which are near."""

    def __init__(self, message: str, name: str, suggestions: list[str]) -> None:
        super().__init__(message)
        self.name = name
        self.suggestions = suggestions


def suggestions(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to `name`, best first (difflib's ratio, cutoff 0.6)."""
    return difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)


def check_workflow(name: str, known: Collection[str], *, what: str = "workflow",
                   where: str = "") -> None:
    """Raise UnknownName unless `name` is in `known`. `where` says what `known` is
    (`"declared in examples.demo"`, `"seen by this cluster"`) for the message."""
    if name in known:
        return
    near = suggestions(name, known)
    where_text = f" {where}" if where else ""
    message = f"no {what} {name!r}{where_text}"
    if near:
        message += "; did you mean " + " or ".join(repr(n) for n in near) + "?"
    elif known:
        shown = sorted(known)
        listed = ", ".join(shown[:10]) + (f" and {len(shown) - 10} more"
                                          if len(shown) > 10 else "")
        message += f" (known: {listed})"
    else:
        message += f"; there is no {what} at all yet"
    raise UnknownName(message, name, near)


def seen_workflows(db: LedgerDb, runs: Iterable[RunRow],
                   control: Mapping[str, ControlRow]) -> set[str]:
    """Every workflow the ledger copy has a row of (as it is now: refresh it first), every
    workflow with a live run, and every workflow with a control row."""
    result = db.query("SELECT DISTINCT workflow FROM ledger")
    names = {str(w) for (w,) in result.rows}
    names.update(run.workflow for run in runs)
    names.update(control)
    return names


def known_workflows(settings: Settings, app: App | None = None, *,
                    db: Path | None = None, timeout_s: float = 10.0) -> set[str]:
    """The names a command checks a workflow against: the declared ones when `app` is
    given; otherwise the ones the cluster has seen (the ledger, read into its DuckDB copy
    at `db` or the default one, the runs table and the control table)."""
    if app is not None:
        return set(app.workflows)
    from sluicegate.admission.control import ControlTable
    from sluicegate.ops.services.ledger import LedgerDb, default_db_path, refresh
    from sluicegate.ops.services.runs import RunsTable

    with LedgerDb(db or default_db_path(settings)) as ledger:
        refresh(ledger, settings, timeout_s=timeout_s)
        runs = RunsTable(settings)
        control = ControlTable(settings)
        try:
            runs.refresh(timeout_s)
            control.catch_up(timeout_s)
            return seen_workflows(ledger, runs.live.values(), control.rows)
        finally:
            runs.close()
            control.close()


def where_known(app_spec: str | None) -> str:
    """How a message names the names a workflow was checked against."""
    return f"declared in {app_spec}" if app_spec else "seen by this cluster (pass --app " \
        "to check against the declarations instead)"


def check_known(settings: Settings, name: str, app: App | None, app_spec: str | None) -> None:
    """`name` is a workflow of `app` (loaded from `app_spec`), or without one, one the
    cluster has seen; else UnknownName with a did-you-mean."""
    check_workflow(name, known_workflows(settings, app), where=where_known(app_spec))
