"""State words live next to their edge table: "terminal attempt" is defined once."""

from __future__ import annotations

import ast
from pathlib import Path

from synthbatch.agent_stdlib import states

ROOT = Path(__file__).resolve().parents[4]
TERMINAL_NAMES = {"SUCCEEDED", "FAILED", "CANCELLED"}
TERMINAL_WORDS = set(states.TERMINAL)


def _terminal_sets(path: Path) -> list:
    """Module-level assignments of a set of exactly the terminal attempt states."""
    found = []
    for node in ast.parse(path.read_text()).body:
        value = getattr(node, "value", None)
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or value is None:
            continue
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        if not isinstance(value, (ast.Set, ast.Tuple, ast.List)):
            continue
        elts = {e.id if isinstance(e, ast.Name) else getattr(e, "value", None)
                for e in value.elts}
        if elts in (TERMINAL_NAMES, TERMINAL_WORDS):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_terminal_attempt_defined_once() -> None:
    homes = [hit for folder in ("control", "agent_stdlib")
             for path in sorted((ROOT / folder).rglob("*.py")) for hit in _terminal_sets(path)]
    assert homes == ["agent_stdlib/states.py:21"]


def test_shard_states_reuse_the_attempt_words() -> None:
    from synthbatch.control.runs import normalize as norm

    assert not hasattr(norm, "ATTEMPT_TERMINAL")
    assert set(states.ATTEMPT_STATES) - {states.SUBMITTED} <= set(norm.SHARD_STATES)
    assert norm.TERMINAL is states.TERMINAL
