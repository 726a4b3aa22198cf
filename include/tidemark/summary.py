"""One machine-readable line per step, for the demo summary and for ops grepping task logs."""

from __future__ import annotations

import json
import re

MARKER = "tidemark-summary"


def summary_line(step: str, **facts: object) -> str:
    return f"{MARKER} {json.dumps({'step': step, **facts}, sort_keys=True, default=str)}"


def parse_summaries(text: str) -> list[dict]:
    """Summary lines found in a log, in order; tolerant of log prefixes and suffixes."""
    return [json.loads(m) for m in re.findall(rf"{MARKER} (\{{.*?\}})(?=\s*(?:\[|$))", text, flags=re.M)]
