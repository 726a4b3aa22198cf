"""requirements.in names the direct dependencies; requirements.txt locks them at the same versions."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version.strip()
    return pins


def test_every_direct_dependency_is_locked_at_its_pinned_version():
    direct, lock = _pins(ROOT / "requirements.in"), _pins(ROOT / "requirements.txt")
    assert direct and all(direct.values()), "requirements.in pins every direct dependency with =="
    assert {n: v for n, v in direct.items() if lock.get(n) != v} == {}
