"""The planner: record splitting, command resolution, resources and the Plan contract."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.contracts import ArraySpec, Plan, ResourceSpec, ShardSpec
from synthbatch.control.config.deployment import Deployment
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput
from synthbatch.control.images import registry
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.planning.placement import PlacementError, Shape, place, spread
from synthbatch.control.planning.planner import make_plan, resolve_command, split_records
from synthbatch.control.planning.summary import plan_summary
from synthbatch.control.runs.plan import dry_run
from synthbatch.control.slurm.directives import apply_directives
from synthbatch.control.slurm.parsers import parse_max_array_size
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

QUICKSTART = REPO / "examples" / "fake-server.toml"
TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
RUN_ID = "quickstart-20240101-000000-abcdef"


def run_data() -> Dict[str, Any]:
    return copy.deepcopy(tomllib.loads(QUICKSTART.read_text(encoding="utf-8")))


def profile(**changes: Any) -> Profile:
    data = tomllib.loads(TESTBED.read_text(encoding="utf-8"))
    data.update(changes)
    return Profile.model_validate(data)


def run_config(data: Optional[Dict[str, Any]] = None) -> RunConfig:
    return RunConfig.model_validate(data if data is not None else run_data())


def deployment(command: List[str], **changes: Any) -> Deployment:
    data = {"alias": "m", "model": "org/model", "command": command}
    data.update(changes)
    return Deployment.model_validate(data)


# ----------------------------------------------------------------------------- split_records


def check_shards(shards: List[ShardSpec], records: int) -> None:
    assert [s.index for s in shards] == list(range(len(shards)))
    offset = 0
    for shard in shards:
        assert shard.record_offset == offset
        assert shard.num_records >= 1
        offset += shard.num_records
    assert offset == records
    sizes = [s.num_records for s in shards]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the remainder goes to earlier shards


def test_even_split() -> None:
    shards = split_records(30, 3, None)
    assert shards == [ShardSpec(0, 0, 10), ShardSpec(1, 10, 10), ShardSpec(2, 20, 10)]


def test_remainder_goes_to_earlier_shards() -> None:
    shards = split_records(11, 4, None)
    assert [(s.record_offset, s.num_records) for s in shards] == [(0, 3), (3, 3), (6, 3),
                                                                   (9, 2)]


def test_one_shard() -> None:
    assert split_records(7, 1, None) == [ShardSpec(0, 0, 7)]


def test_one_record_per_shard() -> None:
    shards = split_records(5, 5, None)
    assert [s.num_records for s in shards] == [1] * 5
    assert [s.record_offset for s in shards] == list(range(5))


@pytest.mark.parametrize("records,per_shard,count", [(30, 10, 3), (31, 10, 4), (29, 10, 3),
                                                     (1, 10, 1), (10, 1, 10), (100, 33, 4)])
def test_records_per_shard_uses_ceil(records: int, per_shard: int, count: int) -> None:
    shards = split_records(records, None, per_shard)
    assert len(shards) == count
    assert all(s.num_records <= per_shard for s in shards)
    check_shards(shards, records)


def test_split_property_over_many_pairs() -> None:
    for records in list(range(1, 80)) + [997, 1000, 4099]:
        for count in sorted({1, 2, 3, 7, 16, records // 2 or 1, records - 1 or 1, records}):
            if count > records:
                continue
            shards = split_records(records, count, None)
            assert len(shards) == count
            check_shards(shards, records)
        for per_shard in (1, 2, 5, 64, records):
            shards = split_records(records, None, per_shard)
            assert len(shards) == -(-records // per_shard)
            assert all(s.num_records <= per_shard for s in shards)
            check_shards(shards, records)


def test_split_large_record_count() -> None:
    shards = split_records(10**10, 7, None)
    check_shards(shards, 10**10)
    assert shards[-1].record_offset + shards[-1].num_records == 10**10


# ----------------------------------------------------------------------------- resolve_command


def test_resolve_python_and_config_dir(tmp_path: Path) -> None:
    dep = deployment(["{python}", "{config_dir}/serve.py", "--port", "{port}"])
    argv = resolve_command(dep, "/opt/py/bin/python3", tmp_path)
    assert argv == ("/opt/py/bin/python3", f"{tmp_path}/serve.py", "--port", "{port}")
    assert isinstance(argv, tuple)


def test_config_dir_is_normalised() -> None:
    dep = deployment(["{python}", "{config_dir}/../fixtures/./server.py", "--port", "{port}"])
    argv = resolve_command(dep, "/usr/bin/python3", Path("/work/main/examples"))
    assert argv[1] == "/work/main/fixtures/server.py"
    assert ".." not in argv[1]


def test_model_and_served_name() -> None:
    dep = deployment(["serve", "{model}", "--name", "{served_name}", "--port", "{port}"],
                     served_name="short")
    assert resolve_command(dep, "/p", Path("/c")) == ("serve", "org/model", "--name", "short",
                                                       "--port", "{port}")


def test_served_name_defaults_to_model() -> None:
    dep = deployment(["serve", "--name", "{served_name}", "--port", "{port}"])
    assert resolve_command(dep, "/p", Path("/c"))[2] == "org/model"


def test_host_and_port_left_for_the_agent() -> None:
    dep = deployment(["serve", "--bind={host}:{port}", "--host", "{host}", "--port", "{port}"])
    argv = resolve_command(dep, "/p", Path("/c"))
    assert argv == ("serve", "--bind={host}:{port}", "--host", "{host}", "--port", "{port}")
    # the agent can still fill them in with the same mechanism
    assert argv[1].format(host="127.0.0.1", port=20001) == "--bind=127.0.0.1:20001"


def test_escaped_braces_survive_once() -> None:
    dep = deployment(["serve", '--json={{"a": 1}}', "--port", "{port}"])
    assert resolve_command(dep, "/p", Path("/c"))[1] == '--json={"a": 1}'


def test_values_are_not_formatted_again() -> None:
    dep = deployment(["serve", "{config_dir}/s.py", "--port", "{port}"])
    assert resolve_command(dep, "/p", Path("/c/{python}"))[1] == "/c/{python}/s.py"


# ----------------------------------------------------------------------------- make_plan


def test_make_plan_quickstart() -> None:
    plan = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.run_id == RUN_ID and plan.name == "fake-server"
    assert plan.total_records == 30
    assert [s.num_records for s in plan.shards] == [10, 10, 10]
    dep = plan.deployment("tiny")
    assert dep.command == ("/usr/bin/python3", str(REPO / "fixtures" / "fake_openai_server.py"),
                           "--host", "{host}", "--port", "{port}", "--model", "fake-model")
    assert dep.served_name == "fake-model"
    assert dep.gpus_per_replica == 1 and dep.replicas == 1
    res = plan.resources
    assert (res.partition, res.account, res.qos) == ("debug", None, None)
    assert res.time_limit == "00:10:00"  # run override beats the profile default
    assert (res.nodes, res.gpus, res.gpu_request, res.cpus, res.mem_mb) == (1, 1, "gres", 2,
                                                                            1024)
    assert plan.runtime.python == "/usr/bin/python3"
    assert plan.runtime.launcher == "srun"
    assert plan.client.model == "tiny"
    assert plan.max_attempts == 3


def test_a_local_profile_plans_the_local_launcher_on_one_machine() -> None:
    local = profile(backend="local")
    plan = make_plan(run_config(), local, RUN_ID, QUICKSTART.parent)
    assert plan.runtime.launcher == "local" and plan.resources.nodes == 1
    assert "backend local: no Slurm" in plan_summary(plan, "0" * 64)
    assert "backend local" not in plan_summary(
        make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent), "0" * 64)
    data = run_data()
    data["deployments"][0].update(nodes=2, replicas=2)
    assert make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent).resources.nodes == 2
    with pytest.raises(InvalidInput, match=r"deployments\[0\]\.nodes: 2 nodes: the local "
                                           r"backend runs on one machine"):
        make_plan(run_config(data), local, RUN_ID, QUICKSTART.parent)


def test_a_local_plan_fits_one_machine() -> None:
    local = profile(backend="local")  # 4 GPUs per node
    data = run_data()
    data["deployments"][0].update(engine="vllm", model="/models/x", tensor_parallel=8)
    for field in ("command", "gpus"):
        data["deployments"][0].pop(field, None)
    assert make_plan(run_config(data), profile(), RUN_ID,
                     QUICKSTART.parent).deployments[0].nodes_per_replica == 2
    with pytest.raises(InvalidInput, match=r"deployments\[0\]\.tensor_parallel: 8 GPU\(s\) "
                                           r"per replica span 2 nodes of 4 GPUs "
                                           r"\(gpus_per_node\): the local backend runs on one "
                                           r"machine"):
        make_plan(run_config(data), local, RUN_ID, QUICKSTART.parent)
    data = run_data()
    data["deployments"][0].update(gpus=3)
    data["deployments"].append(dict(data["deployments"][0], alias="judge", gpus=2))
    assert make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent).resources.nodes == 2
    with pytest.raises(InvalidInput, match=r"deployments\[1\]\.gpus: replica 0 \(2 GPU\(s\)\) "
                                           r"does not fit on this machine's 4 GPUs"):
        make_plan(run_config(data), local, RUN_ID, QUICKSTART.parent)
    data["deployments"][1].update(gpus=1)
    assert make_plan(run_config(data), local, RUN_ID, QUICKSTART.parent).resources.nodes == 1


def test_profile_defaults_apply() -> None:
    data = run_data()
    del data["resources"]
    plan = make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.resources.time_limit == "00:30:00"
    assert plan.resources.cpus == 2 and plan.resources.mem_mb == 1024


def test_gpus_sum_over_replicas_and_deployments() -> None:
    data = run_data()
    data["deployments"][0]["replicas"] = 2
    second = copy.deepcopy(data["deployments"][0])
    second.update(alias="other", gpus=2, replicas=1)
    data["deployments"].append(second)
    plan = make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.resources.gpus == 4


def test_too_many_gpus() -> None:
    data = run_data()
    data["deployments"][0]["gpus"] = 3
    data["deployments"][0]["replicas"] = 2
    with pytest.raises(InvalidInput) as info:
        make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)
    assert "6 GPUs" in info.value.message and "gpus_per_node" in info.value.message
    assert "\n" not in info.value.message


def test_gpus_on_gpu_less_profile() -> None:
    with pytest.raises(InvalidInput, match="gpus_per_node"):
        make_plan(run_config(), profile(gpus_per_node=0), RUN_ID, QUICKSTART.parent)


def test_step_memory_split() -> None:
    data = run_data()
    data["deployments"][0]["replicas"] = 3
    data["resources"]["mem_mb"] = 1000
    plan = make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.runtime.step_mem_mb == 250  # 3 servers + 1 client


def test_step_memory_too_small() -> None:
    data = run_data()
    data["deployments"][0]["gpus"] = 0
    data["deployments"][0]["replicas"] = 3
    data["resources"]["mem_mb"] = 100
    with pytest.raises(InvalidInput, match=r"resources\.mem_mb"):
        make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)


def test_plan_lookup_helpers() -> None:
    from synthbatch.agent_stdlib.contracts import ContractError

    plan = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.shard(2).record_offset == 20
    with pytest.raises(ContractError):
        plan.shard(3)
    with pytest.raises(ContractError):
        plan.shard(-1)
    with pytest.raises(ContractError):
        plan.deployment("nope")


def test_plan_round_trip() -> None:
    plan = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert Plan.from_dict(json.loads(plan.to_json())) == plan


def test_plan_json_is_deterministic() -> None:
    first = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent).to_json()
    second = make_plan(load_model(QUICKSTART, RunConfig), profile(), RUN_ID,
                       QUICKSTART.parent).to_json()
    assert first.encode() == second.encode()
    assert first.endswith("\n")
    assert json.loads(first)["schema_version"] == 1


def test_plan_json_keys_sorted() -> None:
    text = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent).to_json()

    def check(value: Any) -> None:
        if isinstance(value, dict):
            assert list(value) == sorted(value)
            for item in value.values():
                check(item)
        elif isinstance(value, list):
            for item in value:
                check(item)

    check(json.loads(text))


# ----------------------------------------------------------------------------- placement

EXAMPLES = REPO / "examples"


def layout(placement: Any) -> List[List[tuple]]:
    return [[(r.node, r.gpus, r.port) for r in reps] for reps in placement.replicas]


def test_spread() -> None:
    assert spread(5, 2) == [3, 2] and spread(4, 4) == [1] * 4 and spread(1, 1) == [1]


def test_place_packs_first_fit() -> None:
    placement = place([Shape(2, 2, 1), Shape(1, 2, 1)], gpus_per_node=4, port_base=100)
    assert layout(placement) == [[(0, (0, 1), 100), (0, (2, 3), 101)],
                                 [(1, (0,), 102), (1, (1,), 103)]]
    assert placement.gpus_used == (4, 2) and placement.nodes == 2


def test_place_spreads_over_distinct_nodes() -> None:
    placement = place([Shape(1, 1, 1), Shape(2, 3, 3)], gpus_per_node=4, port_base=0)
    nodes = [r[0] for r in layout(placement)[1]]
    assert len(set(nodes)) == 3  # one node per replica, first one shared with the first dep
    assert nodes[0] == 0 and placement.gpus_used == (3, 2, 2)


def test_place_gpu_less_replicas_share_a_node() -> None:
    placement = place([Shape(0, 3, 1)], gpus_per_node=0, port_base=5)
    assert layout(placement) == [[(0, (), 5), (0, (), 6), (0, (), 7)]]


@pytest.mark.parametrize("shape,field,fragment", [
    (Shape(8, 1, 1, "tensor_parallel"), "tensor_parallel", "8 GPUs per replica"),
    (Shape(2, 3, 1), "replicas", "need 6 GPUs on one node"),
    (Shape(3, 4, 2), "replicas", "need 6 GPUs"),
])
def test_place_rejects(shape: Shape, field: str, fragment: str) -> None:
    with pytest.raises(PlacementError) as info:
        place([Shape(0, 1, 1), shape], gpus_per_node=4, port_base=0)
    assert (info.value.index, info.value.field) == (1, field)
    assert fragment in str(info.value)


def test_place_port_range() -> None:
    with pytest.raises(PlacementError, match="65535") as info:
        place([Shape(0, 64, 1)] * 10, gpus_per_node=0, port_base=65000)
    assert info.value.field == "port_base"
    place([Shape(0, 35, 1)], gpus_per_node=0, port_base=65500)  # 65500..65534 fits


# ----------------------------------------------------------------------------- arrays


def test_array_chunks() -> None:
    assert array_chunks(3) == (ArraySpec(0, 0, 3),)
    assert array_chunks(3, 1001) == (ArraySpec(0, 0, 3),)
    assert array_chunks(2500, 1000) == (ArraySpec(0, 0, 1000), ArraySpec(1, 1000, 1000),
                                        ArraySpec(2, 2000, 500))
    assert array_chunks(1000, 1000) == (ArraySpec(0, 0, 1000),)


@pytest.mark.parametrize("text,value", [
    ("AuthType = auth/munge\nMaxArraySize            = 100001\nMaxJobCount = 1\n", 100001),
    ("MaxArraySize = 0\n", None), ("nothing here\n", None), ("MaxArraySize = x\n", None),
])
def test_parse_max_array_size(text: str, value: Optional[int]) -> None:
    assert parse_max_array_size(text) == value


def test_plan_records_arrays_and_throttle() -> None:
    data = run_data()
    data["records"], data["shards"] = 25, {"count": 25, "throttle": 4}
    plan = make_plan(run_config(data), profile(array_throttle=9), RUN_ID, QUICKSTART.parent,
                     max_array_size=10)
    assert [(a.first_shard, a.count) for a in plan.arrays] == [(0, 10), (10, 10), (20, 5)]
    assert plan.array_throttle == 4
    assert make_plan(run_config(), profile(array_throttle=9), RUN_ID,
                     QUICKSTART.parent).array_throttle == 9


# ----------------------------------------------------------------------------- directives


def test_apply_directives() -> None:
    res = ResourceSpec(partition=None, account=None, qos=None, time_limit="10", nodes=2, gpus=4,
                       gpu_request="gpus", cpus=8, mem_mb=1024, reservation="maint",
                       options={"constraint": "a100", "exclusive": ""})
    base = {"ntasks": "1", "gpus": "4", "nodes": "2", "requeue": None}
    assert apply_directives(base, res) == {
        "ntasks-per-node": "1", "gpus-per-node": "4", "nodes": "2", "requeue": None,
        "reservation": "maint", "constraint": "a100", "exclusive": None}
    single = ResourceSpec(partition=None, account=None, qos=None, time_limit="10", nodes=1,
                          gpus=4, gpu_request="gpus", cpus=8, mem_mb=1024)
    assert apply_directives(base, single) == base


# ----------------------------------------------------------------------------- deployments


def vllm_run(**dep: Any) -> Dict[str, Any]:
    data = run_data()
    data["deployments"] = [dict({"alias": "tiny", "engine": "vllm", "model": "org/m"}, **dep)]
    return data


def test_vllm_plan_layout_and_argv() -> None:
    plan = make_plan(run_config(vllm_run(tensor_parallel=2, replicas=2,
                                         extra_args=["--chat-template",
                                                     "{config_dir}/t.jinja"])),
                     profile(), RUN_ID, Path("/cfg"))
    dep = plan.deployment("tiny")
    assert dep.gpus_per_replica == 2 and dep.tensor_parallel == 2
    assert [(r.node, r.gpus, r.port) for r in dep.placement] == [(0, (0, 1), 20000),
                                                                  (0, (2, 3), 20001)]
    assert dep.command[:3] == ("vllm", "serve", "org/m")
    assert dep.command[-2:] == ("--chat-template", "/cfg/t.jinja")
    assert (plan.resources.nodes, plan.resources.gpus) == (1, 4)


def test_multi_node_resources_and_step_memory() -> None:
    data = vllm_run(tensor_parallel=4, replicas=2, nodes=2)
    data["resources"] = {"mem_mb": 4000}
    plan = make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent)
    assert (plan.resources.nodes, plan.resources.gpus) == (2, 4)
    assert plan.runtime.step_mem_mb == 2000  # node 0: one server + the client


def test_per_gpu_cpus_and_memory() -> None:
    data = vllm_run(tensor_parallel=2)
    del data["resources"]
    plan = make_plan(run_config(data), profile(cpus_per_gpu=8, mem_per_gpu_mb=1000), RUN_ID,
                     QUICKSTART.parent)
    assert (plan.resources.cpus, plan.resources.mem_mb) == (16, 2000)


def test_profile_reservation_and_options_reach_the_plan() -> None:
    plan = make_plan(run_config(), profile(reservation="maint",
                                           sbatch_options={"constraint": "a100"}),
                     RUN_ID, QUICKSTART.parent)
    assert plan.resources.reservation == "maint"
    assert plan.resources.options == {"constraint": "a100"}


def test_secret_references() -> None:
    data = run_data()
    data["deployments"][0]["env"] = {"HF_TOKEN": {"secret": "MY_HF"}, "A": "1"}
    plan = make_plan(run_config(data), profile(secrets=["MY_HF"]), RUN_ID, QUICKSTART.parent)
    dep = plan.deployment("tiny")
    assert dep.env == {"A": "1"} and dep.secret_env == {"HF_TOKEN": "MY_HF"}
    assert plan.runtime.secrets == ("MY_HF",)
    with pytest.raises(InvalidInput) as info:
        make_plan(run_config(data), profile(), RUN_ID, QUICKSTART.parent,
                  run_file=Path("run.toml"))
    assert info.value.message.startswith("run.toml: deployments[0].env.HF_TOKEN: secret MY_HF")


# ----------------------------------------------------------------------------- containers


@pytest.fixture
def images(tmp_path: Path) -> Dict[str, Any]:
    out = {}
    for alias, name in (("vllm", "vllm.sqsh"), ("sif", "vllm.sif")):
        path = tmp_path / name
        path.write_bytes(alias.encode())
        out[alias] = registry.add(tmp_path / "ws", alias, str(path))
    return out


def pyxis_profile(**changes: Any) -> Profile:
    return profile(workspace="/ws", container={"runtime": "pyxis", "mounts": [
        {"host": "/shared", "container": "/data", "read_only": True},
        {"host": "/shared/models", "container": "/models", "read_only": True}]}, **changes)


def test_container_plan(images: Dict[str, Any]) -> None:
    data = vllm_run(image="vllm", model="/shared/models/llama", gpus=1,
                    extra_args=["--download-dir=/shared/cache"], env={"HF_HOME": "/shared/hf"})
    plan = make_plan(run_config(data), pyxis_profile(), RUN_ID, QUICKSTART.parent,
                     images=images)
    dep = plan.deployment("tiny")
    assert dep.container is not None
    assert (dep.container.path, dep.container.sha256) == (images["vllm"].path,
                                                          images["vllm"].sha256)
    assert dep.command[2] == "/models/llama"  # most specific mount wins
    assert "--download-dir=/data/cache" in dep.command
    assert dep.env == {"HF_HOME": "/data/hf"}
    assert dep.model == "/shared/models/llama"  # the authored value is kept
    assert [m.container for m in dep.container.mounts] == ["/data", "/models",
                                                           "/synthbatch/run"]
    assert dep.container.mounts[-1].host == f"/ws/runs/{RUN_ID}"


def test_container_image_kind_must_match_runtime(images: Dict[str, Any]) -> None:
    data = vllm_run(image="sif", gpus=1)
    with pytest.raises(InvalidInput, match=r"deployments\[0\]\.image: .*\.sif file"):
        make_plan(run_config(data), pyxis_profile(), RUN_ID, QUICKSTART.parent, images=images)


def test_command_client_in_an_image(images: Dict[str, Any]) -> None:
    data = run_data()
    data["client"] = {"command": ["{python}", "/shared/code/c.py", "{config_dir}/x"],
                      "image": "vllm", "env": {"KEY_FILE": "/shared/k"}}
    plan = make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)
    assert plan.client is None and plan.client_command is not None
    assert plan.client_command.argv == ("/usr/bin/python3", "/data/code/c.py", "/cfg/x")
    assert plan.client_command.env == {"KEY_FILE": "/data/k"}
    assert Plan.from_dict(plan.to_dict()) == plan


def test_the_built_in_client_in_a_client_image(images: Dict[str, Any]) -> None:
    data = run_data()
    data["client"]["image"] = "vllm"
    plan = make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)
    assert plan.client is not None and plan.client.container is not None
    assert (plan.client.container.path, plan.client.container.sha256) == (
        images["vllm"].path, images["vllm"].sha256)
    assert plan.client.container.mounts[-1].container == "/synthbatch/run"
    assert Plan.from_dict(plan.to_dict()) == plan
    data["client"]["image"] = "nope"
    with pytest.raises(InvalidInput, match=r"client\.image: no image 'nope' is registered"):
        make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)


def test_a_recipe_in_a_client_image_reads_its_seed_data_under_a_mount(
        images: Dict[str, Any]) -> None:
    """The plan keeps the host path (plan and preflight read it there); one the image
    cannot see is refused at plan time, not when the shard starts."""
    data = run_data()
    data["client"] = {"image": "vllm", "seed_data": {"path": "/shared/topics.jsonl"},
                      "columns": [{"name": "q", "type": "llm-text", "model": "tiny",
                                   "prompt": "A question about {topic}."}]}
    plan = make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)
    assert plan.client is not None and plan.client.seed_data is not None
    assert plan.client.seed_data.path == "/shared/topics.jsonl"
    data["client"]["seed_data"]["path"] = "/elsewhere/topics.jsonl"
    with pytest.raises(InvalidInput, match=r"client\.seed_data\.path: /elsewhere/topics\.jsonl "
                                           r"is not under any of the profile's container mounts"):
        make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)


def test_an_image_directory_runs_only_with_charliecloud(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    for name in ("passwd", "group"):
        (tree / "etc" / name).write_text("")
    images = {"tree": registry.add(tmp_path / "ws", "tree", str(tree))}
    assert images["tree"].format == "directory"
    data = vllm_run(image="tree", gpus=1)
    charlie = profile(workspace="/ws", container={"runtime": "charliecloud"})
    plan = make_plan(run_config(data), charlie, RUN_ID, QUICKSTART.parent, images=images)
    assert plan.deployment("tiny").container.path == str(tree)
    with pytest.raises(InvalidInput, match=r"deployments\[0\]\.image: image 'tree' is a "
                                           r"directory, which pyxis cannot run"):
        make_plan(run_config(data), pyxis_profile(), RUN_ID, QUICKSTART.parent, images=images)


# ----------------------------------------------------------------------------- dry run


@pytest.mark.parametrize("example", ["fake-server.toml", "vllm-multigpu.toml",
                                     "multi-deployment.toml", "qa-fake.toml",
                                     "qa-dataset.toml", "quickstart.toml"])
def test_examples_plan_on_the_testbed_profile(example: str, tmp_path: Path) -> None:
    prof = tmp_path / "p.toml"
    prof.write_text(TESTBED.read_text().replace("/tmp/synthbatch-workspace",
                                                str(tmp_path / "ws")))
    out = dry_run(EXAMPLES / example, str(prof))
    assert out["summary"].splitlines()[0].startswith("run ")
    assert "GPU layout:" in out["summary"] and out["plan_sha256"] in out["summary"]
    assert out["script"].startswith("#!/bin/bash\n")
    assert not (tmp_path / "ws").exists()  # a dry run writes no state


def test_the_multi_deployment_example_uses_both_models(tmp_path: Path) -> None:
    prof = tmp_path / "p.toml"
    prof.write_text(TESTBED.read_text().replace("/tmp/synthbatch-workspace",
                                                str(tmp_path / "ws")))
    plan = Plan.from_dict(dry_run(EXAMPLES / "multi-deployment.toml", str(prof))["plan"])
    assert plan.client is not None
    used = {c.params["model"] for c in plan.client.columns if "model" in c.params}
    assert used == {d.alias for d in plan.deployments} == {"writer", "judge"}


def test_containers_example_plans_with_registered_images(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    for alias in ("vllm-0.6", "llamacpp", "client"):
        image = tmp_path / f"{alias}.sqsh"
        image.write_bytes(alias.encode())
        registry.add(workspace, alias, str(image))
    prof = tmp_path / "p.toml"
    prof.write_text((EXAMPLES / "profiles" / "pyxis.toml").read_text().replace(
        '"/shared/synthbatch"', f'"{workspace}"'))
    out = dry_run(EXAMPLES / "containers.toml", str(prof))
    summary = out["summary"]
    assert "qwen#0 GPUs 0,1 port 20000" in summary and "small#0 GPUs 2 port 20001" in summary
    assert "vllm serve /models/Qwen2.5-14B-Instruct" in summary
    assert "HF_TOKEN<-secret HF_TOKEN" in summary
    assert "--constraint=a100" in summary
    assert sorted(p.name for p in workspace.iterdir()) == ["images.json", "images.json.lock"]


def test_plan_errors_name_the_profile_file(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"] = [dict(alias=f"m{i}", model="m", command=["s", "{port}"], gpus=0,
                                replicas=64) for i in range(9)]
    data["client"]["model"] = "m0"
    with pytest.raises(InvalidInput) as info:
        make_plan(run_config(data), profile(port_base=65000), RUN_ID, QUICKSTART.parent,
                  profile_file=Path("p.toml"))
    assert info.value.message.startswith("p.toml: port_base: 65000 + 576 server ports")


# ----------------------------------------------------------------------------- data designer


def dd_run(**client: Any) -> Dict[str, Any]:
    data = run_data()
    data["client"] = {"data_designer": "{config_dir}/dd/config.yaml",
                      "python": "{config_dir}/envs/dd/bin/python", **client}
    return data


def test_data_designer_client_plan() -> None:
    data = dd_run(models={"writer": "tiny"}, run_config={"buffer_size": 50},
                  env={"HF_HOME": "/shared/hf"}, max_passes=2)
    plan = make_plan(run_config(data), profile(), RUN_ID, Path("/cfg"))
    spec = plan.client_data_designer
    assert plan.client is None and plan.client_command is None and spec is not None
    assert (spec.config, spec.python) == ("/cfg/dd/config.yaml", "/cfg/envs/dd/bin/python")
    assert spec.models == {"writer": "tiny"} and spec.run_config == {"buffer_size": 50}
    assert spec.env == {"HF_HOME": "/shared/hf"} and spec.max_passes == 2
    assert spec.container is None
    assert Plan.from_dict(plan.to_dict()) == plan


def test_data_designer_python_builder_keeps_its_function() -> None:
    data = dd_run(data_designer="/abs/build.py:make")
    spec = make_plan(run_config(data), profile(), RUN_ID, Path("/cfg")).client_data_designer
    assert spec is not None and spec.config == "/abs/build.py:make"


def test_data_designer_in_an_image(images: Dict[str, Any]) -> None:
    data = dd_run(data_designer="/shared/dd/config.yaml", image="vllm")
    del data["client"]["python"]
    plan = make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)
    spec = plan.client_data_designer
    assert spec is not None and spec.container is not None
    assert (spec.config, spec.python) == ("/data/dd/config.yaml", "python3")
    assert plan.client_container == spec.container
    data["client"]["data_designer"] = "/elsewhere/config.yaml"
    with pytest.raises(InvalidInput, match=r"client\.data_designer: /elsewhere/config.yaml "
                                           r"is not under any of the profile's container"):
        make_plan(run_config(data), pyxis_profile(), RUN_ID, Path("/cfg"), images=images)


def test_old_plans_without_a_data_designer_field_still_parse() -> None:
    plan = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent)
    data = plan.to_dict()
    del data["client_data_designer"]
    assert Plan.from_dict(data) == plan
