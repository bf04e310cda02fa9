"""The docs stay usable: every decision record is in the index, the files and benchmark
modules the docs name exist, and no doc names a path of one machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "docs" / "decisions"
INDEX = DECISIONS / "README.md"
# What a reader of the repository reads: the README, docs/ and the benchmark notes.
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").glob("*.md")])
# A file of the repository named in a doc, as `docs/x.md` or `bench/gate.py`.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:docs|bench|examples|tests|sluicegate)/[\w./-]*\w\.(?:md|py|json))")
# The module of `python -m bench.<module>`.
BENCH_MODULE = re.compile(r"-m (bench\.\w+)")
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|tmp|home|root|Users)/")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_decision_record_is_listed_in_the_index_once() -> None:
    links = re.findall(r"\]\(([\w.-]+\.md)\)", INDEX.read_text(encoding="utf-8"))
    records = sorted(p.name for p in DECISIONS.glob("*.md") if p != INDEX)
    assert sorted(set(records) - set(links)) == [], "list each in docs/decisions/README.md"
    assert sorted(set(links) - set(records)) == [], "the index names records that do not exist"
    assert sorted(n for n in set(links) if links.count(n) > 1) == [], "listed twice"


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_the_files_a_doc_names_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    named = set(REPO_PATH.findall(text))
    # A record may name its neighbours without the folder (`see store-writes.md`).
    if doc.parent == DECISIONS:
        named |= {f"docs/decisions/{n}" for n in re.findall(r"(?<![\w/.-])([a-z0-9-]+\.md)\b", text)
                  if n != "README.md"}
    assert sorted(n for n in named if not (ROOT / n).exists()) == []


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_the_benchmark_modules_a_doc_runs_exist(doc: Path) -> None:
    modules = set(BENCH_MODULE.findall(doc.read_text(encoding="utf-8")))
    assert sorted(m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).exists()) == []


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_a_doc_names_no_path_of_one_machine(doc: Path) -> None:
    lines = doc.read_text(encoding="utf-8").splitlines()
    found = [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if MACHINE_PATH.search(line)]
    assert found == [], "name paths relative to the repository"


def test_the_readme_testing_example_runs() -> None:
    """The example of "Testing your declarations" is a test that passes as written."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Testing your declarations", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    preamble = ("import json\n"
                "from pydantic import BaseModel\n"
                "from sluicegate.declare import App, Debounce, Workflow\n"
                "class Edit(BaseModel):\n"
                "    rowId: str\n"
                "    text: str\n")
    namespace: dict[str, object] = {}
    exec(compile(preamble + code, "README.md", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert len(tests) == 1
    for test in tests:
        test()


def test_the_readme_names_the_options_users_looked_for_there() -> None:
    """Issue 36, point 10: debounce's `events=`, `max_events` and `max_bytes`, and that a
    workflow declaring several throttles names no throttle pool."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    declaring = readme.split("## Declaring flow control", 1)[1].split("\n## ", 1)[0]
    for option in ("events=", "max_events", "max_bytes"):
        assert option in declaring
    assert re.search(r"several throttles names no\s+throttle pool", declaring)
