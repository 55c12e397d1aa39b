"""The suite's own layout: helpers live in helper modules, never in another test module.

A test module that imports another (``from tests.unit.x.test_y import helper``) runs the
other's module-level code, collects nothing it means to and breaks when that module's
tests are reorganised; shared helpers go to ``tests/fakes.py``, ``tests/agent_runs.py``
or a package's ``harness.py``.
"""

from __future__ import annotations

import ast

from tests.conftest import REPO


def test_no_test_module_imports_another() -> None:
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(name.split(".")[-1].startswith("test_") for name in names):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bad == []
