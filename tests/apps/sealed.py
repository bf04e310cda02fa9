"""Declarations the payload-encryption tests run against: every workflow seals its payload,
and every control that reads a payload (keys, debounce, concurrency, batch `if`,
timeouts.start into onFailure, delayed starts) is on some route."""

import base64

from pydantic import BaseModel

from sluicegate.config import Settings
from sluicegate.declare import (
    App,
    Batch,
    Concurrency,
    Debounce,
    FailureReport,
    Timeouts,
    Workflow,
)

# Fixed test keys (32 bytes each): A, then the rotation B,A.
KEY_A = "a:" + base64.urlsafe_b64encode(b"A" * 32).decode()
KEY_B = "b:" + base64.urlsafe_b64encode(b"B" * 32).decode()


class Patient(BaseModel):
    patientId: str
    clinic: str
    note: str


class Visit(BaseModel):
    clinic: str
    note: str
    routine: bool = True


class Visits(BaseModel):
    items: list[Visit]


# Keys read fields other than `note`: a key's text is kept in clear (Kafka keys, ledger).
triage = Workflow(
    name="triage", payload=Patient, idempotency="patientId",
    debounce=Debounce(key="patientId", period="1 minute"),
    concurrency=Concurrency(limit=1, key="clinic"),
    timeouts=Timeouts(start="10 minutes"),
    on_failure="triageFailed", encrypt_payloads=True,
)
triage_failed = Workflow(name="triageFailed", payload=FailureReport, encrypt_payloads=True)
visits = Workflow(
    name="visits", payload=Visits,
    batch=Batch(item=Visit, key="clinic", max_size=3, timeout="30s", if_="routine"),
    encrypt_payloads=True,
)

app = App([triage, triage_failed, visits], settings=Settings(encryption_keys=KEY_A))
