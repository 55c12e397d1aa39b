"""Preflight checks, each failing with one line that names what is wrong."""

from __future__ import annotations

import dataclasses
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_stdlib.contracts import AttemptRecord
from agent_stdlib.preflight import (
    Context,
    PreflightError,
    assign_ports,
    check_gpus,
    check_identity,
    check_nodes,
    check_paths,
    check_ports,
    run_preflight,
    visible_gpus,
)
from agent_stdlib.slurmjob import identity
from tests.agent_runs import local_plan

SLURM_ENV = {"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "0",
             "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "node1",
             "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1"}


def make_ctx(tmp_path: Path, env: Any = None, gpus: int = 0, model: str = "fake-model",
             record: Any = None, command: Any = None) -> Context:
    env = dict(SLURM_ENV if env is None else env)
    plan = local_plan(sys.executable, command or [sys.executable, "-c", "pass"])
    dep = dataclasses.replace(plan.deployments[0], gpus_per_replica=gpus, model=model)
    plan = plan.replace(deployments=(dep,))
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "agent.pyz").write_text("")
    record = record or AttemptRecord(run_id="r", shard=0, attempt=1, state="submitted",
                                     revision=2, updated_at=0.0, job_id="36_0")
    return Context(plan=plan, shard=0, attempt=record, ident=identity(env), env=env,
                   plan_json=tmp_path / "plan.json", agent_pyz=tmp_path / "agent.pyz",
                   writable=[tmp_path])


def test_a_matching_allocation_passes_and_gets_its_ports(tmp_path):
    ctx = make_ctx(tmp_path)
    check_identity(ctx)
    check_nodes(ctx)
    ports = run_preflight(ctx)
    assert ports == assign_ports(20000, "36_0", 1)


@pytest.mark.parametrize("change, message", [
    ({"SLURM_ARRAY_JOB_ID": "99"}, "this allocation is job 99_0, the attempt record names "
                                   "job 36_0"),
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set"),
])
def test_identity_mismatch(tmp_path, change, message):
    with pytest.raises(PreflightError, match=message):
        check_identity(make_ctx(tmp_path, env={**SLURM_ENV, **change}))


def test_restart_count_behind_the_record_is_a_stale_allocation(tmp_path):
    record = AttemptRecord(run_id="r", shard=0, attempt=1, state="running", revision=5,
                           updated_at=0.0, job_id="36_0", restarts=2)
    with pytest.raises(PreflightError, match="SLURM_RESTART_COUNT=0 is behind"):
        check_identity(make_ctx(tmp_path, record=record))


def test_node_count_must_match(tmp_path):
    with pytest.raises(PreflightError, match="needs 1 node"):
        check_nodes(make_ctx(tmp_path, env={**SLURM_ENV, "SLURM_JOB_NUM_NODES": "2"}))


@pytest.mark.parametrize("env, ok", [
    ({"SLURM_JOB_GPUS": "0,1"}, True),
    ({"SLURM_JOB_GPUS": "0,1,2,3"}, True),  # a superset is accepted
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, True),
    ({"SLURM_JOB_GPUS": "0"}, False),
    ({"CUDA_VISIBLE_DEVICES": ""}, False),
    ({}, False),
])
def test_gpu_shape(tmp_path, env, ok):
    ctx = make_ctx(tmp_path, env={**SLURM_ENV, **env}, gpus=2)
    if ok:
        check_gpus(ctx)
    else:
        with pytest.raises(PreflightError, match="the plan needs 2 GPU"):
            check_gpus(ctx)


def test_visible_gpus_prefers_slurm_job_gpus():
    assert visible_gpus({"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}) == ["4", "5"]
    assert visible_gpus({}) is None


def test_absolute_model_path_must_exist(tmp_path):
    with pytest.raises(PreflightError, match="model /no/such/model is missing"):
        check_paths(make_ctx(tmp_path, model="/no/such/model"))
    (tmp_path / "weights").mkdir()
    check_paths(make_ctx(tmp_path, model=str(tmp_path / "weights")))
    check_paths(make_ctx(tmp_path, model="org/hub-name"))  # not a path: not checked


def test_server_command_and_writable_dirs(tmp_path):
    with pytest.raises(PreflightError, match="command /no/such/engine is missing"):
        check_paths(make_ctx(tmp_path, command=["/no/such/engine", "--port", "{port}"]))
    ctx = dataclasses.replace(make_ctx(tmp_path), writable=[tmp_path / "absent"])
    with pytest.raises(PreflightError, match="absent is missing or not writable"):
        check_paths(ctx)


def test_port_taken_is_reported_with_the_node(tmp_path):
    ctx = make_ctx(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(PreflightError, match=f"127.0.0.1:{port} is already in use on node1"):
            check_ports(ctx, [port])
    with pytest.raises(PreflightError, match="outside 1024-65535"):
        check_ports(ctx, [70000])


def test_ports_are_deterministic_per_job_and_distinct_within_it():
    assert assign_ports(20000, "36_0", 3) == assign_ports(20000, "36_0", 3)
    ports = assign_ports(20000, "36_0", 3)
    assert len(set(ports)) == 3 and all(20000 <= p < 20000 + 512 * 16 for p in ports)
    assert assign_ports(20000, "36_0", 1) != assign_ports(20000, "36_1", 1)
