"""The wheel: ships exactly one prebuilt, checked agent zipapp and a working console script.

The wheel is built once (from a snapshot of the checkout, so the work tree is never written)
and installed once into a fresh venv with its dependencies from the package index.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

from control.bundle import build_agent_bundle, check_agent_bundle, sha256_file

from .conftest import snapshot_repo

pytestmark = pytest.mark.slow

BUNDLE_PREFIX = "control/_bundle/"


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
    if importlib.util.find_spec("build") is not None:
        run([sys.executable, "-m", "build", "--wheel", "--outdir", out, src], cwd=workdir)
    else:
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, src], cwd=workdir)
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return Built(src=src, wheel=wheels[0], workdir=workdir)


@pytest.fixture(scope="module")
def installed(built: Built) -> Installed:
    """Create a fresh venv once and install the wheel with its dependencies."""
    env_dir = built.workdir / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", built.wheel], cwd=built.workdir)
    return Installed(built=built, venv=env_dir)


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
        "import sys; from pathlib import Path; import control.bundle as b; "
        "print(b.locate_agent_bundle(Path(sys.argv[1])))"
    )
    proc = run([installed.python, "-c", code, tmp_path / "cache"], cwd=tmp_path)
    located = Path(proc.stdout.strip())
    assert located.parent.name == "_bundle"
    assert installed.venv in located.parents
    assert [BUNDLE_PREFIX + located.name] == wheel_bundles(installed.built.wheel)
    assert not (tmp_path / "cache").exists()  # nothing built at submit time


def test_installed_bundle_runs(installed: Installed, tmp_path: Path) -> None:
    (pyz,) = installed.venv.glob("lib/python*/site-packages/control/_bundle/agent-*.pyz")
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


def test_editable_install_builds_the_bundle_on_demand(built: Built, tmp_path: Path) -> None:
    pytest.importorskip("shiv", reason="the editable fallback builds with shiv")
    env_dir = tmp_path / "venv-editable"
    # System site-packages: pydantic, click and shiv come from the test interpreter.
    venv.EnvBuilder(with_pip=True, system_site_packages=True).create(env_dir)
    python = env_dir / "bin" / "python"
    src = built.src  # the wheel's sources, so both routes must give the same bytes
    run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", src], cwd=tmp_path)
    assert not (src / "control" / "_bundle").exists()
    code = (
        "import sys; from pathlib import Path; import control.bundle as b; "
        "print(b.locate_agent_bundle(Path(sys.argv[1])))"
    )
    proc = run([python, "-c", code, tmp_path / "cache"], cwd=tmp_path)
    located = Path(proc.stdout.strip())
    assert located.parent == tmp_path / "cache"
    assert (tmp_path / "cache" / "index.json").is_file()
    assert wheel_bundles(built.wheel) == [BUNDLE_PREFIX + located.name]
    assert not (src / "control" / "_bundle").exists()
