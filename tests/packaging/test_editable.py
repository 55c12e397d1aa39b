"""A plain editable install (``pip install -e .``, no extras) can submit: it has no
prebuilt bundle, so ``submit`` builds the agent zipapp, and shiv must come with it.

Issue 28: ``submit`` exited 2 with "shiv==1.0.8 is needed ... install the 'test' extra".
The venv here is fresh and sees nothing of ``.venv`` (unlike ``test_wheel``'s, which
inherit its packages): pip installs the declared dependencies from the package index
(offline here), and ``submit`` runs against a fake ``slurm_bin`` that accepts the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest

from .conftest import REPO_ROOT, snapshot_repo

pytestmark = pytest.mark.slow

PARTITION = ("PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES "
             "MaxNodes=UNLIMITED MaxTime=UNLIMITED Nodes=node[1-2] State=UP TotalCPUs=16 "
             "TotalNodes=2 MaxMemPerNode=UNLIMITED TRES=cpu=16,mem=8G,node=2,gres/gpu=8")


def fake_slurm(folder: Path) -> Path:
    """A slurm_bin whose sbatch accepts every job (id 900) and whose queries describe the
    testbed's partition; every call is logged."""
    folder.mkdir()
    log = folder / "calls.log"
    scripts = {
        "sbatch": "echo 900",
        "scontrol": f'case "$*" in "show partition"*) echo "{PARTITION}";; esac',
        "sinfo": "echo 'node1|8|4096|gpu:4|idle'; echo 'node2|8|4096|gpu:4|idle'",
    }
    for name in ("sbatch", "scontrol", "sinfo", "squeue", "sacct", "scancel", "sacctmgr"):
        path = folder / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{scripts.get(name, "")}\n')
        path.chmod(0o755)
    return folder


def test_a_plain_editable_install_submits(tmp_path: Path) -> None:
    src = snapshot_repo(tmp_path / "src")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)  # nothing from .venv or the base
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "SYNTHBATCH_AGENT_PYZ", "VIRTUAL_ENV")}
    env.update(HOME=str(tmp_path / "home"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                          "-e", str(src)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900, check=False)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert not (src / "control" / "_bundle").exists()  # no prebuilt bundle to fall back on
    bin_dir = fake_slurm(tmp_path / "slurm")
    profile = tmp_path / "profile.toml"
    profile.write_text(
        (REPO_ROOT / "examples" / "profiles" / "testbed.toml").read_text().replace(
            '"/tmp/synthbatch-workspace"', json.dumps(str(tmp_path / "ws")))
        + f'slurm_bin = "{bin_dir}"\n')
    proc = subprocess.run([str(env_dir / "bin" / "synthbatch"), "submit",
                           str(src / "examples" / "fake-server.toml"), "--profile", str(profile),
                           "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    submitted = json.loads(proc.stdout)
    staged = list(Path(submitted["run_dir"]).glob("agent-*.pyz"))
    assert len(staged) == 1, list(Path(submitted["run_dir"]).iterdir())
    assert "sbatch --parsable" in (bin_dir / "calls.log").read_text()
