"""The planner: record splitting, command resolution, resources and the Plan contract."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from agent_stdlib.contracts import Plan, ShardSpec
from control.config.loader import load_model
from control.config.profile import Profile
from control.config.run import Deployment, RunConfig
from control.errors import InvalidInput
from control.planning.planner import make_plan, new_run_id, resolve_command, split_records

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.toml"
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
    dep = deployment(["serve", "{model}", "--port", "{port}"], model="weird{port}name")
    assert resolve_command(dep, "/p", Path("/c"))[1] == "weird{port}name"


# ----------------------------------------------------------------------------- make_plan


def test_make_plan_quickstart() -> None:
    plan = make_plan(run_config(), profile(), RUN_ID, QUICKSTART.parent)
    assert plan.run_id == RUN_ID and plan.name == "quickstart"
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
    from agent_stdlib.contracts import ContractError

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


# ----------------------------------------------------------------------------- run ids


def test_new_run_id_format() -> None:
    run_id = new_run_id("quickstart", now=0)
    assert re.fullmatch(r"quickstart-19700101-000000-[0-9a-f]{6}", run_id), run_id


def test_new_run_id_uses_utc() -> None:
    assert new_run_id("x", now=1_700_000_000).startswith("x-20231114-221320-")


def test_new_run_id_unique_and_valid() -> None:
    from control.runs.store import RUN_ID as RUN_ID_PATTERN

    ids = {new_run_id("a.b_c-d") for _ in range(200)}
    assert len(ids) == 200
    assert all(RUN_ID_PATTERN.match(i) for i in ids)
