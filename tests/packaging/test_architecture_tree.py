"""docs/architecture.md's layout tree names every module of the tree (issue 29).

The tree is the newcomer's map: a module it does not name is a room nobody finds. Each
``agent_stdlib/`` and ``control/`` module must be named in the tree block: a top-level
module as ``name.py`` anywhere in its package's part, a module of a sub-package as the word
``name`` in that sub-package's part (``client/``, ``runs/``, ``backends/local/`` ...); every
sub-package the tree names must exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set, Tuple

from tests.conftest import REPO

PACKAGES = ("agent_stdlib", "control")
FOLDER = re.compile(r"^  ([a-z_]+(?:/[a-z_]+)*)/\s")


def tree_block() -> List[str]:
    """The lines of the first fenced block after the "## Layout" heading."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    after = text.split("\n## Layout\n", 1)[1]
    return after.split("```\n", 2)[1].splitlines()


def parts(lines: List[str]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """(package -> its whole text, "package/sub" -> the text of that sub-package's part)."""
    whole: Dict[str, str] = {}
    subs: Dict[str, str] = {}
    package = sub = None
    for line in lines:
        top = re.match(r"^([a-z_]+)/\s", line)
        if top:
            package, sub = top.group(1), None
        else:
            folder = FOLDER.match(line)
            if folder and package:
                sub = f"{package}/{folder.group(1)}"
        if package:
            whole[package] = whole.get(package, "") + line + "\n"
            if sub:
                subs[sub] = subs.get(sub, "") + line + "\n"
    return whole, subs


def modules(package: str) -> List[Path]:
    """The package's modules (no ``__init__``), relative to the repository."""
    return sorted(p.relative_to(REPO) for p in (REPO / package).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def test_every_module_is_named_in_the_tree() -> None:
    whole, subs = parts(tree_block())
    missing = []
    for package in PACKAGES:
        for module in modules(package):
            folder = module.parent.as_posix()
            if folder == package:
                named = re.search(rf"(?<![\w.]){re.escape(module.name)}\b", whole[package])
            else:
                text = subs.get(folder, "")
                named = text and re.search(rf"(?<![\w.]){re.escape(module.stem)}\b", text)
            if not named:
                missing.append(module.as_posix())
    assert missing == [], "docs/architecture.md's layout tree does not name: " + \
        ", ".join(missing)


def test_every_folder_the_tree_names_exists() -> None:
    _, subs = parts(tree_block())
    assert [s for s in subs if not (REPO / s).is_dir()] == []
    assert len(subs) >= 12  # the parse found the tree's folders


def test_every_test_file_the_code_and_docs_point_at_exists() -> None:
    """Docstrings and docs name test files as evidence; a moved test leaves them stale."""
    pointer = re.compile(r"tests/[A-Za-z0-9_/]+\.py")
    sources = [p for folder in ("control", "agent_stdlib", "docs", "benchmarks", "scripts")
               for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".md")]
    stale = sorted({f"{path.relative_to(REPO)}: {hit}"
                    for path in sources + [REPO / "README.md"]
                    for hit in pointer.findall(path.read_text(encoding="utf-8"))
                    if not (REPO / hit).is_file()})
    assert stale == []


# ``control.runs.merge.verify_jsonl``, ``synthbatch.agent_stdlib.layout.RunLayout``: a
# dotted pointer at a module and a name it defines.
DOTTED = re.compile(r"(?<![\w./])(?:synthbatch\.)?((?:control|agent_stdlib)(?:\.[A-Za-z_]\w*)+)")


def defined(module: Path) -> Set[str]:
    """The names a module defines or imports at any depth (functions, classes, fields)."""
    names: Set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def points_nowhere(pointer: str) -> bool:
    """True when no module of the longest existing prefix defines the name after it."""
    parts = pointer.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else \
            base / "__init__.py"
        if module.is_file():
            return i < len(parts) and parts[i] not in defined(module)
        if base.is_dir():  # a package without __init__: only its modules can be named
            return i < len(parts)
    return True


def test_every_dotted_pointer_names_what_exists() -> None:
    """``module.name`` pointers in docstrings and docs; a renamed function leaves them
    stale."""
    sources = [p for folder in ("control", "agent_stdlib", "docs", "benchmarks", "scripts")
               for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".md")]
    stale = sorted({f"{path.relative_to(REPO)}: {hit}"
                    for path in sources + [REPO / "README.md"]
                    for hit in DOTTED.findall(path.read_text(encoding="utf-8"))
                    if points_nowhere(hit.rstrip("."))})
    assert stale == []


def test_a_pointer_at_a_missing_name_is_stale() -> None:
    assert points_nowhere("control.runs.store.submit_shared") == \
        ("submit_shared" not in defined(REPO / "control" / "runs" / "store.py"))
    assert not points_nowhere("control.runs.shared.submit_shared")
    assert not points_nowhere("agent_stdlib.layout.RunLayout")
    assert points_nowhere("agent_stdlib.layout.no_such_name")
    assert points_nowhere("control.no_such_module.name")
