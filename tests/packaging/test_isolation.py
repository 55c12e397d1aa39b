"""The suite relies on nothing from the base interpreter (python3 outside ``.venv``).

A test once passed in CI only because shiv had been pip-installed into the base interpreter
of the CI machine by hand, and failed on a fresh machine: it had made a venv with
``system_site_packages=True``, which inherits the *base* interpreter's site-packages, not
``.venv``'s. These tests make that class of bug visible:

* the test interpreter is a venv that does not see the base site-packages, and nothing it
  has imported comes from there;
* nothing in the project makes an environment that would inherit them;
* under CI (``.ci/run``) the base interpreter itself is a pristine copy with no third-party
  packages at all (``scripts/clean-python``), so a test that needs a package ``make install``
  did not install fails there, as it would on a fresh machine.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path
from typing import Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "scripts", "benchmarks", "fixtures", "control", "agent_stdlib")
INHERITS_BASE = re.compile(r"system_site_packages\s*=\s*True|--system-site-packages")


def base_site_packages() -> List[str]:
    """The base interpreter's own site-packages folders (purelib and platlib)."""
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    return sorted({os.path.realpath(paths["purelib"]), os.path.realpath(paths["platlib"])})


def under(path: str, folders: List[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == f or real.startswith(f + os.sep) for f in folders)


def test_the_suite_runs_in_a_venv_that_cannot_see_the_base_site_packages() -> None:
    assert sys.prefix != sys.base_prefix, "run the tests with .venv/bin/python (make test)"
    config = Path(sys.prefix, "pyvenv.cfg").read_text()
    assert re.search(r"^include-system-site-packages\s*=\s*false\s*$", config, re.M), config
    base = base_site_packages()
    leaked = [p for p in sys.path if p and under(p, base)]
    assert leaked == [], f"sys.path holds the base interpreter's site-packages: {leaked}"


def test_no_imported_module_comes_from_the_base_interpreter() -> None:
    base = base_site_packages()
    leaked = sorted(name for name, module in list(sys.modules.items())
                    if isinstance(getattr(module, "__file__", None), str)
                    and under(module.__file__, base))
    assert leaked == [], f"imported from {base}: {leaked[:10]}"


def project_files() -> Iterator[Path]:
    yield REPO / "Makefile"
    yield REPO / ".ci" / "run"
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sh", "") and "__pycache__" not in \
                    path.parts:
                yield path


def test_nothing_makes_an_environment_that_inherits_the_base_interpreter() -> None:
    me = Path(__file__).resolve()
    found = []
    for path in project_files():
        if path.resolve() == me:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        found += [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}"
                  for m in INHERITS_BASE.finditer(text)]
    assert found == [], ("these places make a venv that inherits the base interpreter's "
                         f"site-packages (empty on a fresh machine): {found}")


@pytest.mark.skipif(os.environ.get("CI", "").lower() != "true",
                    reason="only .ci/run builds .venv from a pristine base interpreter")
def test_under_ci_the_base_interpreter_has_no_third_party_packages() -> None:
    from importlib.metadata import distributions

    found = sorted({d.metadata["Name"] for d in distributions(path=base_site_packages())})
    assert found == [], (f"the base interpreter {sys.base_prefix} has {found}; .ci/run must "
                         "build .venv from scripts/clean-python")
