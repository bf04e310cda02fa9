"""The packages are layered, each importing only those below it (issue 18, points 2 and 3):

    config, kafkautil, tracing < declare < schemas < topology < engine < admission
        < client < ops, testing

so a declaration loads nothing of Kafka's records, a record nothing of a topic's layout,
and the engine nothing of what its stages do. Two packages import less than the layers
below them: the engine only `config` and `kafkautil` (it is told the rest through the
topology it runs), and the client neither the engine nor admission (a producer-only
process loads no stage and no RocksDB). Every import counts, those inside functions too:
a lazy import is still a dependency.

Inside `ops` (issue 36, point 5; docs/decisions/ops-services.md): the services
(`ops/services/`) import no other part of `ops` and load neither Typer, Click, Rich nor
Starlette, so that the command line and the inspect server sit on them and not the other
way round; the inspect server imports no command; no two `ops` modules import each other,
even through others; and no `ops` module uses another's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
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
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]  # a package's own module: imported by the package's name
    return ".".join(("sluicegate", *parts))


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


# -- inside ops ----------------------------------------------------------------------------

SERVICES = "sluicegate.ops.services"
# What renders for a terminal or serves HTTP: the command line's and the server's, never a
# service's.
FRONT_ENDS = ("typer", "click", "rich", "starlette", "uvicorn")


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _ops_modules() -> dict[str, set[str]]:
    """Every module of `ops` and the modules of `ops` it imports (not the names in them)."""
    found = {module: imports for module, imports in _every_module()
             if _within(module, "sluicegate.ops")}
    return {module: {i for i in imports if i in found and i != module}
            for module, imports in found.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other, directly or through others: each strongly
    connected group of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def _service_imports(module: str, imports: Iterable[str]) -> list[str]:
    """What a service imports that it must not: a front end, or a part of `ops` that is
    not a service."""
    if not _within(module, SERVICES):
        return []
    return sorted(f"{module} imports {imported}" for imported in imports
                  if imported.split(".")[0] in FRONT_ENDS
                  or (_within(imported, "sluicegate.ops") and imported != "sluicegate.ops"
                      and not _within(imported, SERVICES)))


def _private_names(path: Path, module: str) -> list[str]:
    """Each private name (`_x`, not `__x__`) `module` takes from another sluicegate module:
    imported by name, or read as an attribute of a module it imported."""
    def private(name: str) -> bool:
        return name.startswith("_") and not name.endswith("__")

    tree = ast.parse(path.read_text(), str(path))
    found = []
    aliases: dict[str, str] = {}  # a name bound to a sluicegate module -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*module.split(".")[:-node.level], *([base] if base else [])])
            if not _within(base, "sluicegate") or base == module:
                continue
            for alias in node.names:
                if private(alias.name) and not (PACKAGE.parent / Path(
                        *f"{base}.{alias.name}".split("."))).with_suffix(".py").exists():
                    found.append(f"{module} imports {base}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _within(alias.name, "sluicegate") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and private(node.attr)):
            found.append(f"{module} reads {aliases[node.value.id]}.{node.attr}")
    return sorted(found)


def test_no_ops_modules_import_each_other_in_a_circle() -> None:
    assert _circles(_ops_modules()) == []


def test_services_import_no_front_end_and_no_command() -> None:
    assert [found for module, imports in _every_module()
            for found in _service_imports(module, imports)] == []


def test_the_inspect_server_imports_no_command() -> None:
    imports = dict(_every_module())["sluicegate.ops.inspect"]
    assert sorted(i for i in imports if _within(i, "sluicegate.ops.cli")
                  or i.split(".")[0] in ("typer", "click")) == []


def test_no_ops_module_uses_another_s_private_names() -> None:
    ops = PACKAGE / "ops"
    assert [found for path in sorted(ops.rglob("*.py"))
            for found in _private_names(path, _module(path))] == []


def test_loading_the_services_loads_no_front_end() -> None:
    """Imported one by one in a fresh process, in turn: the first service after whose
    import a front end (Typer, Click, Rich, Starlette, uvicorn) is loaded, even through a
    package of another layer or a third party, is named."""
    services = sorted(module for module, _ in _every_module() if _within(module, SERVICES))
    probe = (
        "import importlib, sys\n"
        f"for name in {services!r}:\n"
        "    importlib.import_module(name)\n"
        f"    loaded = sorted(m for m in {FRONT_ENDS!r} if m in sys.modules)\n"
        "    if loaded:\n"
        "        print(name, 'loads', *loaded)\n"
        "        break\n"
        "print(len(" + repr(services) + "), 'imported')\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    assert out.stdout.splitlines() == [f"{len(services)} imported"]
    assert len(services) >= 10  # the probe saw the services, not an empty package


def test_the_ops_checks_see_what_they_must(tmp_path: Path) -> None:
    """The checks above can fail: a circle through a third module, a service importing
    Typer inside a function or a command module, a private name imported or read."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    (tmp_path / "m.py").write_text(
        "def f():\n    import typer\n"
        "from sluicegate.ops.cli import options\n"
        "from sluicegate.ops.services.ledger import LATEST, _INSERT\n"
        "from sluicegate.ops.services import runs as runs_mod\n"
        "from . import formatting\n"
        "x = runs_mod._apply_key, formatting._LABEL, formatting.iso\n")
    module = "sluicegate.ops.services.m"
    assert _service_imports(module, _imports(tmp_path / "m.py", module)) == [
        f"{module} imports sluicegate.ops.cli",
        f"{module} imports sluicegate.ops.cli.options",
        f"{module} imports typer",
    ]
    assert _private_names(tmp_path / "m.py", module) == [
        f"{module} imports sluicegate.ops.services.ledger._INSERT",
        f"{module} reads sluicegate.ops.services.formatting._LABEL",
        f"{module} reads sluicegate.ops.services.runs._apply_key",
    ]


# The cycle executor (engine/executor.py) reaches Kafka only through its CycleIO: the
# worker's or the test driver's in-memory log, which both run it.
EXECUTOR = "sluicegate.engine.executor"
EXECUTOR_MAY_NOT = ("confluent_kafka", "sluicegate.engine.runtime", "sluicegate.engine.recovery",
                    "sluicegate.testing")


def _imported_by(module: str) -> set[str]:
    return next(imports for name, imports in _every_module() if name == module)


def test_the_executor_imports_no_kafka_client_and_the_worker_and_the_driver_run_it() -> None:
    assert sorted(imported for imported in _imported_by(EXECUTOR)
                  if imported.startswith(EXECUTOR_MAY_NOT)) == []
    for runner in ("sluicegate.engine.runtime", "sluicegate.testing"):
        assert EXECUTOR in _imported_by(runner), runner
    assert "sluicegate.engine.runtime" not in _imported_by("sluicegate.testing"), (
        "the driver runs the executor, not a worker")
