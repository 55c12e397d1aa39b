"""The ``serve`` role: a replica's device lists narrowed to the plan's GPU indices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, Tuple

import pytest

from synthbatch.agent_stdlib.allocation.serve import (
    EXIT_NOT_FOUND,
    EXIT_UNCOVERED,
    EXIT_USAGE,
    BindError,
    device_list,
    narrow,
    parse_indices,
)
from tests.conftest import REPO


@pytest.mark.parametrize("env, positions, expected", [
    # a step that asked for the node's 4 GPUs; replica 1 of 2x2 gets the 3rd and 4th
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, (2, 3), {"CUDA_VISIBLE_DEVICES": "2,3"}),
    # no device cgroup: a job holding GPUs 2,3 sees the global ids
    ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_STEP_GPUS": "2,3"}, (0,),
     {"CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2"}),
    # ConstrainDevices renumbers CUDA's list; SLURM_STEP_GPUS keeps the global ids
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_STEP_GPUS": "2,3"}, (1,),
     {"CUDA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "3"}),
    # what Slurm 22.05 sets with the default GRES env flags: all narrowed alike
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "ROCR_VISIBLE_DEVICES": "0,1,2,3",
      "GPU_DEVICE_ORDINAL": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3", "OTHER": "0,1"}, (0, 1),
     {"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0,1",
      "GPU_DEVICE_ORDINAL": "0,1", "SLURM_STEP_GPUS": "0,1"}),
    ({"ROCR_VISIBLE_DEVICES": "4,5,6,7"}, (3,), {"ROCR_VISIBLE_DEVICES": "7"}),
    ({"HIP_VISIBLE_DEVICES": "0, 1"}, (1,), {"HIP_VISIBLE_DEVICES": "1"}),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, (0, 1, 2, 3), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}),
    # UUIDs (some sites' gres.conf) are entries like any other
    ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, (1,), {"CUDA_VISIBLE_DEVICES": "GPU-bb"}),
])
def test_narrow_picks_the_plan_positions(env: Dict[str, str], positions: Tuple[int, ...],
                                         expected: Dict[str, str]) -> None:
    binding = narrow(env, positions, "server-tiny-1", "node1")
    assert binding.env == expected
    assert binding.line.startswith(f"serve: replica server-tiny-1 of node1: plan GPUs "
                                   f"{','.join(map(str, positions))} -> ")
    assert all(f"{k}={v}" in binding.line for k, v in expected.items())


@pytest.mark.parametrize("env, positions, message", [
    ({}, (0,), "the plan gives replica r GPUs 0 of node1, but this step sees no GPUs "
               "(CUDA_VISIBLE_DEVICES is not set)"),
    ({"SLURM_STEP_GPUS": "0,1"}, (0,), "sees no GPUs"),  # no device list at all
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, (2, 3), "the plan gives replica r GPUs 2,3 of node1, "
                                              "but this step sees 2 GPU(s) "
                                              "(CUDA_VISIBLE_DEVICES=0,1)"),
    ({"CUDA_VISIBLE_DEVICES": ""}, (0,), "sees 0 GPU(s) (CUDA_VISIBLE_DEVICES=none)"),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, (0,), "sees 0 GPU(s)"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1"}, (3,),
     "sees 2 GPU(s) (SLURM_STEP_GPUS=0,1)"),
])
def test_narrow_refuses_what_the_step_cannot_cover(env: Dict[str, str],
                                                   positions: Tuple[int, ...],
                                                   message: str) -> None:
    with pytest.raises(BindError) as err:
        narrow(env, positions, "r", "node1")
    assert message in str(err.value)


def test_narrow_repeats_the_variables_under_a_prefix() -> None:
    binding = narrow({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"}, (2,),
                     prefix="APPTAINERENV_")
    assert binding.env == {"CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "2",
                           "APPTAINERENV_CUDA_VISIBLE_DEVICES": "2",
                           "APPTAINERENV_SLURM_STEP_GPUS": "2"}
    assert "APPTAINERENV_" not in binding.line
    assert binding.line.startswith("serve: this replica: plan GPUs 2 -> ")


@pytest.mark.parametrize("text, indices", [("0", (0,)), ("2,3", (2, 3)), (" 1, 0", (1, 0))])
def test_parse_indices(text: str, indices: Tuple[int, ...]) -> None:
    assert parse_indices(text) == indices


@pytest.mark.parametrize("text", ["", "a", "1,,2", "-1", "1,1"])
def test_parse_indices_rejects(text: str) -> None:
    with pytest.raises(BindError, match="--gpus"):
        parse_indices(text)


def test_device_list() -> None:
    assert device_list(None) is None
    assert device_list("") == [] and device_list("NoDevFiles") == []
    assert device_list("0, 2,") == ["0", "2"]


# ----------------------------------------------------------------------------- the role


ENGINE = ("import json, os; print(json.dumps({'pid': os.getpid(), 'cvd': "
          "os.environ.get('CUDA_VISIBLE_DEVICES'), 'step': os.environ.get('SLURM_STEP_GPUS'), "
          "'app': os.environ.get('APPTAINERENV_CUDA_VISIBLE_DEVICES')})); raise SystemExit(7)")


def run_serve(*args: str, env: Dict[str, str]) -> Tuple[subprocess.Popen, str, str]:
    base = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "node1"}
    proc = subprocess.Popen([sys.executable, "-m", "synthbatch.agent_stdlib", "serve", *args],
                            cwd=REPO, env={**base, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    return proc, out, err


def test_serve_execs_the_engine_with_the_narrowed_lists() -> None:
    proc, out, err = run_serve("--gpus", "2,3", "--replica", "server-tiny-1", "--env-prefix",
                               "APPTAINERENV_", "--", sys.executable, "-c", ENGINE,
                               env={"CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                    "SLURM_STEP_GPUS": "0,1,2,3"})
    seen = json.loads(out)
    assert proc.returncode == 7  # the engine's own status
    assert seen == {"pid": proc.pid, "cvd": "2,3", "step": "2,3", "app": "2,3"}  # exec'd
    assert err == ("serve: replica server-tiny-1 of node1: plan GPUs 2,3 -> "
                   "CUDA_VISIBLE_DEVICES=2,3 SLURM_STEP_GPUS=2,3\n")


def test_serve_fails_before_the_engine_when_the_step_cannot_cover_the_plan() -> None:
    proc, out, err = run_serve("--gpus", "2,3", "--replica", "server-tiny-1", "--",
                               sys.executable, "-c", ENGINE,
                               env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert proc.returncode == EXIT_UNCOVERED and out == ""
    assert err == ("serve: the plan gives replica server-tiny-1 GPUs 2,3 of node1, but this "
                   "step sees 2 GPU(s) (CUDA_VISIBLE_DEVICES=0,1)\n")


@pytest.mark.parametrize("args, code, message", [
    (("--gpus", "0"), EXIT_USAGE, "usage: serve --gpus"),
    (("--gpus", "0", "--"), EXIT_USAGE, "no engine command after --"),
    (("--gpus", "x", "--", "true"), EXIT_USAGE, "--gpus 'x' is not a comma-separated list"),
    (("--gpus", "0", "--", "/no/such/engine"), EXIT_NOT_FOUND,
     "serve: cannot run /no/such/engine: No such file or directory"),
])
def test_serve_usage_and_missing_engine(args: Tuple[str, ...], code: int, message: str) -> None:
    proc, _, err = run_serve(*args, env={"CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == code and message in err, err
