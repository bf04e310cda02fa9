"""Decisions printed as they are written to the ledger, one coloured line each: what
`sluicegate ledger tail` and `sluicegate demo` show (the line itself is
`sluicegate.ops.services.formatting.decision_line`)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.text import Text

from sluicegate.config import Settings
from sluicegate.ops import signals
from sluicegate.ops.services.formatting import decision_line
from sluicegate.ops.services.readers import Tail
from sluicegate.schemas import codec
from sluicegate.schemas.records import LedgerRecord
from sluicegate.topology.topics import Topics


def print_decision(console: Console, row: LedgerRecord) -> None:
    line = decision_line(row)
    text = Text(line.head)
    text.append(line.outcome, style=line.colour)
    text.append(line.rest)
    console.print(text, highlight=False)


def follow(settings: Settings, workflow: str | None, *, timeout_s: float = 3.0) -> None:
    """Print decisions from now on until Ctrl-C; the first line (on stderr) says the
    tail has begun, so nothing written after it is missed."""
    signals.ctrl_c_stops()
    topic = Topics(settings).ledger
    tail = Tail(settings, topic, f"{settings.namespace}ledger-tail", timeout_s=timeout_s)
    try:
        which = f" of {workflow}" if workflow else ""
        typer.echo(f"following the decisions{which} on {topic} from now (Ctrl-C stops)",
                   err=True)
        console = Console(soft_wrap=True)
        while True:
            for msg in tail.records(0.5):
                value = msg.value()
                if value is None:
                    continue
                try:
                    record = codec.decode(LedgerRecord, value)
                except codec.DecodeError:
                    continue
                if workflow is None or record.workflow == workflow:
                    print_decision(console, record)
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        tail.close()
