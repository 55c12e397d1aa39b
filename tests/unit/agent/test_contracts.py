"""Wire contracts: round trips, strict decoding with the field named, and a Plan golden."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Type

import pytest

from synthbatch.agent_stdlib.contracts import (
    SCHEMA_VERSION,
    AttemptRecord,
    BackendStatus,
    ContractError,
    DataDesignerSpec,
    DeploymentSpec,
    FileEntry,
    GenerateSpec,
    Plan,
    ProgressRecord,
    ReadinessRecord,
    Record,
    ResourceSpec,
    ResultManifest,
    RunRecord,
    RuntimeSpec,
    ShardSpec,
    SubmissionRecord,
    WinnerRecord,
    dd_check_report,
    sha256_bytes,
)
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from tests.conftest import GOLDENS, REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FILES = (FileEntry(path="part-0.jsonl", sha256="c" * 64, bytes=120, records=3),
         FileEntry(path="sub/part-1.jsonl", sha256="d" * 64, bytes=40, records=1))


def sample_plan() -> Plan:
    return Plan(
        run_id="r-1",
        name="r",
        total_records=5,
        shards=(ShardSpec(0, 0, 3), ShardSpec(1, 3, 2)),
        deployments=(DeploymentSpec(
            alias="tiny", engine="openai", model="m", served_name="m",
            command=("/usr/bin/python3", "serve.py", "--port", "{port}"), env={"A": "1"},
            gpus_per_replica=1, replicas=2, startup_timeout_s=60.0, readiness_path="/health",
            max_queued_requests=64),),
        client=GenerateSpec(model="tiny", prompt_template="n={index}", system_prompt=None,
                            max_tokens=16, temperature=0.5, concurrency=4, max_retries=2,
                            request_timeout_s=30.0),
        resources=ResourceSpec(partition=None, account="a", qos=None, time_limit="10",
                               nodes=1, gpus=2, gpu_request="gres", cpus=2, mem_mb=1024),
        runtime=RuntimeSpec(launcher="srun", python="/usr/bin/python3", port_base=20000,
                            env_allow=("HF_HOME",), step_mem_mb=341, grace_s=5.0),
        max_attempts=3,
    )


SAMPLES: Dict[str, Callable[[], Record]] = {
    "Plan": sample_plan,
    "RunRecord": lambda: RunRecord(run_id="r-1", name="r", created_at=1.5, plan_sha256="a" * 64,
                                   agent_pyz="agent-x.pyz", agent_sha256="b" * 64,
                                   backend="slurm", job_name="synthbatch-r-1", shard_count=2),
    "SubmissionRecord": lambda: SubmissionRecord(number=1, argv=("sbatch", "--hold"),
                                                 job_id="12", attempts={"0": 1, "1": 2},
                                                 submitted_at=2.0, released=True),
    "AttemptRecord": lambda: AttemptRecord(run_id="r-1", shard=1, attempt=2, state="running",
                                           revision=4, updated_at=3.0, submission=1,
                                           job_id="12_1", node="node1", restarts=1,
                                           reason=None),
    "ReadinessRecord": lambda: ReadinessRecord(
        shard=0, attempt=1, execution=2, state="ready", revision=7, updated_at=4.0,
        endpoints={"tiny": "http://127.0.0.1:20000/v1"},
        backends={"tiny": (BackendStatus("http://127.0.0.1:20001", True),)}, reason="ok"),
    "ProgressRecord": lambda: ProgressRecord(records_done=3, records_total=10, tokens=99,
                                             requests_per_s=1.25, updated_at=5.0),
    "ResultManifest": lambda: ResultManifest(shard=0, attempt=1, records=4, files=FILES,
                                             created_at=6.0),
    "WinnerRecord": lambda: WinnerRecord(shard=0, attempt=1, records=4,
                                         result_sha256="e" * 64, files=FILES, created_at=7.0),
}
NAMES = sorted(SAMPLES)


def sample(name: str) -> Record:
    return SAMPLES[name]()


def required_fields(cls: Type[Record]) -> List[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def int_fields(cls: Type[Record]) -> List[str]:
    import typing

    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] is int]


def rejected(cls: Type[Record], data: Any, *fragments: str) -> str:
    with pytest.raises(ContractError) as info:
        cls.from_dict(data)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name: str) -> None:
    record = sample(name)
    cls = type(record)
    assert cls.from_dict(record.to_dict()) == record
    assert cls.from_dict(json.loads(record.to_json())) == record
    assert record.to_dict()["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("name", NAMES)
def test_to_json_canonical(name: str) -> None:
    record = sample(name)
    text = record.to_json()
    assert text.endswith("\n")
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"
    assert sample(name).to_json() == text


@pytest.mark.parametrize("name", NAMES)
def test_records_are_frozen(name: str) -> None:
    record = sample(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.schema_version = 2  # type: ignore[misc]


def test_replace() -> None:
    record = sample("AttemptRecord")
    changed = record.replace(state="succeeded", revision=5)
    assert (changed.state, changed.revision, record.state) == ("succeeded", 5, "running")


def test_defaults_may_be_omitted() -> None:
    data = sample("AttemptRecord").to_dict()
    for key in ("submission", "job_id", "node", "restarts", "reason"):
        del data[key]
    record = AttemptRecord.from_dict(data)
    assert (record.restarts, record.job_id) == (0, None)
    data = sample("ReadinessRecord").to_dict()
    del data["endpoints"], data["backends"]
    assert ReadinessRecord.from_dict(data).endpoints == {}


def test_a_plan_written_before_replicas_spanned_nodes_still_parses() -> None:
    data = json.loads((GOLDENS / "plan.json").read_text())
    for dep in data["deployments"]:
        del dep["nodes_per_replica"], dep["follower_args"]
        for replica in dep["placement"]:
            del replica["nodes"], replica["dist_port"]
    plan = Plan.from_dict(data)
    assert plan == golden_plan()
    dep = plan.deployments[0]
    assert (dep.nodes_per_replica, dep.follower_args, dep.gpus_per_rank) == \
        (1, (), dep.gpus_per_replica)
    assert all(r.span == (r.node,) and r.dist_port == 0 for r in dep.placement)


def test_tuples_come_back_as_tuples() -> None:
    plan = Plan.from_dict(json.loads(sample_plan().to_json()))
    assert isinstance(plan.shards, tuple) and isinstance(plan.deployments[0].command, tuple)
    assert isinstance(plan.runtime.env_allow, tuple)


def test_int_accepted_for_float() -> None:
    data = sample("ProgressRecord").to_dict()
    data["requests_per_s"] = 2
    record = ProgressRecord.from_dict(data)
    assert record.requests_per_s == 2.0 and isinstance(record.requests_per_s, float)


def test_sha256_bytes() -> None:
    assert sha256_bytes(b"") == ("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")


# ----------------------------------------------------------------------------- strictness


@pytest.mark.parametrize("name", NAMES)
def test_unknown_field(name: str) -> None:
    data = sample(name).to_dict()
    data["bogus"] = 1
    rejected(type(sample(name)), data, f"{name}: unknown field 'bogus'")


@pytest.mark.parametrize("name,field", [(n, f) for n in NAMES
                                        for f in required_fields(type(SAMPLES[n]()))])
def test_missing_field(name: str, field: str) -> None:
    data = sample(name).to_dict()
    del data[field]
    rejected(type(sample(name)), data, f"{name}: missing field '{field}'")


@pytest.mark.parametrize("name,field", [(n, f) for n in NAMES
                                        for f in int_fields(type(SAMPLES[n]()))
                                        if f != "schema_version"])
def test_bool_for_int(name: str, field: str) -> None:
    data = sample(name).to_dict()
    data[field] = True
    rejected(type(sample(name)), data, f"{name}.{field}: expected int")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("version", [2, 0, "1", None, 1.5])
def test_unknown_schema_version(name: str, version: Any) -> None:
    data = sample(name).to_dict()
    data["schema_version"] = version
    rejected(type(sample(name)), data, f"{name}.schema_version", "unsupported")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("version", [True, 1.0])
def test_schema_version_equal_to_one_but_wrong_type(name: str, version: Any) -> None:
    data = sample(name).to_dict()
    data["schema_version"] = version
    rejected(type(sample(name)), data, f"{name}.schema_version: expected int")


@pytest.mark.parametrize("name", NAMES)
def test_missing_schema_version(name: str) -> None:
    data = sample(name).to_dict()
    del data["schema_version"]
    rejected(type(sample(name)), data, f"{name}.schema_version")


@pytest.mark.parametrize("mutate,fragment", [
    (lambda d: d.update(run_id=5), "Plan.run_id: expected str"),
    (lambda d: d.update(total_records="5"), "Plan.total_records: expected int"),
    (lambda d: d.update(shards={}), "Plan.shards: expected a list"),
    (lambda d: d["shards"].__setitem__(1, [1, 3, 2]), "Plan.shards[1]: expected an object"),
    (lambda d: d["shards"][0].update(num_records=True), "Plan.shards[0].num_records: expected"),
    (lambda d: d["shards"][0].update(extra=1), "Plan.shards[0]: unknown field 'extra'"),
    (lambda d: d["shards"][0].pop("index"), "Plan.shards[0]: missing field 'index'"),
    (lambda d: d["deployments"][0].update(command="serve"), "Plan.deployments[0].command"),
    (lambda d: d["deployments"][0]["command"].append(3), "Plan.deployments[0].command[4]"),
    (lambda d: d["deployments"][0].update(env=[]), "Plan.deployments[0].env: expected an"),
    (lambda d: d["deployments"][0]["env"].update(B=2), "Plan.deployments[0].env.B"),
    (lambda d: d["deployments"][0].update(startup_timeout_s="60"),
     "Plan.deployments[0].startup_timeout_s: expected float"),
    (lambda d: d["client"].update(temperature=True), "Plan.client.temperature: expected float"),
    (lambda d: d["client"].update(system_prompt=1), "Plan.client.system_prompt: expected str"),
    (lambda d: d.update(client=None), "Plan.client: expected an object"),
    (lambda d: d["resources"].update(partition=3), "Plan.resources.partition"),
    (lambda d: d["runtime"].update(env_allow=["A", None]), "Plan.runtime.env_allow[1]"),
])
def test_nested_errors_name_the_field(mutate: Callable[[Dict[str, Any]], Any],
                                      fragment: str) -> None:
    data = sample_plan().to_dict()
    mutate(data)
    rejected(Plan, data, fragment)


def test_readiness_nested_backend_errors() -> None:
    data = sample("ReadinessRecord").to_dict()
    data["backends"]["tiny"][0]["ready"] = "yes"
    rejected(ReadinessRecord, data, "ReadinessRecord.backends.tiny[0].ready: expected bool")


def test_submission_attempts_values() -> None:
    data = sample("SubmissionRecord").to_dict()
    data["attempts"]["0"] = "1"
    rejected(SubmissionRecord, data, "SubmissionRecord.attempts.0: expected int")


def test_optional_accepts_none_only_where_optional() -> None:
    data = sample("AttemptRecord").to_dict()
    data["job_id"] = None
    assert AttemptRecord.from_dict(data).job_id is None
    data["state"] = None
    rejected(AttemptRecord, data, "AttemptRecord.state: expected str")


def test_records_are_not_confused() -> None:
    rejected(WinnerRecord, sample("ResultManifest").to_dict(), "missing field 'result_sha256'")


# ----------------------------------------------------------------------------- plan golden


def golden_plan() -> Plan:
    run = RunConfig.model_validate(tomllib.loads(
        (REPO / "examples" / "fake-server.toml").read_text(encoding="utf-8")))
    profile = Profile.model_validate(tomllib.loads(
        (REPO / "examples" / "profiles" / "testbed.toml").read_text(encoding="utf-8")))
    # a fixed config dir keeps the golden independent of where the checkout lives
    return make_plan(run, profile, "quickstart-20240101-000000-abcdef",
                     Path("/srv/synthbatch/examples"))


def test_plan_golden(golden: Callable[[str, str], None]) -> None:
    golden("plan.json", golden_plan().to_json())


def test_plan_golden_decodes() -> None:
    text = (GOLDENS / "plan.json").read_text()
    assert Plan.from_dict(json.loads(text)) == golden_plan()


def test_plans_and_records_written_before_the_recipe_fields_still_load() -> None:
    """Retry and merge parse the plan.json of runs submitted before the generator grew
    columns: every new field has a default, every old one is still accepted."""
    data = json.loads((GOLDENS / "plan.json").read_text())
    for key in ("columns", "on_error", "seed", "seed_data", "context"):
        del data["client"][key]
    old = Plan.from_dict(data)
    assert old.client is not None and old.client.columns == () and old.client.seed == 0
    assert old.client.on_error == "fail" and old.client.concurrency == 4
    progress = {"schema_version": 1, "records_done": 3, "records_total": 9, "tokens": 12,
                "requests_per_s": 1.5, "updated_at": 1.0}
    assert ProgressRecord.from_dict(progress).aliases == {}
    full = ProgressRecord.from_dict({**progress, "records_dropped": 1, "aliases": {
        "gen": {"requests": 4, "tokens_in": 10, "tokens_out": 12, "errors": {"429": 2},
                "concurrency": 32, "in_flight": 3}}})
    assert full.aliases["gen"].errors == {"429": 2}
    assert ProgressRecord.from_dict(full.to_dict()) == full
    with pytest.raises(ContractError, match=r"ProgressRecord.aliases.gen: unknown field"):
        ProgressRecord.from_dict({**progress, "aliases": {"gen": {"bogus": 1}}})
# ----------------------------------------------------------------------------- data designer


def dd_plan() -> Plan:
    spec = DataDesignerSpec(config="/c/dd.yaml", python="/env/bin/python",
                            models={"writer": "tiny"}, run_config={"buffer_size": 10})
    return sample_plan().replace(client=None, client_data_designer=spec)


def test_a_data_designer_plan_round_trips() -> None:
    plan = dd_plan()
    assert Plan.from_dict(json.loads(plan.to_json())) == plan
    assert plan.client_container is None and plan.client_secret_env == {}


def test_a_plan_has_exactly_one_client() -> None:
    with pytest.raises(ContractError, match="Plan.client_data_designer: must be null when "
                                            "client is set"):
        dd_plan().replace(client=sample_plan().client)
    with pytest.raises(ContractError, match="or client_data_designer"):
        dd_plan().replace(client_data_designer=None)


def test_progress_without_failures_parses() -> None:
    data = sample("ProgressRecord").to_dict()
    assert data.pop("failures") == 0
    assert ProgressRecord.from_dict(data).failures == 0


@pytest.mark.parametrize("stdout, code, problems, notes", [
    ('log line\n{"problems": ["a", "b"], "notes": ["n"]}\n', 1, ["a", "b"], ["n"]),
    ('{"problems": [], "notes": []}\n', 0, [], []),
    ('{"problems": [], "notes": []}\n', 2, ["the check exited with status 2"], []),
    ("no verdict\n", 1, ["the check printed no verdict (exit status 1: boom)"], []),
])
def test_dd_check_report(stdout: str, code: int, problems: List[str],
                         notes: List[str]) -> None:
    assert dd_check_report(stdout, "x\nboom\n", code) == (problems, notes)
