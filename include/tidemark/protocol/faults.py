"""Kill points for the kill -9 trials: ``TIDEMARK_KILL_AT=<point>:<n>`` makes the n-th pass
through ``point(<point>)`` kill the job's whole process group with SIGKILL, exactly as ``kill -9``
of the job would, at a moment a timer cannot hit reliably (between staging and commit, between
the commit and the dead-letter write). Unset, as in every real deployment: ``point`` does nothing.
"""

from __future__ import annotations

import os
import signal

from tidemark.protocol.config import environment

ENV = "TIDEMARK_KILL_AT"
POINTS = ("staged", "before_commit", "committed", "dlq_published")
_passes: dict[str, int] = {}


def point(name: str) -> None:
    spec = environment().kill_at
    if not spec:
        return
    where, _, nth = spec.partition(":")
    if where != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] >= int(nth or 1):
        print(f"tidemark fault: kill -9 at {name} (pass {_passes[name]})", flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)
