"""Imports point only downward: the core package imports nothing of ours but itself; DAGs,
plugins and Spark jobs import the core, never the workshop; the workshop may import the core."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "include" / "tidemark"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _offending(paths, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for path in paths:
        hits = sorted(m for m in _imports(path) if m.split(".")[0] in forbidden)
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    return bad


def test_the_core_imports_neither_airflow_nor_the_plugins_nor_the_workshop():
    assert _offending(CORE.rglob("*.py"), ("airflow", "tidemark_airflow", "tidemark_workshop")) == {}


@pytest.mark.parametrize("folder", ["dags", "plugins", "spark_jobs"])
def test_dags_plugins_and_jobs_never_import_the_workshop(folder):
    assert _offending((ROOT / folder).rglob("*.py"), ("tidemark_workshop",)) == {}


def test_the_workshop_is_not_in_the_airflow_image():
    mounts = [line.strip() for line in (ROOT / "docker-compose.yaml").read_text().splitlines()
              if line.strip().startswith("- ./")]
    assert "- ./include/tidemark:/opt/airflow/include/tidemark" in mounts
    assert not [m for m in mounts if m.startswith("- ./include:") or "tidemark_workshop" in m], mounts


# The core's folders from the bottom up, as the README's diagram reads: a module imports (at the top or
# inside a function alike) only from its own folder or the folders below it.
LAYERS = ("protocol", "spark", "ledger", "realtime", "batch", "sink", "streams", "reconcile", "status")


def _module(path: Path) -> str:
    parts = path.relative_to(CORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_modules() -> dict[str, Path]:
    return {_module(path): path for path in CORE.rglob("*.py")}


def _imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The core modules ``path`` imports: ``from tidemark.a import b`` names tidemark.a.b when b is a
    module, else tidemark.a."""
    found = set()
    for name in _imports(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith("tidemark."):
            found.add(name)
    return found


def _layer(module: str) -> str:
    return module.split(".")[1]


def test_the_core_has_only_its_layer_folders():
    assert sorted(p.name for p in CORE.iterdir() if p.name != "__pycache__") == sorted(LAYERS)


def test_no_core_module_imports_up_the_layers():
    modules = _core_modules()
    upward = {}
    for module, path in modules.items():
        mine = LAYERS.index(_layer(module))
        up = sorted(m for m in _imported_modules(path, modules) if LAYERS.index(_layer(m)) > mine)
        if up:
            upward[module] = up
    assert upward == {}


def test_no_import_cycle_among_the_core_modules():
    modules = _core_modules()
    graph = {m: _imported_modules(p, modules) - {m} for m, p in modules.items()}
    # a package's __init__ importing its own modules is how it presents them, not a cycle
    graph = {m: {d for d in deps if not m.startswith(d + ".") and not d.startswith(m + ".")} if
             modules[m].name == "__init__.py" else {d for d in deps if not m.startswith(d + ".")}
             for m, deps in graph.items()}
    cycles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == "open":
                cycles.append(trail[trail.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, trail + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_layer_checks_see_lazy_imports():
    """A function's own import counts like the module's (the checks above would miss it otherwise)."""
    modules = _core_modules()
    assert "tidemark.ledger" in _imported_modules(CORE / "batch" / "repair.py", modules)


def test_only_the_ledger_writes_the_control_schema():
    """Every INSERT, UPDATE and DELETE on tidemark_control is a statement of ``tidemark.ledger`` (called with
    the caller's cursor where it shares the data's transaction)."""
    import re

    write = re.compile(r"(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+tidemark_control\.", re.I)
    found = {str(p.relative_to(CORE)): len(hits) for p in CORE.rglob("*.py")
             if p.relative_to(CORE).parts[0] != "ledger" and (hits := write.findall(p.read_text()))}
    assert found == {}
    assert any(write.search(p.read_text()) for p in (CORE / "ledger").rglob("*.py"))  # the check sees them
