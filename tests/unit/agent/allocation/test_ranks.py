"""Replicas across nodes: what each rank runs (goldens from plan to per-rank argv), how a
rank learns who it is, and how the first rank to end is found in the step's log."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest

from synthbatch.agent_stdlib.allocation.launch import LaunchError, Site, server_launch
from synthbatch.agent_stdlib.allocation.preflight import plan_sites
from synthbatch.agent_stdlib.allocation.ranks import (
    EXIT_RANK_ENDED,
    RankError,
    RankId,
    exit_line,
    first_rank_exit,
    rank_argv,
    rank_of,
)
from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import REPO
from tests.fakes import poll

AGENT = "/ws/runs/r-1/agent-" + "a" * 64 + ".pyz"
HOSTS = {0: ("node1", "127.0.0.1"), 1: ("node2", "10.0.0.2")}
LEADERS = {0: "10.0.0.1"}  # node1's NodeAddr: where rank 1 reaches rank 0
AMBIENT = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "12"}


def big_plan(engine: str, tp: int, pp: int, **dep: Any) -> Plan:
    run = RunConfig.model_validate({
        "schema_version": 1, "name": "big", "records": 10, "shards": {"count": 1},
        "client": {"model": "big", "prompt_template": "x {index}"},
        "deployments": [{"alias": "big", "engine": engine, "model": "/models/llama-405b",
                         "served_name": "llama", "tensor_parallel": tp,
                         "pipeline_parallel": pp, "startup_timeout_s": 1200, **dep}]})
    prof = Profile(schema_version=1, workspace="/ws", gpus_per_node=8, partition="gpu",
                   mem_mb=64000)
    return make_plan(run, prof, "r-1", Path("/cfg"))


def rendered(plan: Plan) -> str:
    """The plan's argv, the srun step of replica 0, and the engine argv of each rank."""
    dep = plan.deployments[0]
    site = plan_sites(plan, "12", HOSTS, LEADERS)["big"][0]
    launch = server_launch(plan, dep, 0, site, AGENT, AMBIENT)
    task = list(launch.argv[launch.argv.index("--") + 1:])
    engine = task[task.index("--") + 1:]
    ranks = [rank_argv(engine, site.hosts, rank, dep.follower_args)
             for rank in range(len(site.span))]
    return json.dumps({"plan": {"command": list(dep.command),
                                "follower_args": list(dep.follower_args),
                                "placement": [dataclasses.asdict(r) for r in dep.placement]},
                       "step": list(launch.argv), "ranks": ranks}, indent=2) + "\n"


SHAPES: Dict[str, Callable[[], Plan]] = {
    "vllm-tp8-pp2": lambda: big_plan("vllm", 8, 2),
    "vllm-tp1-pp2": lambda: big_plan("vllm", 1, 2, nodes_per_replica=2),
    "vllm-tp16": lambda: big_plan("vllm", 16, 1),
    "vllm-tp8-pp2-python": lambda: big_plan("vllm", 8, 2, python="/envs/vllm/bin/python"),
    "sglang-tp8-pp2": lambda: big_plan("sglang", 8, 2),
    "sglang-tp1-pp2": lambda: big_plan("sglang", 1, 2, nodes_per_replica=2),
    "sglang-tp16": lambda: big_plan("sglang", 16, 1),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_rank_command_lines_golden(shape: str, golden: Callable[[str, str], None]) -> None:
    golden(f"ranks-{shape}.json", rendered(SHAPES[shape]()))


def test_every_rank_finds_rank_0_at_the_leader_address_and_binds_its_own() -> None:
    plan = big_plan("vllm", 8, 2)
    site = plan_sites(plan, "12", HOSTS, LEADERS)["big"][0]
    assert (site.span, site.hosts, site.leader) == ((0, 1), ("127.0.0.1", "10.0.0.2"),
                                                    "10.0.0.1")
    launch = server_launch(plan, plan.deployments[0], 0, site, AGENT, AMBIENT)
    argv = list(launch.argv)
    assert argv[:9] == ["srun", "--overlap", "--exact", "--nodes=2", "--ntasks=2",
                        "--ntasks-per-node=1", "--mem=32000", "--job-name=server-big-0",
                        "--kill-on-bad-exit=1"]
    assert "--label" in argv and "--relative=0" in argv and "--gres=gpu:8" in argv
    engine = argv[argv.index("--", argv.index("serve")) + 1:]
    assert engine[engine.index("--master-addr") + 1] == "10.0.0.1"
    assert engine[engine.index("--master-port") + 1] == str(site.dist_port)
    assert engine[engine.index("--port") + 1] == str(site.port)
    assert engine[engine.index("--host") + 1] == "{host}"  # each rank's own
    rank0, rank1 = (rank_argv(engine, site.hosts, r, ("--headless",)) for r in (0, 1))
    assert rank0[rank0.index("--host") + 1] == "127.0.0.1" and "--headless" not in rank0
    assert rank1[rank1.index("--host") + 1] == "10.0.0.2" and rank1[-1] == "--headless"
    assert rank1[rank1.index("--node-rank") + 1] == "1"


def test_a_replica_across_nodes_needs_consecutive_nodes_and_srun() -> None:
    plan = big_plan("vllm", 8, 2)
    dep = plan.deployments[0]
    site = plan_sites(plan, "12", HOSTS, LEADERS)["big"][0]
    with pytest.raises(LaunchError, match="not consecutive"):
        server_launch(plan, dep, 0, Site(0, "127.0.0.1", 1, gpus=site.gpus, span=(0, 2),
                                         hosts=("a", "b"), leader="a", dist_port=2),
                      AGENT, AMBIENT)
    local = plan.replace(runtime=dataclasses.replace(plan.runtime, launcher="local"))
    with pytest.raises(LaunchError, match="needs the srun launcher"):
        server_launch(local, dep, 0, site, AGENT, AMBIENT)


# ----------------------------------------------------------------------------- rank_of

STEP = {"SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_STEP_NUM_NODES": "2"}


def test_the_rank_is_the_node_index_in_the_step() -> None:
    assert rank_of(STEP, 2) == 1
    assert rank_of({**STEP, "SLURM_NODEID": "0", "SLURM_PROCID": "0"}, 2) == 0
    assert rank_of({"SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_NNODES": "2"}, 2) == 1


@pytest.mark.parametrize("env,message", [
    ({}, "does not say which node it is"),
    ({**STEP, "SLURM_STEP_NUM_NODES": "3"}, "spans 2 nodes, this step runs on 3"),
    ({**STEP, "SLURM_PROCID": "3"}, "one task per node is needed"),
])
def test_a_step_that_is_not_one_task_per_node_is_refused(env: Dict[str, str],
                                                         message: str) -> None:
    with pytest.raises(RankError, match=message):
        rank_of(env, 2)


# ----------------------------------------------------------------------------- the first rank

def labelled(rank: int, line: str) -> str:
    return f"{rank}: {line}"


def test_the_earliest_rank_report_names_the_rank_its_node_and_its_lines() -> None:
    leader = exit_line(RankId("server-big-0", "node1", 0, 2), 3, 1000.250)
    follower = exit_line(RankId("server-big-0", "node2", 1, 2), 1, 1000.900)
    log = "\n".join([
        labelled(0, "serve: replica server-big-0 of node1, rank 0 of 2: plan GPUs 0,1 -> x"),
        labelled(1, "fake-openai-server rank 1: joined rank 0"),
        labelled(0, "engine crashed: \x1b[31mCUDA error\x1b[0m"),
        labelled(1, follower),  # arrived first, happened later
        labelled(0, leader),
        "srun: error: node2: task 1: Exited with exit code 1",
        "srun: error: node1: task 0: Exited with exit code 3",
    ])
    first = first_rank_exit(log)
    assert first is not None
    assert (first.rank, first.node, first.what) == (0, "node1", "the engine exited with status 3")
    assert "engine crashed: \\x1b[31mCUDA error\\x1b[0m" in first.tail  # made visible
    assert "rank 1: joined" not in first.tail


def test_without_a_rank_report_srun_s_first_task_error_counts() -> None:
    log = "\n".join([labelled(1, "partial output"), "srun: error: node3: task 1: Killed",
                     "srun: error: node2: task 0: Terminated"])
    first = first_rank_exit(log)
    assert first is not None and (first.rank, first.node, first.what, first.tail) == \
        (1, "node3", "Killed", "partial output")
    assert first_rank_exit("0: just output\n1: more\n") is None


def test_exit_lines_say_how_the_engine_ended() -> None:
    who = RankId("server-big-0", "node2", 1, 2)
    assert "the engine was killed by signal 9 (SIGKILL)" in exit_line(who, -9, 0.0)
    assert exit_line(who, 0, 1.5).endswith(
        "the engine exited with status 0 (1970-01-01T00:00:01.500Z); the replica ends")


# ----------------------------------------------------------------------------- the role


def serve(tmp_path: Path, engine: List[str], env: Dict[str, str]) -> subprocess.Popen:
    argv = [sys.executable, "-m", "synthbatch.agent_stdlib", "serve", "--gpus", "0", "--replica",
            "server-big-0", "--nnodes", "2", "--hosts", "127.0.0.1,127.0.0.2",
            "--follower-arg=--headless", "--", *engine]
    full = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "0,1",
            "SLURMD_NODENAME": "node2", **STEP, **env}
    return subprocess.Popen(argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def echo(status: int) -> List[str]:
    """An engine that prints its argv and GPUs, then exits with ``status``."""
    code = ("import sys, os; print(sys.argv[1:], os.environ['CUDA_VISIBLE_DEVICES'], "
            f"flush=True); sys.exit({status})")
    return [sys.executable, "-c", code, "--host", "{host}", "--node-rank", "{node_rank}"]


@pytest.mark.parametrize("status,expected", [(0, EXIT_RANK_ENDED), (3, 3)])
def test_a_rank_whose_engine_ends_reports_it_and_never_exits_0(tmp_path: Path, status: int,
                                                               expected: int) -> None:
    engine = echo(status)
    proc = serve(tmp_path, engine, {})
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == expected, err
    assert "['--host', '127.0.0.2', '--node-rank', '1', '--headless'] 0" in out
    assert "serve: replica server-big-0 of node2, rank 1 of 2: plan GPUs 0 -> " \
           "CUDA_VISIBLE_DEVICES=0" in err
    first = first_rank_exit("\n".join(f"1: {line}" for line in err.splitlines()))
    assert first is not None and (first.rank, first.node) == (1, "node2")
    assert first.what == f"the engine exited with status {status}"


def test_a_stop_signal_reaches_the_engine_and_is_not_a_rank_ending(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    engine = [sys.executable, "-c",
              "import signal, sys, time, pathlib\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
              f"pathlib.Path({str(ready)!r}).write_text('x')\n"
              "time.sleep(60)\n"]
    proc = serve(tmp_path, engine, {})
    poll("the engine", ready.exists)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "stopped by SIGTERM; the engine exited with status 0" in err
    assert "the replica ends" not in err


def test_the_engine_dies_with_its_rank(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    engine = [sys.executable, "-c", "import os, time, pathlib\n"
              f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
              "time.sleep(60)\n"]
    proc = serve(tmp_path, engine, {})
    engine_pid = int(poll("the engine", pid_file.exists) and pid_file.read_text())
    proc.kill()  # kill -9 of the role (a node's slurmstepd ending the task)
    proc.communicate(timeout=30)
    poll("the engine gone", lambda: not alive(engine_pid))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
