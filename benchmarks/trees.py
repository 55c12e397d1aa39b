"""Run another checkout's code side by side with this one's (``--before REF``).

An installed synthbatch imports its folders as ``synthbatch.control`` and
``synthbatch.agent_stdlib``; a bare checkout (``git archive`` of a ref) has no ``synthbatch``
folder. :func:`python_path` gives a ``PYTHONPATH`` under which a tree's control plane
imports by the name it uses itself (checkouts older than the name import ``control``), ahead
of this environment's editable install. The agent imports itself relatively, so
``python -m agent_stdlib`` with the tree on ``PYTHONPATH`` runs any tree's agent.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Tuple

FOLDERS = ("control", "agent_stdlib")
REPO = Path(__file__).resolve().parents[1]


def export(ref: str, into: Path) -> Tuple[Path, str]:
    """``git archive REF`` of this repository unpacked into ``into``; (it, REF's short id)."""
    into.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into, commit


def control_package(tree: Path) -> str:
    """``synthbatch.control`` or, for a checkout before the import name, ``control``."""
    setup = Path(tree) / "setup.py"
    named = setup.is_file() and 'NAME = "synthbatch"' in setup.read_text()
    return "synthbatch.control" if named else "control"


def python_path(tree: Path) -> str:
    """``PYTHONPATH`` for a child process that runs ``tree``'s code (links in a temp dir)."""
    tree = Path(tree).resolve()
    links = Path(tempfile.mkdtemp(prefix="synthbatch-tree-")) / "synthbatch"
    links.mkdir()
    for folder in FOLDERS:
        os.symlink(tree / folder, links / folder)
    return os.pathsep.join((str(links.parent), str(tree)))
