"""The golden examples of docs/wire-format.md: for every record type, a value, its schema's
fingerprint and its exact bytes on the wire (docs/wire-format/golden.json), and the pinned
fingerprints the page lists. A Go or Java author tests a decoder against the same file, so
a change of bytes here is a change of the contract: it must come with a new release's
schemas (docs/wire-format.md, Schema changes between releases) and an updated file."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import fastavro
import pytest

from sluicegate.schemas import codec
from sluicegate.schemas.codec import NAMED_TYPES, RECORD_TYPES, parse_writer_schema
from sluicegate.schemas.payloads import Keyring
from tests.unit.test_codec import PINNED_FINGERPRINTS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "wire-format.md"
GOLDEN = json.loads((ROOT / "docs" / "wire-format" / "golden.json").read_text(encoding="utf-8"))
EXAMPLES: list[dict[str, Any]] = GOLDEN["records"]
# The fast paths (C or generated Python) and fastavro alone must give the same bytes.
CODECS = {"fast": codec.Codec(), "fastavro": codec.Codec(fast=False)}


def record_of(example: dict[str, Any]) -> Any:
    """The example's value, read from its Avro JSON encoding with the type's schema."""
    rs = RECORD_TYPES[NAMED_TYPES[example["type"]]]
    text = io.StringIO(json.dumps(example["value"]))
    (data,) = list(fastavro.json_reader(text, parse_writer_schema(rs.schema)))
    return rs.from_avro(data)


@pytest.mark.parametrize("which", sorted(CODECS))
@pytest.mark.parametrize("example", EXAMPLES, ids=[e["type"] for e in EXAMPLES])
def test_a_golden_value_encodes_to_its_bytes_and_its_bytes_decode_to_it(
        example: dict[str, Any], which: str) -> None:
    value = record_of(example)
    frame = CODECS[which].encode(value)
    assert frame.hex() == example["frame"], (
        f"{example['type']} no longer encodes to its golden bytes; now {frame.hex()}")
    assert CODECS[which].decode(type(value), bytes.fromhex(example["frame"])) == value


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["type"] for e in EXAMPLES])
def test_a_golden_frame_is_the_marker_the_fingerprint_and_the_body(
        example: dict[str, Any]) -> None:
    frame = bytes.fromhex(example["frame"])
    rs = RECORD_TYPES[NAMED_TYPES[example["type"]]]
    assert frame[:2] == b"\xc3\x01"
    assert frame[2:10].hex() == example["fingerprint"] == rs.fingerprint.hex()
    # The body alone is plain Avro binary: what a registry frame (00 + id) carries too.
    body = fastavro.schemaless_reader(io.BytesIO(frame[10:]), parse_writer_schema(rs.schema))
    assert rs.from_avro(body) == record_of(example)


def test_every_record_type_has_exactly_one_golden_example() -> None:
    assert sorted(e["type"] for e in EXAMPLES) == sorted(
        rs.full_name for rs in RECORD_TYPES.values())


def pinned_in_doc() -> dict[str, tuple[str, str]]:
    """The doc's fingerprint table: full name -> (frame bytes, parsingFingerprint64)."""
    rows = re.findall(r"^\| `(io\.sluicegate\.\w+)` \| `([0-9a-f]{16})` \| `0x([0-9a-f]{16})` \|",
                      DOC.read_text(encoding="utf-8"), flags=re.M)
    return {name: (frame, long) for name, frame, long in rows}


def test_the_doc_pins_the_current_fingerprint_of_every_record_type() -> None:
    assert pinned_in_doc() == {
        rs.full_name: (rs.fingerprint.hex(), rs.fingerprint[::-1].hex())
        for rs in RECORD_TYPES.values()
    }
    assert {name.removeprefix("io.sluicegate."): frame
            for name, (frame, _) in pinned_in_doc().items()} == {
        name: pinned[-1] for name, pinned in PINNED_FINGERPRINTS.items()}


def test_the_golden_sealed_payload_opens_with_its_key_to_the_json_it_sealed() -> None:
    sealed = GOLDEN["sealed_payload"]
    assert sealed["sealed"].startswith("sg1:golden:")
    keys = Keyring.parse(sealed["encryption_keys"])
    assert keys.open(sealed["sealed"].encode()) == sealed["opened"].encode()


# -- the golden examples are what a worker writes today (issue 36, point 4) --------------


@pytest.fixture(scope="module")
def live() -> dict[str, Any]:
    from tests.unit.golden_scenario import records

    return records()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["type"] for e in EXAMPLES])
def test_a_golden_example_is_what_a_worker_writes_today(
        example: dict[str, Any], live: dict[str, Any]) -> None:
    written = live[example["type"]]
    assert record_of(example) == written, (
        f"a worker now writes {written!r}; if that change is meant, write the golden file "
        "again (python -m tests.unit.golden_scenario --write) and say so in the release")


def test_a_bulk_cancel_is_named_after_its_operation_and_run(live: dict[str, Any]) -> None:
    command = live["io.sluicegate.EngineCommand"]
    operation = live["io.sluicegate.RunOperation"]
    assert command.command_id == (
        f"bulk-cancel:{operation.operation}:{operation.execution_id}")
    golden = next(e for e in EXAMPLES if e["type"] == "io.sluicegate.EngineCommand")
    assert golden["value"]["command_id"] == command.command_id


# -- the canonical forms and the murmur2 vectors the doc publishes -----------------------

CANONICAL_PAGE = ROOT / "docs" / "wire-format" / "canonical-forms.md"


def test_the_canonical_forms_page_is_current() -> None:
    from sluicegate.schemas.canonical import markdown

    assert CANONICAL_PAGE.read_text(encoding="utf-8") == markdown(), (
        "regenerate it: python -m sluicegate.schemas.canonical > "
        "docs/wire-format/canonical-forms.md")


def test_the_canonical_forms_page_gives_each_type_the_text_its_fingerprint_is_of() -> None:
    page = CANONICAL_PAGE.read_text(encoding="utf-8")
    sections = re.findall(r"^## `(io\.sluicegate\.\w+)`\n\nframe bytes `([0-9a-f]{16})`.*?"
                          r"```json\n(.*?)\n```", page, flags=re.M | re.S)
    assert sorted(name for name, _, _ in sections) == sorted(
        rs.full_name for rs in RECORD_TYPES.values())
    for _name, frame, form in sections:
        assert codec.schema_fingerprint(form).hex() == frame
        assert "logicalType" not in form and "namespace" not in form


def murmur2_vectors_in_doc() -> list[tuple[bytes, int, int, int]]:
    section = DOC.read_text(encoding="utf-8").split("**murmur2 test vectors.**", 1)[1]
    rows = re.findall(r"^\| [^|]+ \| `([0-9a-f]*)` \| (-?\d+) \| (\d+) \| (\d+) \|$",
                      section.split("\n\n", 2)[1], flags=re.M)
    return [(bytes.fromhex(h), int(m), int(p6), int(p12)) for h, m, p6, p12 in rows]


def test_the_docs_murmur2_vectors_are_what_sluicegate_computes() -> None:
    from sluicegate.schemas.murmur2 import murmur2, partition_for, python_murmur2

    vectors = murmur2_vectors_in_doc()
    assert len(vectors) >= 10
    assert {len(key) % 4 for key, *_ in vectors} == {0, 1, 2, 3}
    for key, hashed, of6, of12 in vectors:
        assert murmur2(key) == python_murmur2(key) == hashed, key
        assert (partition_for(key, 6), partition_for(key, 12)) == (of6, of12), key
