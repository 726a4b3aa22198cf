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
