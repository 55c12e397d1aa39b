"""The wheel: ships exactly one prebuilt, checked agent zipapp and a working console script.

The wheel is built once (from a snapshot of the checkout, so the work tree is never written)
and installed once into a fresh venv. Nothing is fetched from a package index and nothing
comes from the base interpreter (python3 outside ``.venv``): builds run without isolation
on what ``make install`` put into ``.venv``, and the fresh venvs see ``.venv``'s packages
through one ``.pth`` line (:func:`inherit_test_packages`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

from synthbatch.control.bundle import build_agent_bundle, check_agent_bundle, sha256_file

from .conftest import snapshot_repo

pytestmark = pytest.mark.slow

BUNDLE_PREFIX = "synthbatch/control/_bundle/"
# PyPI's ``control`` (python-control), fetched by ``make install`` (no index at test time)
PYTHON_CONTROL_WHEELS = Path(sys.prefix) / "test-wheels"


def run(
    argv: List[str], cwd: Path, timeout: float = 600, **env: str
) -> subprocess.CompletedProcess:
    """Run ``argv`` and fail the test with its output when it exits non-zero."""
    full_env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", **env)
    full_env.pop("SYNTHBATCH_AGENT_PYZ", None)
    full_env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@dataclass
class Built:
    """A wheel built from a snapshot of the checkout."""

    src: Path
    wheel: Path
    workdir: Path


@dataclass
class Installed:
    """A fresh venv with the wheel installed."""

    built: Built
    venv: Path

    @property
    def python(self) -> Path:
        """The venv's interpreter."""
        return self.venv / "bin" / "python"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Build the wheel once, from a snapshot of the checkout."""
    workdir = tmp_path_factory.mktemp("wheel")
    src = snapshot_repo(workdir / "src")
    out = workdir / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, src],
        cwd=workdir)
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return Built(src=src, wheel=wheels[0], workdir=workdir)


@pytest.fixture(scope="module")
def installed(built: Built) -> Installed:
    """Create a fresh venv once and install the wheel (its dependencies come from .venv)."""
    env_dir = built.workdir / "venv"
    venv.EnvBuilder(clear=True).create(env_dir)  # pip, too, comes from .venv
    inherit_test_packages(env_dir)
    python = env_dir / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", built.wheel],
        cwd=built.workdir)
    return Installed(built=built, venv=env_dir)


def inherit_test_packages(env_dir: Path) -> None:
    """Let the venv at ``env_dir`` import what ``make install`` put into the test venv.

    A venv that includes the system site-packages would inherit the *base* interpreter's
    (python3 outside ``.venv``), which hold none of the project's dependencies on a fresh
    machine. A ``.pth`` line naming the test interpreter's own site-packages adds exactly
    that folder, pip and setuptools included (its own ``.pth`` files, such as the
    checkout's editable finder, are not run).
    """
    python = env_dir / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(run([python, "-c", code], cwd=env_dir).stdout.strip())
    (purelib / "_synthbatch_test_packages.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n")


def wheel_bundles(wheel: Path) -> List[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if n.startswith(BUNDLE_PREFIX)]


def test_wheel_ships_exactly_one_checked_bundle(built: Built, tmp_path: Path) -> None:
    names = wheel_bundles(built.wheel)
    assert len(names) == 1, names
    name = names[0]
    assert name.startswith(BUNDLE_PREFIX + "agent-") and name.endswith(".pyz")
    pyz = tmp_path / Path(name).name
    with zipfile.ZipFile(built.wheel) as zf:
        pyz.write_bytes(zf.read(name))
    assert pyz.name == f"agent-{sha256_file(pyz)}.pyz"
    assert check_agent_bundle(pyz) == []


def test_wheel_bundle_is_the_reproducible_build_of_its_sources(
    built: Built, tmp_path: Path
) -> None:
    local = build_agent_bundle(tmp_path, built.src / "agent_stdlib")
    assert wheel_bundles(built.wheel) == [BUNDLE_PREFIX + local.name]


def test_wheel_build_never_writes_the_bundle_into_the_source_tree(built: Built) -> None:
    assert not (built.src / "control" / "_bundle").exists()


def test_installed_control_plane_locates_the_prebuilt_bundle(
    installed: Installed, tmp_path: Path
) -> None:
    code = (
        "import sys; from pathlib import Path; import synthbatch.control.bundle as b; "
        "print(b.locate_agent_bundle(Path(sys.argv[1])))"
    )
    proc = run([installed.python, "-c", code, tmp_path / "cache"], cwd=tmp_path)
    located = Path(proc.stdout.strip())
    assert located.parent.name == "_bundle"
    assert installed.venv in located.parents
    assert [BUNDLE_PREFIX + located.name] == wheel_bundles(installed.built.wheel)
    assert not (tmp_path / "cache").exists()  # nothing built at submit time


def test_installed_bundle_runs(installed: Installed, tmp_path: Path) -> None:
    (pyz,) = installed.venv.glob(
        "lib/python*/site-packages/synthbatch/control/_bundle/agent-*.pyz")
    home = tmp_path / "home"
    home.mkdir()
    proc = run(
        [sys.executable, "-I", pyz, "--help"],
        cwd=tmp_path,
        HOME=str(home),
        SHIV_ROOT=str(tmp_path / "scratch"),
    )
    assert "usage" in proc.stdout.lower()
    assert list(home.iterdir()) == []


def test_console_script_help(installed: Installed, tmp_path: Path) -> None:
    proc = run([installed.venv / "bin" / "synthbatch", "--help"], cwd=tmp_path)
    assert "usage" in proc.stdout.lower()


def test_console_script_plans_the_quickstart(installed: Installed) -> None:
    src = installed.built.src
    proc = run([installed.venv / "bin" / "synthbatch", "plan", "examples/fake-server.toml",
                "--profile", "examples/profiles/testbed.toml"], cwd=src)
    assert "30 records in 3 shards" in proc.stdout
    assert "#SBATCH --array" not in proc.stdout  # the array goes on the sbatch command line
    assert "exec /usr/bin/python3 -I" in proc.stdout


def test_wheel_declares_the_project_dependencies_and_they_are_met(installed: Installed) -> None:
    with zipfile.ZipFile(installed.built.wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        declared = {line.split(":", 1)[1].strip() for line in
                    zf.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")}
    for requirement in ('pydantic>=2', 'click>=8', 'tomli>=1.1; python_version < "3.11"'):
        assert requirement in declared, declared
    run([installed.python, "-m", "pip", "check"], cwd=installed.built.workdir)


def test_editable_install_builds_the_bundle_on_demand(built: Built, tmp_path: Path) -> None:
    pytest.importorskip("shiv", reason="the editable fallback builds with shiv")
    env_dir = tmp_path / "venv-editable"
    venv.EnvBuilder().create(env_dir)
    inherit_test_packages(env_dir)  # pydantic, click and shiv from .venv, not from the base
    python = env_dir / "bin" / "python"
    src = built.src  # the wheel's sources, so both routes must give the same bytes
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", src],
        cwd=tmp_path)
    assert not (src / "control" / "_bundle").exists()
    code = (
        "import sys; from pathlib import Path; import synthbatch.control.bundle as b; "
        "print(b.locate_agent_bundle(Path(sys.argv[1])))"
    )
    proc = run([python, "-c", code, tmp_path / "cache"], cwd=tmp_path)
    located = Path(proc.stdout.strip())
    assert located.parent == tmp_path / "cache"
    assert (tmp_path / "cache" / "index.json").is_file()
    assert wheel_bundles(built.wheel) == [BUNDLE_PREFIX + located.name]
    assert not (src / "control" / "_bundle").exists()


def test_the_wheel_installs_one_top_level_name(built: Built) -> None:
    """It shipped top-level ``control`` and ``agent_stdlib`` (``control`` is python-control)."""
    with zipfile.ZipFile(built.wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"synthbatch"}


def test_pypi_control_installs_beside_synthbatch(installed: Installed, tmp_path: Path) -> None:
    """Installing python-control overwrote synthbatch's ``control/__init__.py`` and
    ``synthbatch --help`` died with "No module named 'numpy'"; uninstalling it deleted
    synthbatch's own file. Now both live side by side, and either can go."""
    (wheel,) = PYTHON_CONTROL_WHEELS.glob("control-*.whl")
    python, synthbatch = installed.python, installed.venv / "bin" / "synthbatch"
    run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel], cwd=tmp_path)
    try:
        assert "usage" in run([synthbatch, "--help"], cwd=tmp_path).stdout.lower()
        where = ("import importlib.util as u; "
                 "print(u.find_spec('control').origin, u.find_spec('synthbatch.control').origin)")
        theirs, ours = run([python, "-c", where], cwd=tmp_path).stdout.split()
        assert "/site-packages/control/" in theirs
        assert "/site-packages/synthbatch/control/" in ours
        run([python, "-c", "import synthbatch, synthbatch.control.api"], cwd=tmp_path)
    finally:
        run([python, "-m", "pip", "uninstall", "-q", "-y", "control"], cwd=tmp_path)
    assert "usage" in run([synthbatch, "--help"], cwd=tmp_path).stdout.lower()
