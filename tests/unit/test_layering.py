"""The packages are layered, each importing only those below it (issue 18, points 2 and 3):

    config, kafkautil, tracing < declare < schemas < topology < engine < admission
        < client < ops, testing

so a declaration loads nothing of Kafka's records, a record nothing of a topic's layout,
and the engine nothing of what its stages do. Two packages import less than the layers
below them: the engine only `config` and `kafkautil` (it is told the rest through the
topology it runs), and the client neither the engine nor admission (a producer-only
process loads no stage and no RocksDB). Every import counts, those inside functions too:
a lazy import is still a dependency."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import sluicegate

PACKAGE = Path(sluicegate.__file__).parent
LAYERS = {"config": 0, "kafkautil": 0, "tracing": 0, "declare": 1, "schemas": 2, "topology": 3,
          "engine": 4, "admission": 5, "client": 6, "ops": 7, "testing": 7, "__main__": 8}
# The packages of sluicegate each of these imports, beside its own modules.
ONLY = {
    "engine": {"config", "kafkautil"},
    "client": {"config", "kafkautil", "tracing", "declare", "schemas", "topology"},
}


def _module(path: Path) -> str:
    return ".".join(("sluicegate", *path.relative_to(PACKAGE).with_suffix("").parts))


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "sluicegate" or len(parts) == 1 or parts[1] == "__init__":
        return None  # the package's root holds only its version
    return parts[1]


def _layer(module: str) -> int | None:
    package = _package(module)
    return None if package is None else LAYERS[package]


def _imports(path: Path, module: str) -> set[str]:
    """Every module `path` (the module `module`) imports, relative imports resolved; for
    `from a import b`, both `a` and `a.b` (b may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module
            if node.level:
                parent = module.split(".")[:-node.level]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            if base:
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _upward(module: str, imports: set[str]) -> list[str]:
    own = _layer(module)
    return sorted(f"{module} imports {imported}" for imported in imports
                  if own is not None and (layer := _layer(imported)) is not None
                  and layer > own)


def _beyond_only(module: str, imports: set[str]) -> list[str]:
    own = _package(module)
    if own not in ONLY:
        return []
    return sorted(f"{module} imports {imported}" for imported in imports
                  if (package := _package(imported)) is not None
                  and package != own and package not in ONLY[own])


def _every_module() -> list[tuple[str, set[str]]]:
    return [(_module(path), _imports(path, _module(path)))
            for path in sorted(PACKAGE.rglob("*.py"))]


def test_no_package_imports_one_above_it() -> None:
    assert [found for module, imports in _every_module()
            for found in _upward(module, imports)] == []


def test_the_engine_and_the_client_import_only_what_they_may() -> None:
    assert [found for module, imports in _every_module()
            for found in _beyond_only(module, imports)] == []


def test_the_layering_tests_see_what_they_must(tmp_path: Path) -> None:
    """The tests above can fail: an import inside a function, one spelt `from sluicegate
    import x`, a relative one, and an import by the engine of a layer below it."""
    (tmp_path / "m.py").write_text("def f():\n    from sluicegate.admission.app import X\n"
                                   "from sluicegate import ops\n"
                                   "from ..topology import topics\n"
                                   "from .store import StoreTransaction\n")
    imports = _imports(tmp_path / "m.py", "sluicegate.engine.runtime")
    assert _upward("sluicegate.engine.runtime", imports) == [
        "sluicegate.engine.runtime imports sluicegate.admission.app",
        "sluicegate.engine.runtime imports sluicegate.admission.app.X",
        "sluicegate.engine.runtime imports sluicegate.ops",
    ]
    assert _beyond_only("sluicegate.engine.runtime", imports) == [
        "sluicegate.engine.runtime imports sluicegate.admission.app",
        "sluicegate.engine.runtime imports sluicegate.admission.app.X",
        "sluicegate.engine.runtime imports sluicegate.ops",
        "sluicegate.engine.runtime imports sluicegate.topology",
        "sluicegate.engine.runtime imports sluicegate.topology.topics",
    ]
    assert _beyond_only("sluicegate.client.producer", imports) == [
        "sluicegate.client.producer imports sluicegate.admission.app",
        "sluicegate.client.producer imports sluicegate.admission.app.X",
        "sluicegate.client.producer imports sluicegate.engine.store",
        "sluicegate.client.producer imports sluicegate.engine.store.StoreTransaction",
        "sluicegate.client.producer imports sluicegate.ops",
    ]


def test_a_producer_only_process_loads_no_stage_and_no_rocksdb() -> None:
    probe = ("import sys, sluicegate.client; "
             "print('rocksdict' in sys.modules, "
             "any(m.startswith(('sluicegate.admission', 'sluicegate.engine')) "
             "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    assert out.stdout.split() == ["False", "False"]
