"""Fixtures of the control-plane tests: a private HOME, a workspace and a testbed profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every control test runs with its own HOME and no ``SYNTHBATCH_PROFILE``."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SYNTHBATCH_PROFILE", raising=False)
    return home


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """Where the test's profile keeps its runs."""
    return tmp_path / "ws"


@pytest.fixture
def profile_file(tmp_path: Path, workspace: Path) -> Path:
    """The testbed profile, pointed at ``workspace``."""
    path = tmp_path / "profile.toml"
    path.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                json.dumps(str(workspace))))
    return path
