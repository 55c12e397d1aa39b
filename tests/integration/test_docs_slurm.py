"""The tutorial's testbed steps and the Python API's example, run as written against the
real testbed (docs/tutorial.md, docs/python-api.md): the docs cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from tests.conftest import REPO
from tests.fakes import fenced_blocks

pytestmark = pytest.mark.slurm
TUTORIAL = REPO / "docs" / "tutorial.md"
PYTHON_API = REPO / "docs" / "python-api.md"


def user_env(home: Path) -> Dict[str, str]:
    """A new user's shell: a private HOME, synthbatch and Slurm on PATH, no profile yet."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNTHBATCH_")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
               NO_COLOR="1")
    return env


def test_the_tutorials_testbed_steps_run_as_written(slurm_cluster, tmp_path):
    blocks = fenced_blocks(TUTORIAL, "bash testbed")
    script = "set -euo pipefail\n" + "\n".join(blocks)
    result = subprocess.run(["bash", "-c", script], cwd=REPO, env=user_env(tmp_path / "home"),
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    out = result.stdout
    assert "plan of vllm-multigpu exited 2" in out
    assert "checks on this login node:" in out
    assert ": succeeded  records 30/30" in out  # status after wait
    records = (tmp_path / "home" / "records.jsonl").read_text().splitlines()
    assert len(records) == 30


def test_the_python_api_example_runs_as_written(slurm_cluster, tmp_path):
    env = user_env(tmp_path / "home")
    init = subprocess.run(["synthbatch", "profile", "init", "--workspace",
                           str(tmp_path / "home" / "synthbatch-runs"), "--partition", "debug",
                           "--gpus-per-node", "4", "--profile", "testbed"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    (example,) = fenced_blocks(PYTHON_API, "python testbed")
    result = subprocess.run([sys.executable, "-c", example], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run fake-server: 30 records in 3 shards")
    assert any(line.startswith("succeeded 30/30 records in ") for line in lines)
    assert lines[-1] == "True"
    refused = subprocess.run([sys.executable, "-c", fenced_blocks(PYTHON_API, "python")[0]],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.startswith("2 submit refused: ")
