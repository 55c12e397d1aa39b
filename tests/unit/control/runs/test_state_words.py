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
    from synthbatch.control.runs.status import verdict as norm

    assert not hasattr(norm, "ATTEMPT_TERMINAL")
    assert set(states.ATTEMPT_STATES) - {states.SUBMITTED} <= set(norm.SHARD_STATES)
    assert norm.TERMINAL is states.TERMINAL


# The same letters used for something else than a run's, shard's or attempt's state.
NOT_A_STATE = {
    ("control/api.py", "submitted"): "a benchmark case's JSON key",
    ("control/cli/benchmark.py", "submitted"): "the same key read back",
    ("control/cli/retry.py", "submitted"): "the verb of a retry's message",
    ("control/runs/card.py", "unknown"): "a dataset card's licence and missing dates",
    ("control/runs/doctor.py", "unknown"): "a filesystem type not found",
    ("control/images/probe.py", "unknown"): "an image's OS not found",
    ("control/slurm/parsers.py", "unknown"): "Slurm's own word in squeue output",
    ("control/runs/status/index.py", "pending"): "the settled index's key of unsettled shards",
    ("control/runs/telemetry.py", "running"): "an engine's running requests (a JSON key)",
    ("control/runs/automerge.py", "failed"): "a merge on completion's outcome (MERGE_FAILED)",
    ("benchmarks/__main__.py", "failed"): "a benchmark's own outcome in the results file",
    ("benchmarks/proxy.py", "lost"): "events a stream lost (a figure's key)",
}


def test_no_state_word_is_spelled_outside_its_module() -> None:
    """A shard state is written as ``norm.X`` or ``states.X`` everywhere in the control
    plane and the benchmarks (which write records too): changing how a state is reported
    never means hunting bare strings (issue 29)."""
    from synthbatch.control.runs.status import verdict as norm
    words = set(norm.SHARD_STATES) | set(states.ATTEMPT_STATES)
    homes = {ROOT / "control/runs/status/verdict.py"}
    spelled = sorted({(path.relative_to(ROOT).as_posix(), node.value)
                      for folder in ("control", "benchmarks")
                      for path in sorted((ROOT / folder).rglob("*.py")) if path not in homes
                      for node in ast.walk(ast.parse(path.read_text()))
                      if isinstance(node, ast.Constant) and node.value in words})
    assert [hit for hit in spelled if hit not in NOT_A_STATE] == []


def test_how_a_lost_job_is_reported_lives_in_one_module() -> None:
    """A job that left Slurm without an outcome is ``lost``: its word, reason, glyph,
    colour, index code, whether it fails the run and what status records for it are
    decided in status/verdict.py alone; every other module derives from ``REPORT``
    (issue 29: the newcomer's change touches one module plus its test)."""
    names = {"LOST", "LOST_REASON"}
    home = ROOT / "control/runs/status/verdict.py"
    named = sorted(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
                   for path in sorted((ROOT / "control").rglob("*.py")) if path != home
                   for node in ast.walk(ast.parse(path.read_text()))
                   if (isinstance(node, ast.Name) and node.id in names)
                   or (isinstance(node, ast.Attribute) and node.attr in names)
                   or (isinstance(node, ast.alias) and node.name in names))
    assert named == []


def test_every_report_of_a_state_follows_the_one_table() -> None:
    from synthbatch.control.cli.output import COLOURS
    from synthbatch.control.cli.render import GLYPH
    from synthbatch.control.runs.autoretry import RETRYABLE
    from synthbatch.control.runs.status import index, listing
    from synthbatch.control.runs.status import verdict as norm

    report = norm.REPORT
    assert set(report) == set(norm.SHARD_STATES)
    assert GLYPH == {s: r.glyph for s, r in report.items()}
    assert COLOURS == {s: r.colour for s, r in report.items() if r.colour}
    assert index.STATE_CODES == {s: r.code for s, r in report.items() if r.code}
    assert set(index.STATE_CODES) == norm.FINAL
    assert RETRYABLE == {s for s, r in report.items() if r.failure}
    assert listing.SETTLED[norm.LOST] == report[norm.LOST].recorded[0] == states.FAILED
    assert norm.run_state({norm.LOST: 1, norm.SUCCEEDED: 3}) == norm.FAILED
