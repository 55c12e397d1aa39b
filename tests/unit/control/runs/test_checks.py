"""Login-node checks: paths the plan names, serving environments, images, secrets, and
whether the request fits the partition (with a fake Slurm; the real one is in
tests/integration/test_first_hour_slurm.py)."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pytest

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.runs import checks
from synthbatch.control.runs.checks import ERROR, NODE, OK, WARNING, Finding, Sight
from synthbatch.control.runs.fit import Origins, check_fit
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import FakeSlurm, invoke, partition, plan_json

FAKE_RUN = REPO / "examples" / "fake-server.toml"


def cluster(partitions: str, nodes: str = "node1|8|4096|gpu:4|idle\n"
                                          "node2|8|4096|gpu:4|idle\n") -> Scheduler:
    fake = FakeSlurm()
    fake.on("scontrol", stdout=partitions)
    fake.on("sinfo", stdout=nodes)
    return Scheduler(runner=fake)


def request(**changes: object) -> ResourceSpec:
    base = ResourceSpec(partition="debug", account=None, qos=None, time_limit="01:00:00",
                        nodes=1, gpus=2, gpu_request="gres", cpus=4, mem_mb=2048)
    return replace(base, **changes)


def levels(found: List[Finding]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for item in found:
        out.setdefault(item.level, []).append(item.line())
    return out


# ----------------------------------------------------------------------------- fit


def test_a_request_that_fits_is_ok() -> None:
    found = check_fit(request(), cluster(partition()))
    assert levels(found) == {OK: ["profile: partition: 2 of 2 node(s) of partition debug fit "
                                  "4 CPUs, 2048 MB, 2 GPUs"]}


def test_the_multigpu_example_names_each_field_and_the_biggest_node() -> None:
    found = check_fit(request(cpus=16, mem_mb=131072),
                      cluster(partition()), Origins(cpus="run.toml: resources.cpus",
                                                    mem_mb="run.toml: resources.mem_mb"))
    assert levels(found) == {ERROR: [
        "run.toml: resources.cpus: 16 CPUs per node, but the biggest node of partition debug "
        "has 8 (node1: 8 CPUs, 4096 MB, 4 GPUs); Slurm would keep the job pending "
        "(BadConstraints)",
        "run.toml: resources.mem_mb: 131072 MB per node, but the biggest node of partition "
        "debug has 4096 (node1: 8 CPUs, 4096 MB, 4 GPUs); Slurm would keep the job pending "
        "(BadConstraints)"]}


def test_too_many_gpus_names_the_profiles_claim() -> None:
    found = check_fit(request(gpus=8), cluster(partition()),
                      Origins(gpus="run.toml: deployments (GPUs per node; the profile's "
                                   "gpus_per_node is 8)"))
    (error,) = levels(found)[ERROR]
    assert error.startswith("run.toml: deployments (GPUs per node; the profile's "
                            "gpus_per_node is 8): 8 GPUs per node, but the biggest node")


def test_no_single_node_has_everything_at_once() -> None:
    nodes = "cpu1|64|8192|(null)|idle\ngpu1|8|8192|gpu:4|idle\n"
    found = check_fit(request(cpus=32, gpus=2, mem_mb=1024), cluster(partition(), nodes))
    (error,) = levels(found)[ERROR]
    assert "no 1 node(s) of partition debug have 32 CPUs, 1024 MB and 2 GPUs at once" in error


def test_the_biggest_node_is_named_per_dimension() -> None:
    nodes = "small|4|1024|gpu:1|idle\nwide|64|2048|gpu:1|idle\nfat|8|65536|gpu:1|idle\n"
    found = check_fit(request(cpus=128, mem_mb=100000, gpus=1), cluster(partition(), nodes))
    cpus, mem = levels(found)[ERROR]
    assert "has 64 (wide: 64 CPUs" in cpus and "has 65536 (fat: 8 CPUs, 65536 MB" in mem


@pytest.mark.parametrize("changes, fragment", [
    ({"nodes": 3}, "3 nodes per shard, but partition debug has 2 at most"),
    ({"time_limit": "3-00:00:00"}, "time limit 3-00:00:00 is above partition debug's "
                                   "MaxTime (2880 min)"),
    ({"mem_mb": 3000}, "3000 MB per node, above partition debug's MaxMemPerNode 2048 MB"),
    ({"account": "other"}, "other is not in partition debug's AllowAccounts (proj)"),
])
def test_partition_limits(changes: Dict[str, object], fragment: str) -> None:
    limits = partition(max_time="2-00:00:00", max_mem="2048", accounts="proj")
    found = check_fit(request(**changes), cluster(limits))
    assert any(fragment in line for line in levels(found).get(ERROR, [])), found


def test_max_nodes_limits_like_total_nodes() -> None:
    found = check_fit(request(nodes=2), cluster(partition(max_nodes="1")))
    assert "2 nodes per shard, but partition debug has 1 at most" in levels(found)[ERROR][0]


def test_a_partition_that_is_down_or_nodes_drained_is_a_warning() -> None:
    found = check_fit(request(), cluster(partition(state="DOWN")))
    assert levels(found)[WARNING] == ["profile: partition: partition debug is DOWN: jobs "
                                      "wait until it is UP"]
    drained = "node1|8|4096|gpu:4|drained\nnode2|8|4096|gpu:4|down*\n"
    found = check_fit(request(), cluster(partition(), drained))
    assert levels(found) == {WARNING: ["profile: partition: the nodes that fit are not taking "
                                       "jobs now (node1 drained, node2 down*): the run waits"]}


def test_a_partition_that_does_not_exist() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", code=1, stderr="Partition gpu not found\n")
    fake.on("sinfo", stdout="debug*|up|2|idle\nbatch|up|1|mix\n")
    found = check_fit(request(partition="gpu"), Scheduler(runner=fake))
    assert levels(found) == {ERROR: ["profile: partition: partition gpu does not exist on "
                                     "this cluster (have: batch, debug)"]}


def test_no_partition_and_no_default() -> None:
    found = check_fit(request(partition=None), cluster(partition(default="NO")))
    assert levels(found)[ERROR] == ["profile: partition: no partition is set and the cluster "
                                    "has no default one"]


def test_slurm_unreachable_is_said_and_planning_goes_on() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", code=1, stderr="scontrol: error: Unable to contact slurm controller "
                                        "(connect failure)\n")
    (note,) = check_fit(request(), Scheduler(runner=fake))
    assert note.level == NODE
    assert note.message.startswith("resources not checked against the partition: scontrol "
                                   "failed: ")


# ----------------------------------------------------------------------------- paths


@pytest.fixture
def sight(tmp_path: Path) -> Sight:
    return Sight(tmp_path / "ws")  # tmp_path's filesystem plays the shared one


def test_a_path_that_exists(tmp_path: Path, sight: Sight) -> None:
    model = tmp_path / "model"
    model.mkdir()
    assert checks.check_path("f", str(model), "model", sight).level == OK


def test_a_missing_path_on_the_shared_filesystem_is_an_error(tmp_path: Path,
                                                             sight: Sight) -> None:
    found = checks.check_path("run.toml: deployments[0].model", str(tmp_path / "typo"),
                              "model", sight)
    assert found.level == ERROR
    assert found.line() == (f"run.toml: deployments[0].model: model {tmp_path / 'typo'} does "
                            f"not exist (its parent {tmp_path} is on the shared filesystem: "
                            f"the compute nodes will not find it either)")


def test_a_missing_path_on_a_node_only_filesystem_is_left_to_the_node(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"tmpfs {tmp_path} tmpfs rw 0 0\n")
    sight = Sight(Path("/proc/self"), mounts_file=mounts)  # a workspace on another device
    found = checks.check_path("f", str(tmp_path / "scratch" / "m"), "model", sight)
    assert found.level == NODE and "checked on the compute node" in found.message


def test_a_network_filesystem_counts_as_shared(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/export {tmp_path} nfs4 rw 0 0\n")
    sight = Sight(Path("/proc/self"), mounts_file=mounts)
    assert checks.check_path("f", str(tmp_path / "m"), "model", sight).level == ERROR


def test_programs_must_run_and_files_be_files(tmp_path: Path, sight: Sight) -> None:
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/sh\n")
    assert checks.check_path("f", str(script), "p", sight, executable=True).level == ERROR
    script.chmod(0o755)
    assert checks.check_path("f", str(script), "p", sight, executable=True).level == OK
    assert checks.check_path("f", str(tmp_path), "image", sight, directory=False).message \
        .endswith("is a directory, not a file")


def test_a_bare_program_name_is_looked_up_on_the_jobs_path(tmp_path: Path) -> None:
    assert checks.check_on_path("f", "sh", "program", ["/bin", "/usr/bin"]).level == OK
    missing = checks.check_on_path("f", "vllm", "program", [str(tmp_path)])
    assert missing.level == NODE and "it must be on the compute node's" in missing.message


def test_a_serving_environment_needs_the_engines_module(tmp_path: Path) -> None:
    from synthbatch.control.slurm.runner import run_command

    ok = checks.check_module("f", sys.executable, "json", run_command)
    bad = checks.check_module("f", sys.executable, "vllm_not_installed_here", run_command)
    assert ok.level == OK and bad.level == ERROR
    assert bad.message == f"{sys.executable} has no vllm_not_installed_here module: not a " \
                          f"serving environment for this engine"
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'cannot execute binary file' >&2\nexit 126\n")
    broken.chmod(0o755)
    assert checks.check_module("f", str(broken), "vllm", run_command).level == NODE


def hub(tmp_path: Path, model: str) -> Path:
    folder = tmp_path / "hf" / "hub" / ("models--" + model.replace("/", "--")) / "snapshots"
    folder.mkdir(parents=True)
    return tmp_path / "hf"


def test_hub_model_in_the_cache(tmp_path: Path, sight: Sight) -> None:
    home = hub(tmp_path, "org/model")
    found = checks.check_hub_model("f", "org/model", {"HF_HOME": str(home)}, sight)
    assert found.level == OK and str(home / "hub") in found.message


def test_hub_model_offline_and_not_cached_is_an_error(tmp_path: Path, sight: Sight) -> None:
    home = hub(tmp_path, "org/other")
    found = checks.check_hub_model("f", "org/model", {"HF_HOME": str(home),
                                                      "HF_HUB_OFFLINE": "1"}, sight)
    assert found.level == ERROR and "HF_HUB_OFFLINE is set" in found.message


def test_hub_model_online_is_downloaded_on_the_node(tmp_path: Path, sight: Sight) -> None:
    found = checks.check_hub_model("f", "org/model", {"HF_HOME": str(tmp_path / "hf")}, sight)
    assert found.level == NODE and "downloads it on the compute node" in found.message


def test_hub_cache_follows_hf_hub_cache_then_hf_home() -> None:
    assert checks.hub_cache({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert checks.hub_cache({"HF_HOME": "/h"}) == Path("/h/hub")


# ----------------------------------------------------------------------------- plan and submit


def run_file(tmp_path: Path, old: str, new: str) -> Path:
    path = tmp_path / "run.toml"
    text = FAKE_RUN.read_text().replace("{config_dir}/..", str(REPO))
    assert old in text
    path.write_text(text.replace(old, new))
    return path


def test_plan_flags_a_missing_script_and_exits_2(tmp_path: Path, profile_file: Path) -> None:
    path = run_file(tmp_path, "fixtures/fake_openai_server.py", "fixtures/typo.py")
    data = plan_json(path, profile_file)
    assert data["code"] == 2
    bad = [c for c in data["checks"] if c["level"] == "error"]
    assert bad == [{"level": "error", "field": f"{path}: deployments[0].command[1]",
                    "message": f"script {REPO / 'fixtures' / 'typo.py'} does not exist (its "
                               f"parent {REPO / 'fixtures'} is on the shared filesystem: the "
                               f"compute nodes will not find it either)"}]
    assert "check failed" in data["stderr"]


QA_FAKE = REPO / "examples" / "qa-fake.toml"


@pytest.mark.parametrize("base,offsets,exclusive,level", [
    (20000, 1, False, OK),  # the default: 20000-28176, below 32768
    (24592, 1, False, WARNING),  # 24592-32768: the last block's port is ephemeral
    (24591, 1, False, OK),
    (40000, 1, True, WARNING),
    (61000, 4, True, OK),  # above 60999
    (20000, 20, True, OK),
])
def test_ports_and_the_ephemeral_range(tmp_path: Path, base: int, offsets: int,
                                       exclusive: bool, level: str) -> None:
    """Issue 28.9: port_base up to 65000 was accepted; ports in the kernel's ephemeral range
    can be taken by an outgoing connection after preflight found them free."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    found = checks.check_ports("profile: port_base", base, offsets, exclusive, ranges)
    assert found.level == level, found
    if found.level == WARNING:
        assert f"inside the kernel's ephemeral port range 32768-60999 ({ranges})" in \
            found.message


def test_the_ephemeral_range_is_read_or_linux_s_default(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("50000 51000\n")
    assert checks.ephemeral_range(ranges) == ((50000, 51000), str(ranges))
    assert checks.ephemeral_range(tmp_path / "none") == ((32768, 60999), "the Linux default")
    assert checks.check_ports("p", 40000, 1, True, ranges).level == OK
    found = checks.check_ports("p", 30000, 1, False, tmp_path / "none")
    assert found.level == WARNING and "port_base 24591 or lower" in found.message


def test_plan_warns_of_a_port_base_in_the_ephemeral_range(tmp_path: Path,
                                                           profile_file: Path) -> None:
    profile_file.write_text(profile_file.read_text() + "port_base = 40000\n")
    data = plan_json(FAKE_RUN, profile_file)
    (port,) = [c for c in data["checks"] if c["field"] == f"{profile_file}: port_base"]
    assert port["level"] == "warning" and port["message"].startswith(
        "40000: servers may listen on ports 40000-48176, inside the kernel's ephemeral port "
        "range"), port


@pytest.mark.parametrize("kind", ["seed", "script"])
def test_a_missing_seed_file_follows_the_path_rule_of_a_script(tmp_path: Path,
                                                               profile_file: Path,
                                                               kind: str) -> None:
    """Issue 28.7: a seed file missing from a folder on the shared filesystem passed plan
    ("not visible here") while a script in the same folder failed it: one rule for both."""
    folder = tmp_path / "data"  # on the workspace's filesystem
    folder.mkdir()
    text = QA_FAKE.read_text().replace("{config_dir}/..", str(REPO))
    text = text.replace("{config_dir}/data/topics.jsonl", str(
        folder / "nosuch.jsonl" if kind == "seed" else REPO / "examples/data/topics.jsonl"))
    if kind == "script":
        text = text.replace(f"{REPO}/fixtures/fake_openai_server.py", str(folder / "x.py"))
    path = tmp_path / "run.toml"
    path.write_text(text)
    data = plan_json(path, profile_file)
    bad = [c for c in data["checks"] if c["level"] == "error"]
    field = "client.seed_data.path" if kind == "seed" else "deployments[0].command[1]"
    assert data["code"] == 2 and bad[0]["field"] == f"{path}: {field}", data
    assert bad[0]["message"].endswith(f"does not exist (its parent {folder} is on the shared "
                                      f"filesystem: the compute nodes will not find it either)")


def fake_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                 nodes: str = "node1|8|4096|gpu:4|idle\n") -> FakeSlurm:
    """The testbed's answers to submit's queries (sbatch answers job 901)."""
    from synthbatch.control import api, bundle

    fake = FakeSlurm()
    fake.replies["scontrol"] = lambda args: (0, "MaxArraySize = 1001\n", "") \
        if args[:2] == ["show", "config"] else (0, "", "") if args[0] == "release" \
        else (0, partition(), "")
    fake.on("sinfo", stdout=nodes)
    fake.on("sbatch", stdout="901\n")
    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=fake))
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(b"not run")
    monkeypatch.setattr(bundle, "locate_agent_bundle", lambda cache: agent)
    return fake


def test_submit_refuses_what_plan_flags(tmp_path: Path, profile_file: Path,
                                        workspace: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_cluster(monkeypatch, tmp_path)
    path = run_file(tmp_path, "fixtures/fake_openai_server.py", "fixtures/typo.py")
    result = invoke("submit", str(path), "--profile", str(profile_file))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"synthbatch: error: submit refused: {path}: "
                                    f"deployments[0].command[1]: script ")
    assert not (workspace / "runs").exists()  # nothing staged, nothing queued
    assert "sbatch" not in [call[0] for call in fake.calls]


def test_submit_keeps_the_warnings_in_the_run(tmp_path: Path, profile_file: Path,
                                              workspace: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from synthbatch.agent_stdlib.contracts import RunRecord

    fake_cluster(monkeypatch, tmp_path, nodes="node1|8|4096|gpu:4|drained\n")
    path = run_file(tmp_path, "count = 3", "count = 3")
    result = invoke("submit", str(path), "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    expected = (f"{profile_file}: partition: the nodes that fit are not taking jobs now "
                f"(node1 drained): the run waits")
    assert data["warnings"] == [expected]
    assert f"synthbatch: warning: {expected}" in result.stderr
    record = RunRecord.from_dict(json.loads((workspace / "runs" / data["run_id"] /
                                             "run.json").read_text()))
    assert record.warnings == (expected,) and record.overrides == {}


def test_an_old_run_json_without_warnings_still_reads() -> None:
    from synthbatch.agent_stdlib.contracts import RunRecord

    old = {"schema_version": 1, "run_id": "r-1", "name": "r", "created_at": 1.0,
           "plan_sha256": "a" * 64, "agent_pyz": "agent-x.pyz", "agent_sha256": "b" * 64,
           "backend": "slurm", "job_name": "synthbatch-r-1", "shard_count": 2}
    record = RunRecord.from_dict(old)
    assert record.warnings == () and record.overrides == {}


def test_plan_text_separates_what_only_the_node_can_check(profile_file: Path) -> None:
    result = invoke("plan", str(FAKE_RUN), "--profile", str(profile_file))
    assert result.exit_code == 0, result.output
    text = result.stdout
    here = text.index("checks on this login node:")
    there = text.index("checked on the compute node (preflight, before any server starts):")
    assert here < there < text.index("--- batch script ---")
    assert f"  always: {checks.NODE_ONLY}" in text


def test_a_secret_the_run_needs_must_be_set_here(tmp_path: Path, profile_file: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    profile_file.write_text(profile_file.read_text() + 'secrets = ["SB_TEST_TOKEN"]\n')
    path = run_file(tmp_path, "gpus = 1", 'gpus = 1\nenv = { API_TOKEN = { secret = '
                                          '"SB_TEST_TOKEN" } }')
    monkeypatch.delenv("SB_TEST_TOKEN", raising=False)
    data = plan_json(path, profile_file)
    assert data["code"] == 2
    assert {"level": "error", "field": f"{path}: deployments[0].env.API_TOKEN",
            "message": "secret SB_TEST_TOKEN is not set in this shell (the job inherits the "
                       "environment of submit)"} in data["checks"]
    monkeypatch.setenv("SB_TEST_TOKEN", "value-never-shown")
    data = plan_json(path, profile_file)
    assert data["code"] == 0 and "value-never-shown" not in json.dumps(data)


def test_a_serving_python_without_the_engine(tmp_path: Path, profile_file: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    path = tmp_path / "run.toml"
    path.write_text(f"""schema_version = 1
name = "llama"
records = 4
[shards]
count = 1
[client]
model = "m"
prompt_template = "{{index}}"
[[deployments]]
alias = "m"
engine = "llamacpp"
model = "{model}"
python = "{sys.executable}"
""")
    data = plan_json(path, profile_file)
    assert data["code"] == 2
    assert {"level": "error", "field": f"{path}: deployments[0].python",
            "message": f"{sys.executable} has no xllamacpp module: not a serving environment "
                       f"for this engine"} in data["checks"]


def test_an_image_file_that_moved(tmp_path: Path, workspace: Path) -> None:
    from synthbatch.agent_stdlib.contracts import ContainerSpec

    container = ContainerSpec(runtime="apptainer", image="vllm", path=str(tmp_path / "v.sif"),
                              sha256="0" * 64, mounts=())
    (found,) = checks._image("run.toml: deployments[0].image", container, Sight(workspace))
    assert found.level == ERROR and "image 'vllm'" in found.message


def test_unreadable_model_is_an_error(tmp_path: Path, sight: Sight) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    model = tmp_path / "model"
    model.write_text("x")
    model.chmod(stat.S_IWUSR)
    assert checks.check_path("f", str(model), "model", sight).level == ERROR
