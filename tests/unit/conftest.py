"""Shared helpers of the unit tests: golden files behind ``--update-goldens``."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import GOLDENS, REPO


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="Rewrite tests/unit/goldens/* from the current output instead of comparing.",
    )


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Compare ``actual`` with ``goldens/<name>`` line by line; rewrite only on request."""
    update = bool(request.config.getoption("--update-goldens"))

    def check(name: str, actual: str) -> None:
        path = GOLDENS / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            return
        if not path.is_file():
            pytest.fail(f"golden file {path} is missing; run pytest with --update-goldens "
                        f"to create it, then review it")
        expected = path.read_text(encoding="utf-8")
        if expected != actual:
            diff = "\n".join(difflib.unified_diff(
                expected.splitlines(), actual.splitlines(),
                fromfile=f"goldens/{name} (expected)", tofile=f"{name} (actual)",
                lineterm=""))
            pytest.fail(f"output differs from golden file {path} "
                        f"(rerun with --update-goldens if the change is intended):\n{diff}",
                        pytrace=False)

    return check


@pytest.fixture
def repo() -> Path:
    """The checkout's root directory."""
    return REPO
