"""Every path of a run and of a workspace has one home: ``agent_stdlib/layout.py``.

Outside it, no module names a run's or a workspace's files: not as a string constant
(``"totals.json"``, ``"retry.lock"``) and not as a folder joined onto a path
(``root / "observer"``, ``workspace / ".cache"``). They use ``RunLayout``'s properties or
the layout's workspace functions (``bundle_cache``, ``benchmarks_root``) instead.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List

from tests.conftest import REPO

HOME = REPO / "agent_stdlib" / "layout.py"
# File names of a run: refused as any string constant outside the layout module.
FILE_NAMES = {"run.json", "plan.json", "winner.json", "attempt.json", "progress.json",
              "result.json", "telemetry.json", "lag.json",
              "settled.json", "settled.lock", "totals.json", "cost.json", "retry.lock",
              "round.json", "images.json"}
# Folder names: refused as the right-hand side of ``path / "name"`` (as words they mean
# other things too: the ``auto`` retry policy, the plan's ``shards`` field).
FOLDER_NAMES = {"observer", "cancels", "auto", "shards", "attempts", "submissions", "inputs",
                "merged", "runs", "benchmarks", ".cache", "bundles", "local"}


# The benchmarks build runs too (status_scale.py writes a 100,000-shard run's tree): the
# same rule holds there, but for names that are not a run's or a workspace's: the files
# of a bare client step's work folder (no run around it), the repository's own
# benchmarks/ folder, a merge's output folder.
NOT_A_RUN_PATH = {
    ("benchmarks/concurrency.py", "plan.json"), ("benchmarks/concurrency.py", "progress.json"),
    ("benchmarks/prefix_cache.py", "plan.json"), ("benchmarks/prefix_cache.py", "progress.json"),
    ("benchmarks/prefix_cache_real.py", "plan.json"),
    ("benchmarks/prefix_cache_real.py", "benchmarks"), ("benchmarks/proxy.py", "benchmarks"),
    ("benchmarks/telemetry.py", "telemetry.json"), ("benchmarks/merge_parquet.py", "merged"),
}


def _sources() -> Iterator[Path]:
    for top in ("control", "agent_stdlib", "benchmarks"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path != HOME:
                yield path


def offences(tree: ast.AST) -> List[str]:
    """``line: literal`` for each run or workspace path written outside the layout."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in FILE_NAMES:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and \
                isinstance(node.right, ast.Constant) and node.right.value in FOLDER_NAMES:
            found.append(f"{node.lineno}: / {node.right.value!r}")
    return found


def test_run_and_workspace_paths_live_in_the_layout_module() -> None:
    bad = [f"{path.relative_to(REPO)}:{where}" for path in _sources()
           for where in offences(ast.parse(path.read_text(encoding="utf-8")))
           if (path.relative_to(REPO).as_posix(), where.split("'")[1]) not in NOT_A_RUN_PATH]
    assert bad == [], "use RunLayout / the workspace functions of agent_stdlib/layout.py"


def test_the_scan_sees_both_forms() -> None:
    tree = ast.parse('CACHE = "totals.json"\np = layout.root / "observer" / "lag.json"\n'
                     'POLICIES = ("auto", "never")\nx = data["shards"]\n')
    assert offences(tree) == ["1: 'totals.json'", "2: / 'observer'", "2: 'lag.json'"]
