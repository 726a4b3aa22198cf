"""pyproject.toml names the direct dependencies; requirements.txt locks them at the same versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[=<>!~ ;\[]", requirement, maxsplit=1)[0]).lower()


def _lock() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_name(name)] = version.strip()
    return pins


def test_every_direct_dependency_is_pinned_and_locked_at_its_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    assert direct and all("==" in r for r in direct), "pyproject.toml pins every direct dependency with =="
    lock = _lock()
    assert {r for r in direct if lock.get(_name(r)) != r.split("==", 1)[1].strip()} == set()


def test_one_list_of_direct_dependencies():
    assert not (ROOT / "requirements.in").exists(), "pyproject.toml is the one list of direct dependencies"
