"""Sealing payloads (sluicegate/schemas/payloads.py): keys, rotation, refusals."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from sluicegate.declare import Workflow
from sluicegate.schemas.payloads import (
    MARKER,
    Keyring,
    KeyringError,
    Payloads,
    SealError,
    generate_key,
    is_sealed,
)
from tests.apps.sealed import KEY_A, KEY_B


class P(BaseModel):
    note: str


SEALED = Workflow(name="s", payload=P, encrypt_payloads=True)
PLAIN = Workflow(name="p", payload=P)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)


def _payloads(keys: str) -> Payloads:
    return Payloads(Keyring.parse(keys))


@given(json_values)
def test_what_is_sealed_opens_to_the_same_data_and_shows_none_of_it(data: Any) -> None:
    payloads = _payloads(KEY_A)
    sealed = payloads.seal(SEALED, {"v": data})
    assert sealed.startswith(MARKER + b"a:")
    assert payloads.open(sealed) == {"v": data}
    assert sealed.isascii()


def test_a_workflow_without_encrypt_payloads_keeps_its_json_as_written() -> None:
    payloads = _payloads(KEY_A)
    assert payloads.seal(PLAIN, {"note": "x"}) == b'{"note":"x"}'
    assert payloads.open(b'{"note":"x"}') == {"note": "x"}
    assert not is_sealed(b'{"note":"x"}')


def test_after_rotation_the_newest_key_seals_and_the_old_one_still_opens() -> None:
    old = _payloads(KEY_A).seal(SEALED, {"note": "before"})
    rotated = _payloads(f"{KEY_B},{KEY_A}")
    assert rotated.open(old) == {"note": "before"}
    assert rotated.seal(SEALED, {"note": "after"}).startswith(MARKER + b"b:")


def test_a_payload_whose_key_was_dropped_names_the_key_it_needs() -> None:
    old = _payloads(KEY_A).seal(SEALED, {"note": "before"})
    with pytest.raises(SealError, match=r"sealed under key 'a', which is not among the "
                                        r"configured encryption keys \(b\)"):
        _payloads(KEY_B).open(old)


def test_an_altered_payload_does_not_open() -> None:
    sealed = bytearray(_payloads(KEY_A).seal(SEALED, {"note": "x"}))
    sealed[-5] = ord("A") if sealed[-5] != ord("A") else ord("B")
    with pytest.raises(SealError, match="does not open with that key"):
        _payloads(KEY_A).open(bytes(sealed))


def test_a_key_replaced_under_the_same_id_is_refused_not_misread() -> None:
    sealed = _payloads(KEY_A).seal(SEALED, {"note": "x"})
    other = "a:" + base64.urlsafe_b64encode(b"Z" * 32).decode()
    with pytest.raises(SealError, match="does not open"):
        _payloads(other).open(sealed)


def test_a_sealed_payload_without_keys_is_a_clear_error() -> None:
    sealed = _payloads(KEY_A).seal(SEALED, {"note": "x"})
    with pytest.raises(SealError, match="no encryption keys are configured"):
        Payloads(None).open(sealed)
    with pytest.raises(SealError, match="no encryption key is configured"):
        Payloads(None).seal(SEALED, {"note": "x"})


def test_standard_base64_and_generated_keys_are_accepted() -> None:
    standard = "k1:" + base64.b64encode(b"\xfb" * 32).decode().rstrip("=")
    assert Keyring.parse(f"{generate_key('k2')}, {standard}").ids == ("k2", "k1")


@pytest.mark.parametrize(("keys", "message"), [
    ("k1", r"encryption key 1 \(k1\): write it as id:base64key"),
    (":abc", r"encryption key 1 \(no id\): write it as id:base64key"),
    ("k1:AAAA", r"encryption key 1 \(k1\): the key is 3 bytes, it must be 32"),
    ("k1:not base64!", r"encryption key 1 \(k1\): the key is not base64"),
    (f"{KEY_A},{KEY_A}", r"encryption key 2 \(a\): the id 'a' is listed twice"),
])
def test_a_malformed_key_list_is_refused_with_the_entry_it_is_about(keys: str,
                                                                    message: str) -> None:
    with pytest.raises(KeyringError, match=message):
        Keyring.parse(keys)


def test_an_unsealed_report_payload_reaches_only_a_handler_that_seals_its_own() -> None:
    payloads = _payloads(KEY_A)
    sealed = payloads.seal(SEALED, {"note": "x"})
    handler_sealed = Workflow(name="h", payload=P, encrypt_payloads=True)
    assert payloads.for_report(sealed, handler_sealed) == {"note": "x"}
    text = payloads.for_report(sealed, PLAIN)
    assert text == sealed.decode() and payloads.open(text.encode()) == {"note": "x"}
    assert payloads.for_report(json.dumps({"note": "y"}).encode(), PLAIN) == {"note": "y"}
