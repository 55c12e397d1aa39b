"""Shared fixtures for the zipapp and wheel packaging tests."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_SRC = REPO_ROOT / "agent_stdlib"

# Never copied when snapshotting the checkout for a build.
SNAPSHOT_IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".venv", ".pytest_cache",
    ".ruff_cache", ".work",
)  # fmt: skip


def snapshot_agent_sources(dest: Path) -> Path:
    """Copy the checkout's agent_stdlib to ``dest`` (a stable snapshot while others edit)."""
    shutil.copytree(AGENT_SRC, dest, ignore=SNAPSHOT_IGNORE)
    return dest


def snapshot_repo(dest: Path) -> Path:
    """Copy the checkout (without VCS/build artefacts) to ``dest`` for an isolated build."""
    shutil.copytree(REPO_ROOT, dest, ignore=SNAPSHOT_IGNORE)
    return dest


def find_python39() -> Optional[str]:
    """Return a working Python 3.9 interpreter (the agent's minimum), if one is installed."""
    candidates = [shutil.which("python3.9")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")))
    candidates += ["/usr/bin/python3.9", "/usr/local/bin/python3.9"]
    for cand in candidates:
        if not cand or not os.path.exists(cand):
            continue
        proc = subprocess.run(
            [cand, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"],
            capture_output=True,
            check=False,
        )
        if proc.returncode == 0:
            return cand
    return None


@pytest.fixture(scope="session")
def agent_src_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot of the agent sources, so one session sees one consistent tree."""
    return snapshot_agent_sources(tmp_path_factory.mktemp("agent-src") / "agent_stdlib")


@pytest.fixture(scope="session")
def agent_pyz(tmp_path_factory: pytest.TempPathFactory, agent_src_snapshot: Path) -> Path:
    """A bundle built once per session from the snapshot of the agent sources."""
    from synthbatch.control.bundle import build_agent_bundle

    return build_agent_bundle(tmp_path_factory.mktemp("pyz"), agent_src_snapshot)
