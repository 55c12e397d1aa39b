"""Preflight checks, each failing with one line that names what is wrong."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from synthbatch.agent_stdlib import imagedigest
from synthbatch.agent_stdlib.allocation import imagehash, preflight
from synthbatch.agent_stdlib.allocation.launch import Site
from synthbatch.agent_stdlib.allocation.preflight import (
    Context,
    PreflightError,
    assign_ports,
    check_gpus,
    check_identity,
    check_images,
    check_nodes,
    check_paths,
    check_secrets,
    check_sites,
    node_hosts,
    plan_sites,
    run_preflight,
    visible_gpus,
)
from synthbatch.agent_stdlib.allocation.slurmjob import identity, parse_hostnames, parse_node_addrs
from synthbatch.agent_stdlib.contracts import (
    AttemptRecord,
    ColumnSpec,
    CommandClientSpec,
    ContainerSpec,
    DataDesignerSpec,
    MountSpec,
    Plan,
    ReplicaSpec,
    SeedDataSpec,
)
from tests.agent_runs import local_plan

SLURM_ENV = {"SLURM_JOB_ID": "37", "SLURM_ARRAY_JOB_ID": "36", "SLURM_ARRAY_TASK_ID": "0",
             "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "node1",
             "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1",
             "SHIV_ROOT": "/tmp/shiv", "USER": "u"}  # the batch script sets both


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
    sites = run_preflight(ctx)
    # the block comes from the raw job id (37): concurrent jobs get distinct blocks
    assert sites == {"tiny": [Site(node=0, host="127.0.0.1", port=20000 + 37 * 16)]}
    assert sites["tiny"][0].port == assign_ports(20000, "37", 1)[0]


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


@pytest.mark.parametrize("content,rows,message", [
    (None, 0, r"paths: seed data: .*/topics.jsonl: no such file"),
    ("", 0, r"paths: seed data: .*/topics.jsonl: empty \(no rows\)"),
    ('{"topic": 1}\n{"other": 2}\n', 0, r"paths: seed data: .*/topics.jsonl:2: no field "
                                         r"'topic'"),
    (None, 2, r"paths: seed data: .*/topics.jsonl: no such file"),
    ('{"topic": 1}\n{"other": 2}\n', 2, None),  # checked at plan time: not read again
    ('{"topic": 1}\n', 0, None),
])
def test_seed_data_is_checked_when_the_login_node_could_not(tmp_path, content, rows,
                                                            message):
    path = tmp_path / "topics.jsonl"
    if content is not None:
        path.write_text(content)
    ctx = make_ctx(tmp_path)
    spec = dataclasses.replace(ctx.plan.client, seed_data=SeedDataSpec(
        str(path), "in-order", ("topic",), rows), columns=(ColumnSpec("x", "expression", {
            "template": "{topic}"}),))
    ctx = dataclasses.replace(ctx, plan=ctx.plan.replace(client=spec))
    if message is None:
        check_paths(ctx)
    else:
        with pytest.raises(PreflightError, match=message):
            check_paths(ctx)


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
            check_sites(ctx, {"tiny": [Site(0, "127.0.0.1", port)]}, HOSTS)
    with pytest.raises(PreflightError, match="outside 1024-65535"):
        check_sites(ctx, {"tiny": [Site(0, "127.0.0.1", 70000)]}, HOSTS)


def test_consecutive_raw_job_ids_get_distinct_port_blocks():
    blocks = {assign_ports(20000, str(job), 1)[0] for job in range(1000, 1512)}
    assert len(blocks) == 512  # no two of 512 consecutive jobs share a block


def test_ports_are_deterministic_per_job_and_distinct_within_it():
    assert assign_ports(20000, "36_0", 3) == assign_ports(20000, "36_0", 3)
    ports = assign_ports(20000, "36_0", 3)
    assert len(set(ports)) == 3 and all(20000 <= p < 20000 + 512 * 16 for p in ports)
    assert assign_ports(20000, "36_0", 1) != assign_ports(20000, "36_1", 1)


# ----------------------------------------------------------------------------- placement


def two_node_plan(ctx: Context, exclusive: bool = False) -> Plan:
    """Two replicas of ``tiny``, one on each allocation node, ports port_base + 0/1."""
    gpus = tuple(range(ctx.plan.deployments[0].gpus_per_replica))
    dep = dataclasses.replace(
        ctx.plan.deployments[0], replicas=2, nodes=2,
        placement=(ReplicaSpec(index=0, node=0, gpus=gpus, port=20000),
                   ReplicaSpec(index=1, node=1, gpus=gpus, port=20001)))
    resources = dataclasses.replace(ctx.plan.resources, nodes=2,
                                    options={"exclusive": ""} if exclusive else {})
    runtime = dataclasses.replace(ctx.plan.runtime, launcher="srun")
    return ctx.plan.replace(deployments=(dep,), resources=resources, runtime=runtime)


HOSTS = {0: ("node1", "127.0.0.1"), 1: ("node2", "10.1.2.3")}


def test_exclusive_allocation_listens_on_the_plan_ports(tmp_path):
    plan = two_node_plan(make_ctx(tmp_path), exclusive=True)
    assert plan_sites(plan, "36_0", HOSTS) == {"tiny": [Site(0, "127.0.0.1", 20000),
                                                        Site(1, "10.1.2.3", 20001)]}


def test_shared_nodes_keep_the_plan_offsets_inside_the_job_block(tmp_path):
    plan = two_node_plan(make_ctx(tmp_path))
    block = assign_ports(20000, "36_0", 2)
    sites = plan_sites(plan, "36_0", HOSTS)["tiny"]
    assert [s.port for s in sites] == block and [s.node for s in sites] == [0, 1]
    assert plan_sites(plan, "36_1", HOSTS) != plan_sites(plan, "36_0", HOSTS)


def test_no_placement_is_the_old_per_job_block(tmp_path):
    ctx = make_ctx(tmp_path)
    dep = dataclasses.replace(ctx.plan.deployments[0], replicas=3)
    plan = ctx.plan.replace(deployments=(dep,))
    sites = plan_sites(plan, "36_0", {0: ("node1", "127.0.0.1")})["tiny"]
    assert [s.port for s in sites] == assign_ports(20000, "36_0", 3)


TWO_NODES = {**SLURM_ENV, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2"}


def test_node_hosts_loopback_here_node_addr_elsewhere(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path, env=TWO_NODES)
    ctx = dataclasses.replace(ctx, plan=two_node_plan(ctx))
    asked = []
    monkeypatch.setattr(preflight.slurmjob, "allocation_nodes",
                        lambda nodelist: asked.append(nodelist) or ["node1", "node2"])
    monkeypatch.setattr(preflight.slurmjob, "node_addrs", lambda names: {"node2": "10.1.2.3"})
    assert node_hosts(ctx, [0, 1]) == HOSTS
    assert asked == ["node[1-2]"]


def test_node_hosts_failures_name_the_node(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path, env=TWO_NODES)
    ctx = dataclasses.replace(ctx, plan=two_node_plan(ctx))
    monkeypatch.setattr(preflight.slurmjob, "allocation_nodes", lambda n: ["node1", "node2"])
    monkeypatch.setattr(preflight.slurmjob, "node_addrs",
                        lambda names: {"node2": "no-such-host.invalid"})
    with pytest.raises(PreflightError, match=r"^hosts: cannot resolve node node2 "
                                             r"\(NodeAddr no-such-host.invalid\)$"):
        node_hosts(ctx, [0, 1])
    with pytest.raises(PreflightError, match="places replicas on node 2, the allocation has 2"):
        node_hosts(ctx, [0, 2])
    monkeypatch.setattr(preflight.slurmjob, "allocation_nodes", lambda n: None)
    with pytest.raises(PreflightError, match="cannot list the nodes"):
        node_hosts(ctx, [0, 1])


def test_single_node_needs_no_scheduler_call(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight.slurmjob, "allocation_nodes",
                        lambda n: pytest.fail("asked scontrol"))
    assert node_hosts(make_ctx(tmp_path), [0]) == {0: ("node1", "127.0.0.1")}


def test_taken_port_on_another_node_is_found_by_connecting(tmp_path):
    ctx = make_ctx(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        sites = {"tiny": [Site(1, "127.0.0.1", port)]}
        with pytest.raises(PreflightError,
                           match=f"^ports: 127.0.0.1:{port} is already in use on node2$"):
            check_sites(ctx, sites, HOSTS)
    check_sites(ctx, sites, HOSTS)  # closed again: free


def placed(ctx: Context, *specs: ReplicaSpec) -> Context:
    dep = dataclasses.replace(ctx.plan.deployments[0], replicas=len(specs), placement=specs)
    return dataclasses.replace(ctx, plan=ctx.plan.replace(deployments=(dep,)))


def test_gpus_must_cover_the_highest_index_and_name_it(tmp_path):
    ctx = make_ctx(tmp_path, env={**SLURM_ENV, "SLURM_JOB_GPUS": "0,1"}, gpus=1)
    gap = placed(ctx, ReplicaSpec(index=0, node=0, gpus=(0,), port=20000),
                 ReplicaSpec(index=1, node=0, gpus=(3,), port=20001))
    with pytest.raises(PreflightError, match=r"^gpus: the plan needs 4 GPU\(s\), the allocation "
                                             r"has 2 \(0,1\); the plan gives node 0 GPU "
                                             r"indices 0,3$"):
        check_gpus(gap)
    check_gpus(dataclasses.replace(gap, env={**SLURM_ENV, "SLURM_JOB_GPUS": "4,5,6,7"}))


def test_a_placement_that_names_the_wrong_number_of_gpus_is_refused(tmp_path):
    ctx = make_ctx(tmp_path, env={**SLURM_ENV, "SLURM_JOB_GPUS": "0,1,2,3"}, gpus=2)
    short = placed(ctx, ReplicaSpec(index=0, node=0, gpus=(0, 1), port=20000),
                   ReplicaSpec(index=1, node=0, gpus=(2,), port=20001))
    with pytest.raises(PreflightError, match=r"^gpus: deployment tiny replica 1: the plan gives "
                                             r"it GPU indices 2, it needs 2$"):
        check_gpus(short)


def test_two_replicas_that_share_a_gpu_of_one_node_are_refused(tmp_path):
    ctx = make_ctx(tmp_path, env={**SLURM_ENV, "SLURM_JOB_GPUS": "0,1,2,3"}, gpus=2)
    overlap = placed(ctx, ReplicaSpec(index=0, node=0, gpus=(0, 1), port=20000),
                     ReplicaSpec(index=1, node=0, gpus=(1, 2), port=20001))
    with pytest.raises(PreflightError, match=r"^gpus: deployment tiny replica 1 and deployment "
                                             r"tiny replica 0 both have GPU 1 of node 0"):
        check_gpus(overlap)
    apart = placed(ctx, ReplicaSpec(index=0, node=0, gpus=(0, 1), port=20000),
                   ReplicaSpec(index=1, node=1, gpus=(0, 1), port=20001))
    check_gpus(apart)  # the same indices on two nodes are two different GPUs


def test_sites_carry_each_replicas_gpus(tmp_path):
    ctx = make_ctx(tmp_path, gpus=2)
    unplaced = dataclasses.replace(ctx.plan.deployments[0], replicas=2)
    other = dataclasses.replace(unplaced, alias="other", gpus_per_replica=1, replicas=1)
    plan = ctx.plan.replace(deployments=(unplaced, other))
    sites = plan_sites(plan, "36_0", {0: ("node1", "127.0.0.1")})
    # no placement: node 0, the next contiguous indices there, as the planner would
    assert [s.gpus for s in sites["tiny"]] == [(0, 1), (2, 3)]
    assert [s.gpus for s in sites["other"]] == [(4,)]
    placed_plan = two_node_plan(ctx)
    assert [s.gpus for s in plan_sites(placed_plan, "36_0", HOSTS)["tiny"]] == [(0, 1), (0, 1)]


def test_scontrol_parsers():
    assert parse_hostnames("node1\nnode2\n\n") == ["node1", "node2"]
    text = ("NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=node1\n"
            "NodeName=node2 Arch=x86_64 NodeAddr=gpu-b.cluster NodeHostName=node2\n")
    assert parse_node_addrs(text) == {"node1": "127.0.0.1", "node2": "gpu-b.cluster"}


def test_array_task_identity(tmp_path):
    env = {**SLURM_ENV, "SLURM_ARRAY_TASK_ID": "2"}
    record = AttemptRecord(run_id="r", shard=0, attempt=1, state="submitted", revision=2,
                           updated_at=0.0, job_id="36_2")
    ctx = dataclasses.replace(make_ctx(tmp_path, env=env, record=record), shard=7,
                              array_task=2)
    check_identity(ctx)
    with pytest.raises(PreflightError, match=r"array task 2 was asked to run shard 7 "
                                             r"\(array task 3\)"):
        check_identity(dataclasses.replace(ctx, array_task=3))


# ----------------------------------------------------------------------------- secrets


def with_secrets(ctx: Context, deployment: dict, client: dict = None) -> Context:
    dep = dataclasses.replace(ctx.plan.deployments[0], secret_env=deployment)
    plan = ctx.plan.replace(deployments=(dep,))
    if client is not None:
        plan = plan.replace(client=None, client_command=CommandClientSpec(
            argv=(sys.executable, "-c", "pass"), env={}, secret_env=client))
    return dataclasses.replace(ctx, plan=plan)


def test_secrets_present_pass_and_missing_fail_by_name(tmp_path):
    env = {**SLURM_ENV, "JOB_TOKEN": "s3cr3t-value", "EMPTY": ""}
    ctx = make_ctx(tmp_path, env=env)
    check_secrets(with_secrets(ctx, {"HF_TOKEN": "JOB_TOKEN"}))
    for dep, client, name in (({"HF_TOKEN": "NOPE"}, None, "NOPE"),
                              ({"HF_TOKEN": "EMPTY"}, None, "EMPTY"),
                              ({}, {"API_KEY": "CLIENT_NOPE"}, "CLIENT_NOPE")):
        with pytest.raises(PreflightError) as info:
            check_secrets(with_secrets(ctx, dep, client))
        message = str(info.value)
        assert message.startswith("secrets: ") and f"secret variable {name} " in message
        assert "\n" not in message and "s3cr3t" not in message


def test_missing_secret_fails_the_whole_preflight(tmp_path):
    ctx = with_secrets(make_ctx(tmp_path), {"HF_TOKEN": "SYNTHBATCH_TEST_NO_SUCH_VAR"})
    with pytest.raises(PreflightError, match="deployment tiny: secret variable "
                                             "SYNTHBATCH_TEST_NO_SUCH_VAR"):
        run_preflight(ctx)


# ----------------------------------------------------------------------------- images


def image(tmp_path: Path, runtime: str = "apptainer", content: bytes = b"image bytes",
          executable: str = "/bin/true", sha: str = None) -> ContainerSpec:
    path = tmp_path / "img.sif"
    path.write_bytes(content)
    digest = sha or hashlib.sha256(content).hexdigest()
    return ContainerSpec(runtime=runtime, image="vllm", path=str(path), sha256=digest,
                         mounts=(MountSpec(str(tmp_path), "/synthbatch/run", False),),
                         executable=executable)


def with_image(ctx: Context, box: ContainerSpec, client: bool = False) -> Context:
    dep = dataclasses.replace(ctx.plan.deployments[0], container=box)
    plan = ctx.plan.replace(deployments=(dep,))
    if client:
        plan = plan.replace(client=None, client_command=CommandClientSpec(
            argv=("/in/image/client",), env={}, container=box))
    return dataclasses.replace(ctx, plan=plan)


def test_image_that_matches_passes_and_is_hashed_once(tmp_path, monkeypatch):
    ctx = with_image(make_ctx(tmp_path), image(tmp_path), client=True)
    calls = []
    real = imagehash.image_digest
    monkeypatch.setattr(imagehash, "image_digest", lambda p: calls.append(p) or real(p))
    check_images(ctx)
    assert calls == [str(tmp_path / "img.sif")]  # deployment and client share one hash
    check_paths(ctx)  # commands inside an image are not looked for on the host


def test_later_array_tasks_reuse_the_runs_image_hash_until_the_file_changes(
        tmp_path, monkeypatch):
    box = image(tmp_path)
    ctx = dataclasses.replace(with_image(make_ctx(tmp_path), box),
                              hash_cache=tmp_path / "run" / "image-hashes")
    calls = []
    real = imagehash.image_digest
    monkeypatch.setattr(imagehash, "image_digest", lambda p: calls.append(p) or real(p))
    check_images(ctx)
    check_images(ctx)  # the next array task: no second hash
    assert len(calls) == 1
    records = list((tmp_path / "run" / "image-hashes").iterdir())
    assert len(records) == 1 and records[0].stat().st_mode & 0o777 == 0o600
    before = os.stat(box.path)
    Path(box.path).write_bytes(b"IMAGE BYTES")  # same size, rewritten in place ...
    os.utime(box.path, ns=(before.st_atime_ns, before.st_mtime_ns))  # ... old mtime back
    with pytest.raises(PreflightError, match="does not match the pinned"):
        check_images(ctx)  # ctime moved: hashed again, and the change is caught
    assert len(calls) == 2


def test_a_broken_or_foreign_hash_record_is_not_trusted(tmp_path, monkeypatch):
    box = image(tmp_path)
    cache = tmp_path / "image-hashes"
    ctx = dataclasses.replace(with_image(make_ctx(tmp_path), box), hash_cache=cache)
    check_images(ctx)
    record = next(cache.iterdir())
    record.write_text("{ not json")
    check_images(ctx)  # unreadable: hashed again and rewritten
    data = json.loads(record.read_text())
    assert data["sha256"] == box.sha256
    record.write_text(json.dumps({**data, "sha256": "0" * 64, "path": "/elsewhere.sif"}))
    check_images(ctx)  # names another file: not used


def test_image_failures(tmp_path):
    ctx = make_ctx(tmp_path)
    box = image(tmp_path, sha="0" * 64)
    with pytest.raises(PreflightError, match=r"^images: deployment tiny: image vllm \(.*img.sif\)"
                                             r": sha256 [0-9a-f]{64} does not match the "
                                             r"pinned 0{64}$"):
        check_images(with_image(ctx, box))
    Path(box.path).unlink()
    with pytest.raises(PreflightError, match="img.sif\\) is missing or not readable"):
        check_images(with_image(ctx, box))
    with pytest.raises(PreflightError, match="container runtime /no/apptainer is missing"):
        check_images(with_image(ctx, image(tmp_path, executable="/no/apptainer")))
    elsewhere = dataclasses.replace(image(tmp_path), mounts=(MountSpec("/srv", "/srv", True),))
    with pytest.raises(PreflightError, match="is not under any mount of image vllm"):
        check_images(with_image(ctx, elsewhere))


def image_tree(tmp_path: Path, executable: str = "/bin/true", name: str = "tree") -> ContainerSpec:
    """A charliecloud image directory with the mount points a step binds onto."""
    root = tmp_path / name
    for folder in ("etc", "synthbatch/run", "synthbatch/scratch"):
        (root / folder).mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    return ContainerSpec(runtime="charliecloud", image="py", path=str(root),
                         sha256=imagedigest.tree_digest(str(root))[0],
                         mounts=(MountSpec(str(tmp_path), "/synthbatch/run", False),),
                         executable=executable)


def test_an_image_directory_is_hashed_once_per_run_until_anything_below_changes(
        tmp_path, monkeypatch):
    box = image_tree(tmp_path)
    ctx = dataclasses.replace(with_image(make_ctx(tmp_path), box, client=True),
                              hash_cache=tmp_path / "image-hashes")
    ctx = dataclasses.replace(ctx, plan=ctx.plan.replace(
        client=dataclasses.replace(local_plan("python3", ["x"]).client, container=box),
        client_command=None))
    calls = []
    real = imagehash.image_digest
    monkeypatch.setattr(imagehash, "image_digest", lambda p: calls.append(p) or real(p))
    check_images(ctx)  # the deployment and the built-in client share the image
    check_images(ctx)  # the next array task
    assert calls == [box.path]
    (Path(box.path) / "etc" / "passwd").write_text("root:x:0:0::/:/bin/bash\n")
    with pytest.raises(PreflightError, match=r"image py \(.*tree\): sha256 .* does not match"):
        check_images(ctx)
    assert len(calls) == 2


def test_a_charliecloud_image_directory_needs_every_mount_point(tmp_path):
    box = image_tree(tmp_path)
    (Path(box.path) / "synthbatch" / "scratch").rmdir()
    box = dataclasses.replace(box, sha256=imagedigest.tree_digest(box.path)[0])
    with pytest.raises(PreflightError, match=r"tree\) has no directory /synthbatch/scratch to "
                                             r"mount onto \(ch-run binds only"):
        check_images(with_image(make_ctx(tmp_path), box))


def test_ch_run_must_have_extglob_and_user(tmp_path):
    fake = tmp_path / "ch-run"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --feature=extglob ] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    ctx = make_ctx(tmp_path, env={**SLURM_ENV, "USER": "u"})
    with pytest.raises(PreflightError, match="has no extglob support"):
        check_images(with_image(ctx, image_tree(tmp_path, executable=str(fake))))
    check_images(with_image(ctx, image_tree(tmp_path, name="ok")))  # /bin/true has it
    with pytest.raises(PreflightError, match=r"ch-run needs \$USER"):
        check_images(with_image(make_ctx(tmp_path, env={k: v for k, v in SLURM_ENV.items()
                                                         if k != "USER"}),
                                image_tree(tmp_path, name="again")))
    with pytest.raises(PreflightError, match="SHIV_ROOT .* is not an absolute path"):
        check_images(with_image(make_ctx(tmp_path, env={"USER": "u"}),
                                image_tree(tmp_path, name="more")))


def test_client_command_executable_is_checked_on_the_host(tmp_path):
    ctx = make_ctx(tmp_path)
    plan = ctx.plan.replace(client=None, client_command=CommandClientSpec(
        argv=("/no/such/client",), env={}))
    with pytest.raises(PreflightError, match="client command /no/such/client is missing"):
        check_paths(dataclasses.replace(ctx, plan=plan))


def test_gpus_are_counted_per_node_of_the_placement(tmp_path):
    ctx = make_ctx(tmp_path, env={**TWO_NODES, "SLURM_JOB_GPUS": "0"}, gpus=1)
    check_gpus(dataclasses.replace(ctx, plan=two_node_plan(ctx)))  # one GPU on each node
    dep = ctx.plan.deployments[0]
    both_on_0 = dataclasses.replace(dep, replicas=2, placement=(
        ReplicaSpec(index=0, node=0, gpus=(0,), port=20000),
        ReplicaSpec(index=1, node=0, gpus=(1,), port=20001)))
    with pytest.raises(PreflightError, match=r"needs 2 GPU\(s\), the allocation has 1"):
        check_gpus(dataclasses.replace(ctx, plan=ctx.plan.replace(deployments=(both_on_0,))))
    with pytest.raises(PreflightError, match=r"needs 1 GPU\(s\) per node, the allocation "
                                             r"shows none"):
        check_gpus(dataclasses.replace(ctx, plan=two_node_plan(ctx), env=TWO_NODES))


# ----------------------------------------------------------------------------- across nodes


def spanning_plan(ctx: Context, nodes: int = 3) -> Plan:
    """``tiny`` as one replica across nodes 1 and 2 (2 GPUs each), a judge on node 0."""
    base = ctx.plan.deployments[0]
    big = dataclasses.replace(
        base, gpus_per_replica=4, nodes_per_replica=2, follower_args=("--follow",),
        placement=(ReplicaSpec(index=0, node=1, gpus=(0, 1), port=20001, nodes=(1, 2),
                               dist_port=20002),))
    judge = dataclasses.replace(base, alias="judge", gpus_per_replica=1,
                                placement=(ReplicaSpec(index=0, node=0, gpus=(0,),
                                                       port=20000),))
    resources = dataclasses.replace(ctx.plan.resources, nodes=nodes, gpus=2)
    runtime = dataclasses.replace(ctx.plan.runtime, launcher="srun")
    return ctx.plan.replace(deployments=(judge, big), resources=resources, runtime=runtime)


THREE = {0: ("node1", "127.0.0.1"), 1: ("node2", "10.1.2.3"), 2: ("node3", "10.1.2.4")}


def test_a_replica_across_nodes_uses_its_gpus_on_every_node_it_spans(tmp_path):
    ctx = make_ctx(tmp_path)
    plan = spanning_plan(ctx)
    assert preflight.gpu_indices(plan) == {0: [0], 1: [0, 1], 2: [0, 1]}
    short = plan.replace(deployments=(plan.deployments[0], dataclasses.replace(
        plan.deployments[1], placement=(dataclasses.replace(plan.deployments[1].placement[0],
                                                            nodes=()),))))
    with pytest.raises(PreflightError, match=r"^gpus: deployment tiny replica 0: the plan "
                                             r"places it on nodes 1, it spans 2$"):
        preflight.gpu_indices(short)


def test_sites_of_a_replica_across_nodes_name_every_rank_and_the_leader(tmp_path):
    plan = spanning_plan(make_ctx(tmp_path))
    block = preflight.port_block(plan, "37")
    assert block == assign_ports(20000, "37", 2 + 8)[0]  # the rank ports are in the block
    sites = plan_sites(plan, "37", THREE, {1: "10.1.2.3"})
    assert sites["tiny"] == [Site(node=1, host="10.1.2.3", port=block + 1, gpus=(0, 1),
                                  span=(1, 2), hosts=("10.1.2.3", "10.1.2.4"),
                                  leader="10.1.2.3", dist_port=block + 2)]
    assert sites["judge"] == [Site(node=0, host="127.0.0.1", port=block, gpus=(0,))]


def test_a_leader_on_the_agent_s_node_is_reached_at_its_node_address(tmp_path, monkeypatch):
    ctx = make_ctx(tmp_path)
    ctx = dataclasses.replace(ctx, plan=spanning_plan(ctx))
    asked = []
    monkeypatch.setattr(preflight.slurmjob, "node_addrs",
                        lambda names: asked.append(names) or {"node1": "127.0.9.1"})
    assert preflight.leader_addrs(ctx, THREE, [0, 1]) == {0: "127.0.9.1", 1: "10.1.2.3"}
    assert asked == [["node1"]]
    monkeypatch.setattr(preflight.slurmjob, "node_addrs",
                        lambda names: {"node1": "no-such-host.invalid"})
    with pytest.raises(PreflightError, match="cannot resolve node node1 .NodeAddr no-such"):
        preflight.leader_addrs(ctx, {0: ("node1", "127.0.0.1")}, [0])


def test_ports_of_a_replica_across_nodes_are_checked_on_every_node_it_spans(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx = dataclasses.replace(ctx, plan=spanning_plan(ctx))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        follower = Site(node=1, host="127.0.0.2", port=port, gpus=(0, 1), span=(1, 2),
                        hosts=("127.0.0.2", "127.0.0.1"), leader="127.0.0.2",
                        dist_port=port + 100)
        with pytest.raises(PreflightError, match=rf"^ports: 127.0.0.1:{port} is already in "
                                                 r"use on node3$"):
            check_sites(ctx, {"tiny": [follower]}, {**THREE, 1: ("node2", "127.0.0.2"),
                                                    2: ("node3", "127.0.0.1")})
        rank_port = Site(node=1, host="127.0.0.2", port=port + 100, gpus=(0, 1), span=(1, 2),
                         hosts=("127.0.0.2", "127.0.0.3"), leader="127.0.0.1",
                         dist_port=port - 3)
        with pytest.raises(PreflightError, match=rf"^ports: 127.0.0.1:{port} is already in "
                                                 r"use on node2$"):
            check_sites(ctx, {"tiny": [rank_port]}, {**THREE, 1: ("node2", "127.0.0.2"),
                                                     2: ("node3", "127.0.0.3")})
def dd_ctx(tmp_path: Path, problems: Any, code: int = 0) -> Context:
    """A local plan with a Data Designer client whose 'python' is a stand-in that prints
    ``problems`` as ``dd --validate`` would (None: prints nothing)."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    verdict = "" if problems is None else json.dumps({"problems": problems, "notes": []})
    (tmp_path / "verdict").write_text(verdict)
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/argv"\n'
                      f'echo "log"\ncat "{tmp_path}/verdict"\necho "oops" >&2\nexit {code}\n')
    python.chmod(0o755)
    (tmp_path / "dd.yaml").write_text("columns: []\n")
    ctx = make_ctx(tmp_path)
    spec = DataDesignerSpec(config=str(tmp_path / "dd.yaml"), python=str(python))
    return dataclasses.replace(ctx, plan=ctx.plan.replace(client=None,
                                                          client_data_designer=spec))


def test_a_data_designer_config_is_checked_before_any_server(tmp_path):
    ctx = dd_ctx(tmp_path, ["alias 'x' is served by no deployment", "column 'y': bad"], 1)
    with pytest.raises(PreflightError, match="^data designer: alias 'x' is served by no "
                                             "deployment; column 'y': bad$"):
        run_preflight(ctx)
    assert (tmp_path / "argv").read_text().split() == [
        "-I", str(tmp_path / "agent.pyz"), "dd", "--plan", str(tmp_path / "plan.json"),
        "--validate"]


def test_a_clean_data_designer_check_passes(tmp_path):
    assert "tiny" in run_preflight(dd_ctx(tmp_path, []))


def test_a_data_designer_check_without_verdict_names_its_last_words(tmp_path):
    with pytest.raises(PreflightError, match=r"printed no verdict \(exit status 1: oops\)"):
        run_preflight(dd_ctx(tmp_path, None, 1))


def test_the_data_designer_python_and_config_must_be_there(tmp_path):
    ctx = dd_ctx(tmp_path, [])
    spec = ctx.plan.client_data_designer
    gone = dataclasses.replace(spec, python="/nowhere/python")
    with pytest.raises(PreflightError, match="client python /nowhere/python is missing"):
        check_paths(dataclasses.replace(ctx, plan=ctx.plan.replace(client_data_designer=gone)))
    gone = dataclasses.replace(spec, config="/nowhere/build.py:make")
    with pytest.raises(PreflightError, match="Data Designer config /nowhere/build.py is "
                                             "missing"):
        check_paths(dataclasses.replace(ctx, plan=ctx.plan.replace(client_data_designer=gone)))
