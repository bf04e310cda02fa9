"""The packages are layered, each importing only those below it (issue 18, point 3):

    config, kafkautil < declare < schemas < topology < streams < client < ops, testing

so a declaration loads nothing of Kafka's records, a record nothing of a topic's layout,
and a producer-only process no stage and no RocksDB. Every import counts, those inside
functions too: a lazy import is still a dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sluicegate

PACKAGE = Path(sluicegate.__file__).parent
LAYERS = {"config": 0, "kafkautil": 0, "declare": 1, "schemas": 2, "topology": 3,
          "engine": 4, "admission": 4, "client": 5, "ops": 6, "testing": 6, "__main__": 7}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "sluicegate" or len(parts) == 1 or parts[1] == "__init__":
        return None  # the package's root holds only its version
    return LAYERS[parts[1]]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_package_imports_one_above_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("sluicegate", *path.relative_to(PACKAGE).with_suffix("").parts))
        own = _layer(module)
        if own is None:
            continue
        for imported in _imports(path):
            layer = _layer(imported)
            if layer is not None and layer > own:
                upward.append(f"{module} imports {imported}")
    assert upward == []


def test_the_layering_test_sees_an_upward_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f():\n    from sluicegate.engine.store import X\n")
    assert _layer(next(iter(_imports(tmp_path / "m.py")))) == LAYERS["engine"]


def test_a_producer_only_process_loads_no_stage_and_no_rocksdb() -> None:
    probe = ("import sys, sluicegate.client; "
             "print('rocksdict' in sys.modules, "
             "any(m.startswith('sluicegate.admission.stages') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    assert out.stdout.split() == ["False", "False"]
