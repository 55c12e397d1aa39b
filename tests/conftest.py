"""Fixtures shared by every test suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
GOLDENS = REPO / "tests" / "unit" / "goldens"  # expected outputs, compared line by line


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout this test run is testing."""
    return REPO


@pytest.fixture(scope="session")
def agent_pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent bundle, built once per test session from this checkout."""
    from synthbatch.control.bundle import build_agent_bundle

    return build_agent_bundle(tmp_path_factory.mktemp("bundle"))


@pytest.fixture(scope="session")
def python_exe() -> str:
    """The interpreter running the tests (used for agent and fake-server processes)."""
    return sys.executable
