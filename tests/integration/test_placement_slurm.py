"""Placement, secrets and multi-node directives on the real Slurm testbed.

Runs are staged by hand (like ``test_runtime_slurm.py``) from plans built with
``agent_stdlib.contracts``: a 2-replica deployment placed on node 0 and node 1 of a
2-node allocation, a secret passed by name, and a missing secret.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.allocation.launch import Site
from synthbatch.agent_stdlib.allocation.preflight import plan_sites
from synthbatch.agent_stdlib.contracts import Plan, ReplicaSpec
from synthbatch.agent_stdlib.publish import load_winner
from tests.integration.allocations import (
    Job,
    assert_failed_in_preflight,
    assert_stopped_and_clean,
    make_plan,
    slurm_log,
    submit,
)
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm
PORT_BASE = 21000


def two_node_plan(python: str, model: str, request_log: Path, records: int,
                  exclusive: bool = False) -> Plan:
    """``tiny`` with 2 replicas of 1 GPU, replica 0 on node 0 and replica 1 on node 1."""
    plan = make_plan(python, model, ["--token-latency", "0.05",
                                     "--request-log", str(request_log) + "-{port}.jsonl"],
                     records=records, gpus=1)
    placement = (ReplicaSpec(index=0, node=0, gpus=(0,), port=PORT_BASE),
                 ReplicaSpec(index=1, node=1, gpus=(0,), port=PORT_BASE + 1))
    dep = dataclasses.replace(plan.deployments[0], replicas=2, nodes=2, placement=placement)
    resources = dataclasses.replace(plan.resources, nodes=2,
                                    options={"exclusive": ""} if exclusive else {})
    runtime = dataclasses.replace(plan.runtime, port_base=PORT_BASE)
    return plan.replace(deployments=(dep,), resources=resources, runtime=runtime)


def step_nodes(job: Job) -> Dict[str, str]:
    out = job.cluster.run("squeue", "-h", "-s", "-j", job.key, "-o", "%j|%N",
                          check=False).stdout
    return dict(line.split("|", 1) for line in out.split() if "|" in line)


def request_counts(prefix: Path, ports: List[int]) -> List[int]:
    counts = []
    for port in ports:
        path = Path(f"{prefix}-{port}.jsonl")
        counts.append(len(path.read_text().splitlines()) if path.exists() else 0)
    return counts


@pytest.fixture
def launched(slurm_cluster, tmp_path):  # type: ignore[no-untyped-def]
    jobs: List[Job] = []
    yield jobs
    for job in jobs:
        slurm_cluster.run("scancel", job.array_id, check=False)


def test_two_replicas_on_two_nodes_serve_and_share_the_load(slurm_cluster, tmp_path, agent_pyz,
                                                            python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    requests = tmp_path / "requests"
    plan = two_node_plan(python_exe, model, requests, records=24)
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model)
    launched.append(job)
    ready = job.wait_readiness("ready", timeout=60)
    backends = [b.url for b in ready.backends["tiny"]]
    expected = plan_sites(plan, job.array_id,  # a 1-task array: its raw job id
                          {0: ("node1", "127.0.0.1"), 1: ("node2", "127.0.0.1")})
    assert backends == [s.url for s in expected["tiny"]], (backends, expected)
    nodes = slurm_cluster.wait_for(lambda: (n := step_nodes(job)).get("server-tiny-1") and n,
                                   what="server steps")
    assert nodes["server-tiny-0"] == "node1" and nodes["server-tiny-1"] == "node2", nodes
    assert nodes.get("client", "node1") == "node1", nodes  # the client stays by the proxy
    job.wait_done()
    assert_stopped_and_clean(job, "succeeded")
    assert load_winner(job.layout, 0).records == 24
    checks = job.cluster.run("sacct", "-n", "-P", "-j", job.key, "--format=JobName,NodeList,State",
                             check=False).stdout
    assert "preflight-paths|node2|COMPLETED" in checks, checks  # paths checked on node2 too
    counts = request_counts(requests, [s.port for s in expected["tiny"]])
    assert sum(counts) >= 24 and min(counts) > 0, counts  # both replicas answered
    script = job.layout.submission_script(1).read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script


def test_exclusive_allocation_uses_the_plan_ports(slurm_cluster, tmp_path, agent_pyz,
                                                  python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    plan = two_node_plan(python_exe, model, tmp_path / "requests", records=4, exclusive=True)
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model)
    launched.append(job)
    ready = job.wait_readiness("ready", timeout=90)
    assert [b.url for b in ready.backends["tiny"]] == [
        Site(0, "127.0.0.1", PORT_BASE).url, Site(1, "127.0.0.1", PORT_BASE + 1).url]
    job.wait_done()
    assert_stopped_and_clean(job, "succeeded")
    assert "#SBATCH --exclusive" in job.layout.submission_script(1).read_text()


def environ_of(pid: int) -> Dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}


def server_pid(model: str) -> Optional[int]:
    for line in processes_mentioning(model):
        pid, cmd = line.split(": ", 1)
        if "fake_openai_server.py" in cmd and not cmd.startswith("srun"):
            return int(pid)
    return None


def secret_plan(python: str, model: str, job_var: str) -> Plan:
    plan = make_plan(python, model, ["--token-latency", "0.2"], records=6)
    dep = dataclasses.replace(plan.deployments[0], secret_env={"MY_TOKEN": job_var})
    return plan.replace(deployments=(dep,))


def test_secret_reaches_the_server_environment_by_name(slurm_cluster, tmp_path, agent_pyz,
                                                       python_exe, launched, monkeypatch):
    model = f"fake-{secrets.token_hex(4)}"
    value = f"tok-{secrets.token_hex(8)}"
    monkeypatch.setenv("SYNTHBATCH_TEST_JOB_SECRET", value)  # sbatch exports it to the job
    plan = secret_plan(python_exe, model, "SYNTHBATCH_TEST_JOB_SECRET")
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model)
    launched.append(job)
    job.wait_readiness("ready", timeout=60)
    pid = slurm_cluster.wait_for(lambda: server_pid(model), what="server process")
    env = environ_of(pid)
    assert env.get("MY_TOKEN") == value
    assert "SYNTHBATCH_TEST_JOB_SECRET" not in env  # only the step's own name
    job.wait_done()
    assert_stopped_and_clean(job, "succeeded")
    for path in job.root.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".log", ".out", ".sbatch"):
            assert value not in path.read_text(errors="replace"), path


def test_missing_secret_fails_preflight_before_any_step(slurm_cluster, tmp_path, agent_pyz,
                                                        python_exe, launched, monkeypatch):
    monkeypatch.delenv("SYNTHBATCH_TEST_NO_SUCH_SECRET", raising=False)
    model = f"fake-{secrets.token_hex(4)}"
    plan = secret_plan(python_exe, model, "SYNTHBATCH_TEST_NO_SUCH_SECRET")
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model)
    launched.append(job)
    assert_failed_in_preflight(job, slurm_cluster,
                               "secrets: deployment tiny: secret variable "
                               "SYNTHBATCH_TEST_NO_SUCH_SECRET (for MY_TOKEN) is not set")
    assert "SYNTHBATCH_TEST_NO_SUCH_SECRET" in slurm_log(job)

