"""Paths checked on the other nodes of an allocation (the ``check`` role)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from synthbatch.agent_stdlib.allocation.nodecheck import _verdict, check_command, remote_paths
from synthbatch.agent_stdlib.contracts import ReplicaSpec
from tests.agent_runs import local_plan


def _placed(tmp_path, nodes=(0, 1)):
    plan = local_plan(sys.executable, [sys.executable, "/srv/server.py", "{port}"])
    dep = dataclasses.replace(plan.deployments[0], model=str(tmp_path / "model.gguf"),
                              replicas=len(nodes),
                              placement=tuple(ReplicaSpec(i, n, (), 20000 + i)
                                              for i, n in enumerate(nodes)))
    runtime = dataclasses.replace(plan.runtime, launcher="srun")
    return dataclasses.replace(plan, deployments=(dep,), runtime=runtime)


def test_only_other_nodes_are_checked_with_model_and_executable(tmp_path):
    plan = _placed(tmp_path, nodes=(0, 1, 1))
    assert remote_paths(plan) == {1: [str(tmp_path / "model.gguf"), sys.executable]}
    assert remote_paths(_placed(tmp_path, nodes=(0, 0))) == {}


def test_check_step_runs_on_the_node_without_gpus_and_little_memory(tmp_path):
    argv = check_command(_placed(tmp_path), "/run/agent.pyz", 1, ["/m"])
    assert argv[0] == "srun" and "--relative=1" in argv and "--mem=64" in argv
    assert not any(a.startswith(("--gres", "--gpus")) for a in argv)
    assert argv[argv.index("--") + 1:] == [sys.executable, "-I", "/run/agent.pyz", "check",
                                           "--path", "/m"]


def test_check_role_reports_missing_paths(agent_pyz, tmp_path):
    present = tmp_path / "here"
    present.write_text("x")
    proc = subprocess.run([sys.executable, "-I", str(agent_pyz), "check", "--path",
                           str(present), "--path", str(tmp_path / "gone")],
                          capture_output=True, text=True, timeout=60,
                          env={"SHIV_ROOT": str(tmp_path / "shiv"), "SLURMD_NODENAME": "n2"})
    assert proc.returncode == 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"node": "n2", "missing": [str(tmp_path / "gone")]}
    expected = f"{tmp_path / 'gone'} is missing or not readable"
    assert _verdict(proc.stdout, proc.returncode) == expected
    assert _verdict('{"node": "n2", "missing": []}\n', 0) is None
    assert _verdict("srun: error: Unable to create step\n", 1) == ""


def test_every_node_of_a_replica_across_nodes_is_checked(tmp_path):
    plan = _placed(tmp_path, nodes=(0,))
    dep = dataclasses.replace(plan.deployments[0], nodes_per_replica=3, placement=(
        ReplicaSpec(0, 0, (0,), 20000, nodes=(0, 1, 2), dist_port=20001),))
    wanted = [str(tmp_path / "model.gguf"), sys.executable]
    assert remote_paths(dataclasses.replace(plan, deployments=(dep,))) == {1: wanted,
                                                                           2: wanted}
