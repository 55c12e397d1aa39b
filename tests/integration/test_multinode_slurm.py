"""Replicas that span nodes and models that share a node, on the real 3-node testbed whose
nodes have distinct loopback addresses (``slurm_cluster_multinode``).

Plans come from the real planner. The big deployment is ``engine = "vllm"`` with TP 4 x
PP 2 on 4-GPU nodes, run by ``fixtures/fake_vllm.py`` (which checks the rendered vLLM
multi-node command line as vLLM would, then runs the fake server's rank R of N), so the
exact argv the planner renders and each rank's ``serve`` role completes is what runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.allocation.preflight import plan_sites
from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.publish import load_winner
from synthbatch.agent_stdlib.statefile import read_json
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import FAKE_SERVER, REPO
from tests.integration.allocations import (
    Job,
    assert_failed_in_preflight,
    assert_stopped_and_clean,
    slurm_log,
    submit,
    wait_no_leftovers,
)
from tests.integration.conftest import node_addrs
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm
FAKE_VLLM = REPO / "fixtures" / "fake_vllm.py"
PORT_BASE = 21000


def plan_of(tmp_path: Path, python: str, deployments: List[Dict[str, Any]],
            client: Optional[Dict[str, Any]] = None, records: int = 24) -> Plan:
    run = RunConfig.model_validate({
        "schema_version": 1, "name": "big", "records": records, "shards": {"count": 1},
        "client": client or {"model": deployments[-1]["alias"], "max_tokens": 8,
                             "prompt_template": "Tell me about {index}.", "concurrency": 3,
                             "temperature": 0.0, "max_retries": 5},
        "deployments": deployments, "resources": {"mem_mb": 1024, "cpus": 1}})
    profile = Profile(schema_version=1, workspace=str(tmp_path / "ws"), partition="debug",
                      gpus_per_node=4, python=python, port_base=PORT_BASE, grace_s=3.0)
    return make_plan(run, profile, f"mn-{secrets.token_hex(4)}", tmp_path)


def big(model: str, *extra: str) -> Dict[str, Any]:
    """TP 4 x PP 2 = 8 GPUs on 4-GPU nodes: one replica across 2 nodes (inferred)."""
    return {"alias": "big", "engine": "vllm", "model": "org/fake-405b", "served_name": model,
            "executable": str(FAKE_VLLM), "tensor_parallel": 4, "pipeline_parallel": 2,
            "startup_timeout_s": 60, "extra_args": ["--token-latency", "0.05", *extra]}


def fake(alias: str, model: str, **fields: Any) -> Dict[str, Any]:
    return {"alias": alias, "model": model, "gpus": 1, "startup_timeout_s": 60,
            "command": ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
                        "--model", model, "--token-latency", "0.02"], **fields}


@pytest.fixture
def launched(slurm_cluster_multinode):  # type: ignore[no-untyped-def]
    jobs: List[Job] = []
    yield jobs
    for job in jobs:
        slurm_cluster_multinode.run("scancel", job.array_id, check=False)


def start(cluster: Any, tmp_path: Path, agent_pyz: Path, python: str, plan: Plan,
          model: str, jobs: List[Job]) -> Job:
    job = submit(cluster, tmp_path, agent_pyz, python, plan, model)
    jobs.append(job)
    return job


def models_report(url: str) -> Dict[str, Any]:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:  # loopback only
        return json.loads(resp.read())["data"][0]["synthbatch_test"]


def step_of(job: Job, name: str) -> Dict[str, str]:
    """Nodes and tasks of the job's step ``name`` (squeue)."""
    rows = job.cluster.run("squeue", "-h", "-s", "-j", job.key, "-O",
                           "StepName:40,NumTasks:8,StepId:20").stdout.splitlines()
    nodes = dict(line.split("|")[1:] for line in job.cluster.run(
        "squeue", "-h", "-s", "-j", job.key, "-o", "%i|%j|%N").stdout.split())
    for row in rows:
        fields = row.split()
        if fields and fields[0] == name:
            return {"tasks": fields[1], "nodes": nodes[name]}
    raise AssertionError(f"no step {name}: {rows}")


def nodes_in_order(job: Job) -> List[str]:
    nodelist = job.cluster.run("squeue", "-h", "-t", "all", "-j", job.key, "-o",
                               "%N").stdout.strip()
    return job.cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()


def test_the_testbed_nodes_have_their_own_addresses_and_names(slurm_cluster_multinode):
    addrs = node_addrs(slurm_cluster_multinode)
    assert len(set(addrs.values())) == len(addrs) >= 3, addrs
    # the same port on three "nodes" at once, each on its own address
    code = ("import os, socket, sys, time; s = socket.socket(); "
            "s.bind((dict(a.split('=') for a in sys.argv[1].split(';'))"
            "[os.environ['SLURMD_NODENAME']], 23999)); s.listen(); time.sleep(2); "
            "print(os.environ['SLURMD_NODENAME'], socket.gethostname(), s.getsockname()[0])")
    table = ";".join(f"{n}={a}" for n, a in addrs.items())
    res = slurm_cluster_multinode.run("srun", "-N3", "-n3", "-l", "python3", "-c", code, table,
                                      timeout=60)
    lines = sorted(line.split(": ", 1)[1] for line in res.stdout.splitlines())
    assert lines == [f"{n} {n} {addrs[n]}" for n in sorted(addrs)], res.stdout


@pytest.mark.parametrize("judge_first", [False, True], ids=["leader-on-node0",
                                                            "leader-on-node1"])
def test_tp4_pp2_runs_as_one_step_of_two_ranks_on_the_planned_hosts_and_gpus(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched, judge_first):
    model = f"fake-{secrets.token_hex(4)}"
    deps = [big(model)]
    if judge_first:  # node 0 is taken by a judge: the replica spans nodes 1-2
        deps.insert(0, fake("judge", f"{model}-judge"))
    plan = plan_of(tmp_path, python_exe, deps)
    spec = plan.deployment("big").placement[0]
    assert spec.span == ((1, 2) if judge_first else (0, 1)) and spec.gpus == (0, 1, 2, 3)
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    ready = job.wait_readiness("ready", timeout=120)
    order = nodes_in_order(job)
    leader, follower = (order[n] for n in spec.span)
    step = step_of(job, "server-big-0")
    assert step["tasks"] == "2", step
    assert job.cluster.run("scontrol", "show", "hostnames", step["nodes"]).stdout.split() \
        == [leader, follower]
    url = ready.backends["big"][0].url
    addrs = node_addrs(job.cluster)
    assert url.startswith("http://127.0.0.1:" if not judge_first else f"http://{addrs[leader]}:")
    report = models_report(url)  # rank 0 answers for every rank that joined it
    assert {r: (v["node"], v["cuda_visible_devices"]) for r, v in report["ranks"].items()} \
        == {"0": (leader, "0,1,2,3"), "1": (follower, "0,1,2,3")}, report
    assert report["ranks"]["1"]["slurm_step_gpus"] == "0,1,2,3"
    job.wait_done(timeout=120)
    assert_stopped_and_clean(job, "succeeded")
    assert load_winner(job.layout, 0).records == 24
    log = (job.paths.execution_logs(1) / "server-big-0.log").read_text()
    assert re.search(rf"^0: serve: replica server-big-0 of {leader}, rank 0 of 2: plan GPUs "
                     r"0,1,2,3 -> CUDA_VISIBLE_DEVICES=0,1,2,3", log, re.M), log
    assert re.search(rf"^1: serve: replica server-big-0 of {follower}, rank 1 of 2: plan GPUs "
                     r"0,1,2,3 -> ", log, re.M), log
    assert f"1: fake-openai-server rank 1: joined rank 0 at {addrs[leader]}:" in log
    # the graceful stop reached every rank through its step (scancel --signal=TERM), srun
    # itself was never signalled (it would SIGKILL the tasks: "forcing job termination")
    assert log.count("stopped by SIGTERM") == 2 and "the replica ends" not in log, log
    logs = job.paths.execution_logs(1)
    for server in logs.glob("server-*.log"):
        assert "forcing job termination" not in server.read_text(), server


def engine_pid(model: str, rank: int) -> Optional[int]:
    """The fake engine of ``rank`` (not its serve role, whose argv still says {node_rank})."""
    for line in processes_mentioning(model):
        pid, cmd = line.split(": ", 1)
        if "fake_vllm.py serve" in cmd and f"--node-rank {rank} " in cmd + " " \
                and not cmd.startswith("srun") and " serve --gpus" not in cmd:
            return int(pid)
    return None


def kill_engine(job: Job, model: str, rank: int) -> int:
    """Once the replica serves and the client has made progress, SIGKILL ``rank``'s engine
    and wait for the job to end; the other rank's engine pid (as it was)."""
    job.wait_readiness("ready", timeout=120)
    job.cluster.wait_for(lambda: (read_json(job.paths.progress_json) or {})
                         .get("records_done", 0) >= 2, what="client progress")
    victim = job.cluster.wait_for(lambda: engine_pid(model, rank), what=f"rank {rank}'s engine")
    other = engine_pid(model, 1 - rank)
    assert other is not None
    os.kill(victim, signal.SIGKILL)
    job.wait_done(timeout=90)
    return other


def test_a_follower_that_dies_ends_the_replica_and_fails_the_attempt_naming_it(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    plan = plan_of(tmp_path, python_exe, [big(model)], records=400).replace(
        restarts_in_allocation=0)  # runs >= 30 s; the attempt fails, no restart
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    leader = kill_engine(job, model, 1)  # a crashed rank (OOM, segfault)
    attempt = assert_stopped_and_clean(job, "failed")
    node2 = nodes_in_order(job)[1]
    assert attempt.reason.startswith(
        f"server-big-0 (2 nodes) ended: rank 1 on {node2}: the engine was killed by signal 9 "
        "(SIGKILL) (srun status "), attempt.reason
    assert ", rank 1: serve: replica server-big-0 of " in attempt.reason  # its own lines
    assert "fake-openai-server rank 1: joined rank 0 at" in attempt.reason
    assert "server-big-0 (2 nodes) ended: rank 1" in slurm_log(job)  # the agent's line
    wait_no_leftovers(job)  # rank 0 kept serving by itself (the fake does): gone all the same
    assert not any(line.startswith(f"{leader}: ") for line in processes_mentioning(model))


def test_a_leader_killed_while_generating_is_named_not_the_client(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    """Kill -9 rank 0's engine while the client generates: the client (no retries) fails on
    the proxy's 502 at once, while srun is still ending the step. The attempt names the
    dead leader, not the client (issue 28.6: 2 of 6 tries blamed the client)."""
    model = f"fake-{secrets.token_hex(4)}"
    client = {"model": "big", "max_tokens": 8, "prompt_template": "Tell me about {index}.",
              "concurrency": 3, "temperature": 0.0, "max_retries": 0}
    plan = plan_of(tmp_path, python_exe, [big(model)], client=client, records=400).replace(
        restarts_in_allocation=0)  # the attempt fails, no restart
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    kill_engine(job, model, 0)
    attempt = assert_stopped_and_clean(job, "failed")
    node1 = nodes_in_order(job)[0]
    assert attempt.reason.startswith(
        f"server-big-0 (2 nodes) ended: rank 0 on {node1}: the engine was killed by signal 9 "
        "(SIGKILL)"), attempt.reason
    assert "client exited with status" not in attempt.reason.split(" (")[0]
    wait_no_leftovers(job)


def test_a_leader_that_exits_ends_the_replica_and_fails_the_attempt_naming_it(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    plan = plan_of(tmp_path, python_exe, [big(model, "--exit-after", "3")]).replace(
        restarts_in_allocation=0)  # the attempt fails at the first end, not after restarts
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    job.wait_done(timeout=120)
    attempt = assert_stopped_and_clean(job, "failed")
    node1 = nodes_in_order(job)[0]
    assert attempt.reason.startswith(
        f"server-big-0 (2 nodes) ended: rank 0 on {node1}: the engine exited with status 3 "
        "(srun status "), attempt.reason
    log = (job.paths.execution_logs(1) / "server-big-0.log").read_text()
    # the follower died with its leader, as a real one does, but later: rank 0 is named
    assert "1: fake-openai-server rank 1: rank 0 at" in log, log
    assert not job.steps()


def test_scancel_of_a_replica_across_nodes_is_a_cancellation_not_a_rank_failure(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    """scancel signals the agent and every rank at once: the ranks' 'stopped by SIGTERM'
    must not turn the cancellation into a failure naming a rank (the outcome is recorded
    before cleanup), and cleanup still leaves no rank on either node."""
    model = f"fake-{secrets.token_hex(4)}"
    plan = plan_of(tmp_path, python_exe, [big(model)], records=400)  # runs >= 30 s
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    job.wait_readiness("ready", timeout=120)
    job.cluster.wait_for(lambda: (read_json(job.paths.progress_json) or {})
                         .get("records_done", 0) >= 2, what="client progress")
    assert engine_pid(model, 0) and engine_pid(model, 1)
    job.cluster.run("scancel", job.array_id)
    job.wait_done(timeout=90)
    attempt = assert_stopped_and_clean(job, "cancelled")
    assert "SIGTERM" in attempt.reason and "rank" not in attempt.reason, attempt.reason
    assert attempt.partial_records is None or 0 < attempt.partial_records < 400
    wait_no_leftovers(job)
    assert engine_pid(model, 0) is None and engine_pid(model, 1) is None


# the example's two-model client (examples/big-model.toml uses it with a real writer)
CLIENT = REPO / "examples" / "clients" / "generate_and_judge.py"


def test_a_judge_shares_a_node_with_one_of_two_generators_and_both_aliases_serve(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    requests = tmp_path / "requests"
    log_flag = ["--request-log", str(requests) + "-{port}.jsonl"]
    gen = fake("gen", model, replicas=2, nodes=2)
    gen["command"] += log_flag
    judge = fake("judge", f"{model}-judge", shared_node="gen")
    judge["command"] += log_flag
    plan = plan_of(tmp_path, python_exe, [gen, judge], records=20,
                   client={"command": ["{python}", str(CLIENT), "--writer", f"gen={model}",
                                       "--judge", f"judge={model}-judge", "--concurrency",
                                       "4", "--max-tokens", "4"]})
    assert [(r.node, r.gpus) for r in plan.deployment("gen").placement] == [(0, (0,)),
                                                                            (1, (0,))]
    assert [(r.node, r.gpus) for r in plan.deployment("judge").placement] == [(0, (1,))]
    job = start(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model, launched)
    ready = job.wait_readiness("ready", timeout=120)
    assert sorted(ready.endpoints) == ["gen", "judge"]
    order = nodes_in_order(job)
    seen = {alias: [models_report(b.url) for b in ready.backends[alias]]
            for alias in ("gen", "judge")}
    assert [(r["node"], r["cuda_visible_devices"]) for r in seen["gen"]] == \
        [(order[0], "0"), (order[1], "0")]
    assert [(r["node"], r["cuda_visible_devices"]) for r in seen["judge"]] == [(order[0], "1")]
    ports = [int(b.url.rsplit(":", 1)[1]) for alias in ready.backends
             for b in ready.backends[alias]]
    assert len(set(ports)) == 3
    job.wait_done(timeout=120)
    assert_stopped_and_clean(job, "succeeded")
    assert load_winner(job.layout, 0).records == 20
    counts = {}
    for alias in ("gen", "judge"):
        for backend in ready.backends[alias]:
            port = backend.url.rsplit(":", 1)[1]
            path = Path(f"{requests}-{port}.jsonl")
            counts[backend.url] = len(path.read_text().splitlines()) if path.exists() else 0
    gen_counts = [counts[b.url] for b in ready.backends["gen"]]
    assert sum(gen_counts) == 20 and min(gen_counts) > 0, counts  # the proxy spread them
    assert counts[ready.backends["judge"][0].url] == 20, counts
    client_log = (job.paths.execution_logs(1) / "client.log").read_text()
    assert "generate_and_judge: 20 records with ['gen', 'judge']" in client_log
    rows = [json.loads(line) for line in next(job.paths.output.glob("*.jsonl")).open()]
    assert [r["index"] for r in rows] == list(range(20)) and all(r["judgement"] for r in rows)


def test_preflight_finds_a_port_taken_on_a_follower_s_node(
        slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, launched):
    model = f"fake-{secrets.token_hex(4)}"
    plan = plan_of(tmp_path, python_exe, [big(model)])
    job = submit(slurm_cluster_multinode, tmp_path, agent_pyz, python_exe, plan, model,
                 hold=True)
    launched.append(job)
    addrs = node_addrs(job.cluster)
    hosts = {n: (name, addrs[name]) for n, name in enumerate(sorted(addrs))}
    port = plan_sites(plan, job.array_id, hosts)["big"][0].port
    taken = []
    try:  # something else holds the replica's port on every node a follower may get
        for name in sorted(addrs)[1:]:
            sock = socket.socket()
            taken.append(sock)
            sock.bind((addrs[name], port))
            sock.listen()
        job.release()
        assert_failed_in_preflight(job, job.cluster, f":{port} is already in use on node")
    finally:
        for sock in taken:
            sock.close()
    follower = nodes_in_order(job)[1]
    assert f"ports: {addrs[follower]}:{port} is already in use on {follower}" in \
        job.attempt().reason
