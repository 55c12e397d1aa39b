"""Every JSON record is read through ``statefile``'s one reader (issue 29).

``read_json`` (damage raised, naming the file) and ``read_json_or_none`` (damage read as
absent) never follow a symlink and read only this user's regular files. A hand-written
``json.loads(path.read_text())`` does both: the benchmarks and the bundle cache's index had
four such readers. The archive check of ``control/bundle.py`` reads the files it has just
extracted into its own temporary folder, not a record of a run or a workspace.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

from tests.conftest import REPO

ROOTS = ("control", "agent_stdlib", "benchmarks")
NOT_A_RECORD = {("control/bundle.py", "manifest_path"), ("control/bundle.py", "dest")}


def _base(node: ast.expr) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.BinOp, ast.Subscript)):
        node = node.left if isinstance(node, ast.BinOp) else \
            node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def hand_readers(tree: ast.AST) -> List[tuple]:
    """(line, the path's base name) of each ``json.load(s)`` over a ``read_text()``,
    ``read_bytes()`` or ``open()`` of a file."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("load", "loads") and node.args
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Call):
            func = arg.func
            if isinstance(func, ast.Attribute) and func.attr in ("read_text", "read_bytes"):
                found.append((node.lineno, _base(func.value)))
            elif isinstance(func, ast.Name) and func.id == "open":
                found.append((node.lineno, "open"))
    return found


def test_every_json_file_is_read_through_statefile() -> None:
    bad = [f"{path.relative_to(REPO).as_posix()}:{line}"
           for root in ROOTS for path in sorted((REPO / root).rglob("*.py"))
           for line, base in hand_readers(ast.parse(path.read_text(encoding="utf-8")))
           if (path.relative_to(REPO).as_posix(), base) not in NOT_A_RECORD]
    assert bad == [], "read records with statefile.read_json / read_json_or_none"


def test_the_scan_sees_each_form() -> None:
    tree = ast.parse('a = json.loads(path.read_text())\n'
                     'b = json.loads((root / "x.json").read_bytes())\n'
                     'c = json.load(open(p))\nd = json.loads(line)\n')
    assert hand_readers(tree) == [(1, "path"), (2, "root"), (3, "open")]


def test_the_bundle_cache_ignores_an_index_that_is_a_symlink(tmp_path: Path) -> None:
    from synthbatch.control import bundle

    real = tmp_path / "elsewhere.json"
    real.write_text('{"schema_version": 1, "entries": {"abc": "agent-planted.pyz"}}')
    (tmp_path / bundle.INDEX_NAME).symlink_to(real)
    assert bundle._read_index(tmp_path / bundle.INDEX_NAME) == {}
    (tmp_path / bundle.INDEX_NAME).unlink()
    bundle._write_index(tmp_path / bundle.INDEX_NAME, {"b": "2.pyz", "a": "1.pyz"})
    assert list(bundle._read_index(tmp_path / bundle.INDEX_NAME)) == ["b", "a"]
    assert (tmp_path / bundle.INDEX_NAME).stat().st_mode & 0o077 == 0
