"""The batch state machine: the ledger's moves are the protocol document's arrows (issue 54, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

from tidemark.ledger import FINAL, MOVES

DOC = Path(__file__).resolve().parents[2] / "docs" / "control-protocol.md"


def _arrows(row: str) -> dict[str, set[str]]:
    """``a -> b -> c | d`` (the document's table, in backticks) as target -> the states it comes from."""
    chain = [[s.strip("` ") for s in step.split("|")] for step in row.split("→")]
    moves: dict[str, set[str]] = {}
    for before, after in zip(chain, chain[1:]):
        for state in after:
            moves.setdefault(state, set()).update(before)
    return moves


def test_an_attempt_commits_only_from_sealed_and_nothing_leaves_a_final_state():
    assert MOVES["committed"] == ("sealed",)
    assert all(state not in froms for froms in MOVES.values() for state in FINAL)
    assert set(MOVES) == {"sealed", *FINAL}


def test_the_documents_attempt_states_are_the_ledgers_moves():
    row = next(line for line in DOC.read_text().splitlines() if line.startswith("| `batch_attempts.state`"))
    body = row.split(") |", 1)[1].strip().removesuffix("|").replace("\\|", "|")  # the table's escaped pipes
    arrows = _arrows(body)
    # the document draws the forward path; every final state but superseded also leaves an open attempt (an abort,
    # a refusal of what never sealed), and a new attempt supersedes an open or sealed one
    assert arrows["sealed"] == {"open"} and arrows["committed"] == {"sealed"}
    assert set(MOVES["committed"]) == arrows["committed"] and set(MOVES["sealed"]) == arrows["sealed"]
    assert {s for s in arrows if s not in ("open",)} == set(MOVES), re.sub(r"\s+", " ", row)
