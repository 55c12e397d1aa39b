"""GPU binding on the real Slurm testbed: every server step sees exactly the plan's GPUs.

On Slurm 22.05 concurrent ``srun --overlap --gres=gpu:2`` steps of one allocation are all
given the same first GPUs (both see ``CUDA_VISIBLE_DEVICES=0,1``). Each test stages a run
by hand (``test_runtime_slurm.py``'s harness) with the planner's own placement, waits for
readiness, and asks every backend's ``/v1/models`` what its process was given (the fake
server's ``synthbatch_test`` entry). Expected: plan GPU index ``k`` of a replica is the
``k``-th GPU the job holds on that node (``scontrol show job -d``, GRES ``IDX``), so
``SLURM_STEP_GPUS`` is that global id; ``CUDA_VISIBLE_DEVICES`` (and Slurm's other device
lists) is the same id, or ``k`` itself where ``ConstrainDevices`` renumbers devices.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from synthbatch.agent_stdlib.contracts import Plan, ReplicaSpec
from synthbatch.control.planning.placement import Shape, place
from tests.integration.allocations import Job, assert_stopped_and_clean, make_plan, submit

pytestmark = pytest.mark.slurm
PORT_BASE = 21000
GPUS_PER_NODE = 4  # the testbed's fake GPUs per node
RECORDS = 24  # 24 records x 8 tokens x 0.1 s / concurrency 3: the client runs >= 6 s
DEVICE_LISTS = ("cuda_visible_devices", "rocr_visible_devices", "gpu_device_ordinal")


def gpu_plan(python: str, model: str, replicas: int, per_replica: int, gpu_request: str,
             nodes: int = 1, options: Optional[Dict[str, str]] = None,
             records: int = RECORDS) -> Plan:
    """``replicas`` x ``per_replica`` GPUs over ``nodes`` nodes, placed by the planner."""
    plan = make_plan(python, model, ["--token-latency", "0.1"], records=records,
                     gpus=per_replica)
    placement = place([Shape(gpus=per_replica, replicas=replicas, nodes=nodes)],
                      GPUS_PER_NODE, PORT_BASE)
    dep = dataclasses.replace(plan.deployments[0], replicas=replicas, nodes=nodes,
                              placement=placement.replicas[0])
    resources = dataclasses.replace(plan.resources, nodes=placement.nodes,
                                    gpus=max(placement.gpus_used), gpu_request=gpu_request,
                                    mem_mb=1024, options=dict(options or {}))
    runtime = dataclasses.replace(plan.runtime, port_base=PORT_BASE)
    return plan.replace(deployments=(dep,), resources=resources, runtime=runtime)


def indices(text: str) -> List[int]:
    """``0-1,3`` -> ``[0, 1, 3]``."""
    out: List[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def job_gpus(job: Job) -> Dict[str, List[int]]:
    """Node -> the GPU indices the job holds there (``scontrol show job -d``)."""
    text = job.cluster.run("scontrol", "show", "job", "-d", job.key).stdout
    found = re.findall(r"Nodes=(\S+) .*?GRES=\S*?\(IDX:([0-9,-]+)\)", text)
    assert found, text
    names = {}
    for nodes, idx in found:
        for name in job.cluster.run("scontrol", "show", "hostnames", nodes).stdout.split():
            names[name] = indices(idx)
    return names


def constrains_devices(cluster: Any) -> bool:
    config = cluster.run("scontrol", "show", "config").stdout
    return bool(re.search(r"^ConstrainDevices\s*=\s*yes", config, re.M | re.I)) and \
        bool(re.search(r"^TaskPlugin\s*=.*task/cgroup", config, re.M))


def reported(url: str) -> Dict[str, Optional[str]]:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:  # loopback only
        return json.loads(resp.read())["data"][0]["synthbatch_test"]


def nodes_in_order(job: Job) -> List[str]:
    nodelist = job.cluster.run("squeue", "-h", "-j", job.key, "-o", "%N").stdout.strip()
    return job.cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()


Seen = List[Tuple[str, str, Tuple[str, ...]]]


def check_binding(job: Job, timeout: float = 90) -> Tuple[Seen, Dict[str, List[int]]]:
    """Wait for readiness; assert every replica sees exactly its plan GPUs.

    Returns (url, node, global GPU ids) per replica in replica order, and the job's GPUs.
    """
    ready = job.wait_readiness("ready", timeout=timeout)
    urls = [b.url for b in ready.backends["tiny"]]
    held = job_gpus(job)
    order = nodes_in_order(job)
    renumbered = constrains_devices(job.cluster)
    seen = []
    placement = job.plan.deployments[0].placement
    assert len(urls) == len(placement), (urls, placement)
    for spec, url in zip(placement, urls):
        node = order[spec.node]
        report = reported(url)
        ids = tuple(str(held[node][k]) for k in spec.gpus)
        local = tuple(str(k) for k in spec.gpus) if renumbered else ids
        where = f"replica {spec.index} ({url}, plan GPUs {spec.gpus} of {node}): {report}"
        assert report["node"] == node, where
        assert report["slurm_step_gpus"] == ",".join(ids), where
        for name in DEVICE_LISTS:
            assert report[name] == ",".join(local), where
        seen.append((url, node, ids))
    for i, (_, node_a, ids_a) in enumerate(seen):
        for _, node_b, ids_b in seen[i + 1:]:
            assert node_a != node_b or not set(ids_a) & set(ids_b), seen  # pairwise disjoint
    return seen, held


def check_logs_and_finish(job: Job) -> None:
    job.wait_done()
    assert_stopped_and_clean(job, "succeeded")
    logs = job.paths.execution_logs(1)
    for spec in job.plan.deployments[0].placement:
        text = (logs / f"server-tiny-{spec.index}.log").read_text()
        wanted = ",".join(str(k) for k in spec.gpus)
        assert f"serve: replica server-tiny-{spec.index} of " in text, text
        assert f": plan GPUs {wanted} -> CUDA_VISIBLE_DEVICES=" in text, text


@pytest.fixture
def launched(slurm_cluster):  # type: ignore[no-untyped-def]
    jobs: List[Job] = []
    yield jobs
    for job in jobs:
        slurm_cluster.run("scancel", job.array_id, check=False)


def start(cluster: Any, root: Path, agent_pyz: Path, python: str, jobs: List[Job],
          hold: bool = False, **shape: Any) -> Job:
    model = f"fake-{secrets.token_hex(4)}"
    root.mkdir(parents=True, exist_ok=True)
    job = submit(cluster, root, agent_pyz, python, gpu_plan(python, model, **shape), model,
                 hold=hold)
    jobs.append(job)
    return job


@pytest.mark.parametrize("gpu_request", ["gres", "gpus"])
@pytest.mark.parametrize("replicas, per_replica", [(2, 2), (4, 1), (1, 4)])
def test_replicas_on_one_node_see_disjoint_gpus_equal_to_the_plan(
        slurm_cluster, tmp_path, agent_pyz, python_exe, launched, gpu_request, replicas,
        per_replica):
    job = start(slurm_cluster, tmp_path, agent_pyz, python_exe, launched, replicas=replicas,
                per_replica=per_replica, gpu_request=gpu_request)
    seen, held = check_binding(job)
    assert sorted(g for _, _, ids in seen for g in ids) == \
        [str(g) for g in sorted(held[seen[0][1]])]  # the node's 4 GPUs, each once
    script = job.layout.submission_script(1).read_text()
    assert ("#SBATCH --gres=gpu:4" if gpu_request == "gres" else "#SBATCH --gpus=4") in script
    check_logs_and_finish(job)


def test_two_nodes_bind_each_nodes_replicas(slurm_cluster, tmp_path, agent_pyz, python_exe,
                                            launched):
    nodes = slurm_cluster.run("sinfo", "-h", "-o", "%D").stdout.split()
    if sum(int(n) for n in nodes) < 2:
        pytest.skip("needs a testbed with 2 nodes")
    job = start(slurm_cluster, tmp_path, agent_pyz, python_exe, launched, replicas=4,
                per_replica=2, gpu_request="gpus", nodes=2)
    seen, _ = check_binding(job)
    assert sorted({node for _, node, _ in seen}) == ["node1", "node2"], seen
    check_logs_and_finish(job)


def test_two_allocations_sharing_a_node_get_disjoint_gpus_and_ports(
        slurm_cluster, tmp_path, agent_pyz, python_exe, launched):
    # partial-node GRES requests, both pinned to node1 (the profile's sbatch_options),
    # released together; each client runs >= 12 s, so both allocations overlap
    shape = {"replicas": 1, "per_replica": 2, "gpu_request": "gres",
             "options": {"nodelist": "node1"}, "records": 2 * RECORDS, "hold": True}
    first = start(slurm_cluster, tmp_path / "a", agent_pyz, python_exe, launched, **shape)
    second = start(slurm_cluster, tmp_path / "b", agent_pyz, python_exe, launched, **shape)
    first.release()
    second.release()
    (seen_a, held_a), (seen_b, held_b) = check_binding(first), check_binding(second)
    assert list(held_a) == list(held_b) == ["node1"], (held_a, held_b)
    assert not set(held_a["node1"]) & set(held_b["node1"]), (held_a, held_b)
    assert not set(seen_a[0][2]) & set(seen_b[0][2]), (seen_a, seen_b)
    assert seen_a[0][0] != seen_b[0][0], (seen_a, seen_b)  # distinct ports
    assert "#SBATCH --nodelist=node1" in first.layout.submission_script(1).read_text()
    for job in (first, second):
        check_logs_and_finish(job)


def test_a_step_that_cannot_cover_its_replica_fails_the_attempt_with_the_reason(
        slurm_cluster, tmp_path, agent_pyz, python_exe, launched):
    # The job holds 4 GPUs (preflight passes: index 3 is covered), but the plan's per-node
    # count, which each server step asks for, is 2: the step sees 0,1, the plan says 2,3.
    model = f"fake-{secrets.token_hex(4)}"
    plan = gpu_plan(python_exe, model, replicas=1, per_replica=2, gpu_request="gres")
    dep = dataclasses.replace(plan.deployments[0], placement=(
        ReplicaSpec(index=0, node=0, gpus=(2, 3), port=PORT_BASE),))
    plan = plan.replace(deployments=(dep,),
                        resources=dataclasses.replace(plan.resources, gpus=2))
    job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model, job_gpus=4)
    launched.append(job)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "failed")
    assert "server-tiny-0 exited with status 78" in attempt.reason, attempt.reason
    assert re.search(r"serve: the plan gives replica server-tiny-0 GPUs 2,3 of node\d, but "
                     r"this step sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES=0,1\)",
                     attempt.reason), attempt.reason
    log = (job.paths.execution_logs(1) / "server-tiny-0.log").read_text()
    assert "fake-openai-server" not in log, log  # the engine never started
