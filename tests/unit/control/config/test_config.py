"""The authored models (run config, profile) through ``load_model``: strict and one-line."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Type

import pytest
from pydantic import BaseModel

from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile, load_profile, resolve_profile_path
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput, NotFound
from tests.conftest import REPO
from tests.fakes import profile_data, run_data, write_json

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

QUICKSTART = REPO / "examples" / "fake-server.toml"
TESTBED = REPO / "examples" / "profiles" / "testbed.toml"


def write_toml(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def quickstart_with(old: str, new: str) -> str:
    text = QUICKSTART.read_text(encoding="utf-8")
    assert old in text, old
    return text.replace(old, new, 1)


def invalid(path: Path, model: Type[BaseModel], *fragments: str) -> str:
    """Assert loading fails with a one-line message naming the file and each fragment."""
    with pytest.raises(InvalidInput) as info:
        load_model(path, model)
    message = info.value.message
    assert str(info.value) == message
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert info.value.exit_code == 2
    return message


# ----------------------------------------------------------------------------- valid


def test_quickstart_example_validates() -> None:
    run = load_model(QUICKSTART, RunConfig)
    assert run.name == "fake-server"
    assert run.records == 30
    assert run.shards.count == 3 and run.shards.records_per_shard is None
    assert run.client.model == "tiny"
    assert [d.alias for d in run.deployments] == ["tiny"]
    assert run.deployments[0].gpus == 1
    assert run.resources.time_limit == "00:10:00"


def test_defaults_that_do_not_idle_a_gpu() -> None:
    """No fixed client concurrency (it was 8: most of a vLLM replica idle), and a proxy
    queue limit that is the generator's adaptive ceiling per replica (it was 64: at
    concurrency 128, 31% of requests became 429s)."""
    data = run_data()
    del data["client"]["concurrency"]
    assert "max_queued_requests" not in data["deployments"][0]
    run = RunConfig.model_validate(data)
    assert run.client.concurrency is None
    assert run.deployments[0].max_queued_requests == 256


def test_testbed_profile_validates() -> None:
    profile = load_model(TESTBED, Profile)
    assert profile.workspace == "/tmp/synthbatch-workspace"
    assert profile.partition == "debug"
    assert profile.gpus_per_node == 4
    assert profile.gpu_request == "gres"
    assert profile.slurm_bin is None


def test_json_equals_toml(tmp_path: Path) -> None:
    from_json = load_model(write_json(tmp_path, run_data()), RunConfig)
    assert from_json == load_model(QUICKSTART, RunConfig)


def test_profile_as_json(tmp_path: Path) -> None:
    path = write_json(tmp_path, profile_data(), "p.json")
    assert load_model(path, Profile) == load_model(TESTBED, Profile)


def test_records_per_shard_alternative(tmp_path: Path) -> None:
    data = run_data()
    data["shards"] = {"records_per_shard": 7}
    run = load_model(write_json(tmp_path, data), RunConfig)
    assert run.shards.records_per_shard == 7 and run.shards.count is None


def test_models_are_frozen() -> None:
    run = load_model(QUICKSTART, RunConfig)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        run.records = 5  # type: ignore[misc]


@pytest.mark.parametrize("limit", ["00:10:00", "1-00:00:00", "90", "2-12:30:00", "5:00:00"])
def test_valid_time_limits(tmp_path: Path, limit: str) -> None:
    data = run_data()
    data["resources"]["time_limit"] = limit
    assert load_model(write_json(tmp_path, data), RunConfig).resources.time_limit == limit


# ----------------------------------------------------------------------------- unknown keys


def test_unknown_top_level_key_json(tmp_path: Path) -> None:
    data = run_data()
    data["recrods"] = 3
    invalid(write_json(tmp_path, data), RunConfig, "recrods",
            "unknown field (did you mean records?)")


def test_unknown_top_level_key_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("records = 30", "records = 30\nrecrods = 3"))
    invalid(path, RunConfig, "recrods")


def test_unknown_nested_key_in_list(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("gpus = 1", "gpus = 1\ngpu = 2"))
    invalid(path, RunConfig, "deployments[0].gpu:")


def test_unknown_nested_key_in_table(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["temprature"] = 0.1
    invalid(write_json(tmp_path, data), RunConfig, "client.temprature")


def test_unknown_profile_key(tmp_path: Path) -> None:
    data = profile_data()
    data["partitions"] = "debug"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "partitions")


def test_unknown_key_with_control_character_stays_one_line(tmp_path: Path) -> None:
    data = profile_data()
    data["bad\nkey"] = 1
    invalid(write_json(tmp_path, data, "p.json"), Profile)


# ----------------------------------------------------------------------------- duplicates


def test_duplicate_key_json(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    text = json.dumps(run_data())
    path.write_text(text.replace('"records": 30', '"records": 30, "records": 31'))
    invalid(path, RunConfig, "duplicate key 'records'")


def test_duplicate_nested_key_json(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    text = json.dumps(run_data()).replace('"count": 3', '"count": 3, "count": 2')
    path.write_text(text)
    invalid(path, RunConfig, "duplicate key 'count'")


def test_duplicate_key_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("records = 30", "records = 30\nrecords = 31"))
    invalid(path, RunConfig, "line 7")


def test_duplicate_key_toml_names_the_key(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("records = 30", "records = 30\nrecords = 31"))
    invalid(path, RunConfig, "records")


def test_duplicate_table_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, QUICKSTART.read_text() + "\n[shards]\ncount = 2\n")
    invalid(path, RunConfig)


# ----------------------------------------------------------------------------- types


def test_string_for_int(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("records = 30", 'records = "30"'))
    invalid(path, RunConfig, "records:", "valid integer")


def test_string_for_int_json(tmp_path: Path) -> None:
    data = run_data()
    data["records"] = "30"
    invalid(write_json(tmp_path, data), RunConfig, "records:")


def test_float_for_int(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["max_tokens"] = 24.0
    invalid(write_json(tmp_path, data), RunConfig, "client.max_tokens")


def test_bool_for_int(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["gpus"] = True
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].gpus")


def test_int_for_string(tmp_path: Path) -> None:
    data = run_data()
    data["name"] = 5
    invalid(write_json(tmp_path, data), RunConfig, "name:")


def test_table_for_list(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"] = data["deployments"][0]
    invalid(write_json(tmp_path, data), RunConfig, "deployments")


def test_number_out_of_range(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["temperature"] = 3.0
    invalid(write_json(tmp_path, data), RunConfig, "client.temperature")


def test_top_level_not_a_table(tmp_path: Path) -> None:
    invalid(write_json(tmp_path, [1, 2]), RunConfig, "top level")


def test_syntax_error_toml(tmp_path: Path) -> None:
    invalid(write_toml(tmp_path, "schema_version = \n"), RunConfig)


def test_syntax_error_json(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text('{"schema_version": 1,')
    invalid(path, RunConfig)


# ----------------------------------------------------------------------------- text


@pytest.mark.parametrize("char", ["\x07", "\x00", "\x1b", "\x7f", "\n"])
def test_control_character_in_prompt(tmp_path: Path, char: str) -> None:
    data = run_data()
    data["client"]["prompt_template"] = f"Say {{index}}{char}now"
    message = invalid(write_json(tmp_path, data), RunConfig, "client.prompt_template",
                      "control characters")
    assert char not in message


def test_control_character_in_prompt_toml(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("number {index}.", "number {index}.\\u0007"))
    invalid(path, RunConfig, "client.prompt_template", "control characters")


def test_control_character_in_command(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["command"].append("--x\x07")
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].command[8]",
            "control characters")


def test_control_character_in_env_value(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["env"] = {"FOO": "a\tb"}
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].env.FOO")


def test_bad_env_name(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["env"] = {"1FOO": "x"}
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].env")


@pytest.mark.parametrize("name", ["has space", "-leading", "a/b", "x" * 65, ""])
def test_bad_run_name(tmp_path: Path, name: str) -> None:
    data = run_data()
    data["name"] = name
    invalid(write_json(tmp_path, data), RunConfig, "name:")


@pytest.mark.parametrize("field,value", [("partition", "debug\n"), ("account", "acct\n"),
                                         ("qos", "normal\n"), ("default_time_limit", "30\n")])
def test_trailing_newline_in_profile_names_rejected(tmp_path: Path, field: str,
                                                    value: str) -> None:
    # Accepted today, these values end up inside '#SBATCH --partition=...' and break the
    # script (see test_renderer.py::test_newline_in_partition_breaks_script).
    data = profile_data()
    data[field] = value
    invalid(write_json(tmp_path, data, "p.json"), Profile, field)


def test_trailing_newline_in_env_allow_rejected(tmp_path: Path) -> None:
    data = profile_data()
    data["env_allow"] = ["HF_TOKEN\n"]
    invalid(write_json(tmp_path, data, "p.json"), Profile, "env_allow[0]")


def test_trailing_newline_in_run_name_rejected(tmp_path: Path) -> None:
    data = run_data()
    data["name"] = "quickstart\n"
    invalid(write_json(tmp_path, data), RunConfig, "name")


# ----------------------------------------------------------------------------- paths


def test_relative_workspace(tmp_path: Path) -> None:
    data = profile_data()
    data["workspace"] = "work/space"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "workspace:", "absolute path")


def test_dotdot_in_workspace(tmp_path: Path) -> None:
    data = profile_data()
    data["workspace"] = "/tmp/../etc"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "workspace:", "'..'")


def test_dotdot_in_python(tmp_path: Path) -> None:
    data = profile_data()
    data["python"] = "/usr/bin/../bin/python3"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "python:", "'..'")


def test_relative_slurm_bin(tmp_path: Path) -> None:
    data = profile_data()
    data["slurm_bin"] = "bin"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "slurm_bin:")


@pytest.mark.parametrize("workspace", ["/tmp/my space", "/tmp/100%", "/tmp/a'b", "/tmp/$HOME",
                                       "/tmp/a;b", "/tmp/a`b`", "/tmp/é"])
def test_unsafe_characters_in_workspace(tmp_path: Path, workspace: str) -> None:
    data = profile_data()
    data["workspace"] = workspace
    invalid(write_json(tmp_path, data, "p.json"), Profile, "workspace:")


def test_control_character_in_workspace(tmp_path: Path) -> None:
    data = profile_data()
    data["workspace"] = "/tmp/a\nb"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "workspace:", "control")


# ----------------------------------------------------------------------------- shards


def test_shards_both(tmp_path: Path) -> None:
    data = run_data()
    data["shards"] = {"count": 3, "records_per_shard": 10}
    invalid(write_json(tmp_path, data), RunConfig, "shards", "exactly one")


def test_shards_neither(tmp_path: Path) -> None:
    data = run_data()
    data["shards"] = {}
    invalid(write_json(tmp_path, data), RunConfig, "shards", "exactly one")


def test_shards_count_over_records(tmp_path: Path) -> None:
    data = run_data()
    data["records"] = 2
    invalid(write_json(tmp_path, data), RunConfig, "shards.count", "3 shards for 2 records")


def test_shards_count_equal_records_is_fine(tmp_path: Path) -> None:
    data = run_data()
    data["records"] = 3
    assert load_model(write_json(tmp_path, data), RunConfig).records == 3


def test_shards_count_zero(tmp_path: Path) -> None:
    data = run_data()
    data["shards"] = {"count": 0}
    invalid(write_json(tmp_path, data), RunConfig, "shards.count")


# ----------------------------------------------------------------------------- templates


def test_unknown_prompt_placeholder(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["prompt_template"] = "About {foo} and {index}"
    invalid(write_json(tmp_path, data), RunConfig, "prompt_template", "{foo}")


def test_positional_prompt_placeholder(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["prompt_template"] = "About {}"
    invalid(write_json(tmp_path, data), RunConfig, "prompt_template", "unknown placeholder")


def test_escaped_braces_are_literal(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["prompt_template"] = 'Return {{"n": {index}}}'
    assert load_model(write_json(tmp_path, data), RunConfig)


@pytest.mark.parametrize("template", ["{index:03d}", "{index!r}"])
def test_format_spec_in_prompt_placeholder(tmp_path: Path, template: str) -> None:
    data = run_data()
    data["client"]["prompt_template"] = f"n={template}"
    invalid(write_json(tmp_path, data), RunConfig, "client", "{index}", "format spec")


def test_format_spec_in_prompt_names_the_field(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["prompt_template"] = "n={index:03d}"
    invalid(write_json(tmp_path, data), RunConfig, "prompt_template")


def test_unbalanced_brace_in_prompt(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["prompt_template"] = "n={index"
    invalid(write_json(tmp_path, data), RunConfig, "client")


def test_command_without_port(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["command"] = ["{python}", "-m", "server", "--host", "{host}"]
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0]", "command", "{port}")


def test_unknown_command_placeholder(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["command"].append("--x={gpu_count}")
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0]", "command",
            "{gpu_count}")


def test_format_spec_in_command_placeholder(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["command"][5] = "{port:d}"
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0]", "format spec")


def test_empty_command(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["command"] = []
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].command")


# ----------------------------------------------------------------------------- aliases


def test_client_model_not_an_alias(tmp_path: Path) -> None:
    data = run_data()
    data["client"]["model"] = "huge"
    invalid(write_json(tmp_path, data), RunConfig, "client.model", "'huge'",
            "not a deployment alias")


def test_duplicate_alias(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"].append(copy.deepcopy(data["deployments"][0]))
    invalid(write_json(tmp_path, data), RunConfig, "deployments", "'tiny'", "twice")


def test_no_deployments(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"] = []
    invalid(write_json(tmp_path, data), RunConfig, "deployments")


# ----------------------------------------------------------------------------- versions


def test_schema_version_missing(tmp_path: Path) -> None:
    data = run_data()
    del data["schema_version"]
    invalid(write_json(tmp_path, data), RunConfig, "schema_version")


def test_schema_version_two(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with("schema_version = 1", "schema_version = 2"))
    invalid(path, RunConfig, "schema_version")


def test_profile_schema_version_missing(tmp_path: Path) -> None:
    data = profile_data()
    del data["schema_version"]
    invalid(write_json(tmp_path, data, "p.json"), Profile, "schema_version")


@pytest.mark.parametrize("limit", ["1h", "10:00", "1:2:3", "00:10:00 ", "-1", "1-", ""])
def test_invalid_time_limit(tmp_path: Path, limit: str) -> None:
    data = run_data()
    data["resources"]["time_limit"] = limit
    invalid(write_json(tmp_path, data), RunConfig, "resources.time_limit")


def test_invalid_profile_time_limit(tmp_path: Path) -> None:
    data = profile_data()
    data["default_time_limit"] = "forever"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "default_time_limit")


def test_readiness_path_without_slash(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["readiness_path"] = "health"
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0]", "readiness_path")


def test_engine_not_supported(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["engine"] = "tgi"
    invalid(write_json(tmp_path, data), RunConfig, "deployments[0].engine")


def test_gpu_request_mode(tmp_path: Path) -> None:
    data = profile_data()
    data["gpu_request"] = "gpu"
    invalid(write_json(tmp_path, data, "p.json"), Profile, "gpu_request")


# ----------------------------------------------------------------------------- files


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_bytes(QUICKSTART.read_bytes().replace(b"fake-server", b"fake\xffserver", 1))
    invalid(path, RunConfig, "not UTF-8")


def test_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    invalid(path, RunConfig, "cannot read")


def test_file_is_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "dir.toml"
    path.mkdir()
    invalid(path, RunConfig, "cannot read")


def test_file_too_large(tmp_path: Path) -> None:
    path = tmp_path / "big.toml"
    path.write_bytes(QUICKSTART.read_bytes() + b"#" * (1 << 20))
    invalid(path, RunConfig, "larger than")


# ----------------------------------------------------------------------------- profile lookup


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".config" / "synthbatch" / "profiles").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SYNTHBATCH_PROFILE", raising=False)
    return home


def profile_dir(home: Path) -> Path:
    return home / ".config" / "synthbatch" / "profiles"


def test_profile_explicit_path_wins(home: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (profile_dir(home) / "default.toml").write_text(TESTBED.read_text())
    monkeypatch.setenv("SYNTHBATCH_PROFILE", str(tmp_path / "env.toml"))
    assert resolve_profile_path(str(TESTBED)) == TESTBED


def test_profile_explicit_name(home: Path) -> None:
    (profile_dir(home) / "cluster.toml").write_text(TESTBED.read_text())
    assert resolve_profile_path("cluster") == profile_dir(home) / "cluster.toml"


def test_profile_from_env(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (profile_dir(home) / "default.toml").write_text(TESTBED.read_text())
    env = tmp_path / "env.toml"
    env.write_text(TESTBED.read_text())
    monkeypatch.setenv("SYNTHBATCH_PROFILE", str(env))
    assert resolve_profile_path(None) == env


def test_profile_env_may_be_a_name(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (profile_dir(home) / "other.toml").write_text(TESTBED.read_text())
    monkeypatch.setenv("SYNTHBATCH_PROFILE", "other")
    assert resolve_profile_path(None) == profile_dir(home) / "other.toml"


def test_profile_default(home: Path) -> None:
    (profile_dir(home) / "default.toml").write_text(TESTBED.read_text())
    assert resolve_profile_path(None) == profile_dir(home) / "default.toml"
    profile, path = load_profile(None)
    assert path == profile_dir(home) / "default.toml"
    assert profile.partition == "debug"


def test_profile_tilde_path(home: Path) -> None:
    (home / "p.toml").write_text(TESTBED.read_text())
    assert resolve_profile_path("~/p.toml") == home / "p.toml"


@pytest.mark.parametrize("choice", [None, "missing", "/nowhere/p.toml"])
def test_profile_missing(home: Path, choice: str) -> None:
    with pytest.raises(NotFound) as info:
        resolve_profile_path(choice)
    assert info.value.exit_code == 3
    assert "no such file" in info.value.message
    assert "\n" not in info.value.message
    assert info.value.hint and "--profile" in info.value.hint
    assert "SYNTHBATCH_PROFILE" in info.value.hint


def test_profile_missing_names_default_path(home: Path) -> None:
    with pytest.raises(NotFound, match="default.toml"):
        resolve_profile_path(None)


def test_load_profile_invalid(home: Path) -> None:
    path = profile_dir(home) / "default.toml"
    path.write_text(TESTBED.read_text().replace("gpus_per_node = 4", "gpus_per_node = -1"))
    with pytest.raises(InvalidInput, match="gpus_per_node"):
        load_profile(None)


# ----------------------------------------------------------------------------- new fields


def test_vllm_gpus_default_to_tp_times_pp(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0] = {"alias": "tiny", "engine": "vllm", "model": "org/m",
                              "tensor_parallel": 2, "pipeline_parallel": 2}
    dep = load_model(write_json(tmp_path, data), RunConfig).deployments[0]
    assert dep.gpus_per_replica == 4 and dep.gpus is None


def test_openai_gpus_default_to_zero(tmp_path: Path) -> None:
    data = run_data()
    del data["deployments"][0]["gpus"]
    assert load_model(write_json(tmp_path, data), RunConfig).deployments[0].gpus_per_replica == 0


def test_env_literals_and_secret_refs(tmp_path: Path) -> None:
    data = run_data()
    data["deployments"][0]["env"] = {"TOKENIZERS_PARALLELISM": "false",
                                     "HF_TOKEN": {"secret": "HF_TOKEN"}}
    env = load_model(write_json(tmp_path, data), RunConfig).deployments[0].env
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["HF_TOKEN"].secret == "HF_TOKEN"  # type: ignore[union-attr]


def test_command_client(tmp_path: Path) -> None:
    data = run_data()
    data["client"] = {"command": ["{python}", "{config_dir}/client.py"], "image": "img"}
    run = load_model(write_json(tmp_path, data), RunConfig)
    assert run.client.command == ["{python}", "{config_dir}/client.py"]  # type: ignore


def test_command_client_unknown_placeholder(tmp_path: Path) -> None:
    data = run_data()
    data["client"] = {"command": ["run", "{port}"]}
    invalid(write_json(tmp_path, data), RunConfig, "client.command[1]", "{port}")


def test_client_union_errors_name_plain_fields(tmp_path: Path) -> None:
    data = run_data()
    data["client"] = {"command": ["run"], "imag": "x"}
    message = invalid(write_json(tmp_path, data), RunConfig, "client.imag:")
    assert "<" not in message


def test_duplicate_key_in_array_of_tables_names_the_entry(tmp_path: Path) -> None:
    path = write_toml(tmp_path, quickstart_with('alias = "tiny"', 'alias = "tiny"\nalias = "x"'))
    invalid(path, RunConfig, "deployments[0].alias: duplicate key")


def test_secret_values_are_redacted_everywhere(tmp_path: Path) -> None:
    token = "hf_" + "Z" * 30
    data = run_data()
    data[token] = 1  # even an unknown key that looks like a token is not echoed
    message = invalid(write_json(tmp_path, data), RunConfig)
    assert token not in message and "<redacted>" in message


def test_profile_new_fields(tmp_path: Path) -> None:
    data = profile_data()
    data.update(reservation="maint", cpus_per_gpu=8, mem_per_gpu_mb=1000, secrets=["HF_TOKEN"],
                sbatch_options={"constraint": "a100|h100", "exclusive": ""},
                container={"runtime": "apptainer", "executable": "/opt/bin/apptainer",
                           "mounts": [{"host": "/data", "container": "/data",
                                       "read_only": True}]})
    prof = load_model(write_json(tmp_path, data, "p.json"), Profile)
    assert prof.container.mounts[0].read_only and prof.sbatch_options["exclusive"] == ""


@pytest.mark.parametrize("change,fragment", [
    ({"sbatch_options": {"constraint": ""}}, "sbatch_options.constraint"),
    ({"secrets": ["A"], "env_allow": ["A"]}, "secrets"),
    ({"container": {"runtime": "pyxis", "mounts": [{"host": "/a,b", "container": "/a"}]}},
     "container.mounts[0].host"),
    ({"container": {"runtime": "pyxis", "mounts": [{"host": "/a", "container": "/x"},
                                                   {"host": "/b", "container": "/x"}]}},
     "container.mounts[1].container"),
])
def test_profile_consistency(tmp_path: Path, change: Dict[str, Any], fragment: str) -> None:
    data = profile_data()
    data.update(change)
    invalid(write_json(tmp_path, data, "p.json"), Profile, fragment)


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/health?ready=1", "/a%20b",
                                  "/health_generate", "/"])
def test_readiness_path_accepts_url_paths(tmp_path: Path, path: str) -> None:
    data = run_data()
    data["deployments"][0]["readiness_path"] = path
    assert load_model(write_json(tmp_path, data), RunConfig).deployments[0].readiness_path \
        == path


# ----------------------------------------------------------------------------- local backend

LOCAL = REPO / "examples" / "profiles" / "local.toml"


def test_the_local_example_profile_validates() -> None:
    prof = load_model(LOCAL, Profile)
    assert prof.backend == "local" and prof.local.max_concurrent == 2
    assert prof.local.gpus is None and prof.local.kill_wait_s == 30.0


@pytest.mark.parametrize("changes, message", [
    ({"container": {"runtime": "pyxis"}}, "container.runtime: pyxis starts containers "
                                          "through srun"),
    ({"local": {"gpus": [0, 0]}}, "local.gpus: a GPU index is listed twice"),
    ({"gpus_per_node": 3, "local": {"gpus": [0, 1]}},
     "gpus_per_node: 3 is more than the 2 GPU(s) in local.gpus"),
    ({"local": {"max_concurrent": -1}}, "local.max_concurrent"),
    ({"local": {"kill_wait_s": 0}}, "local.kill_wait_s"),
    ({"local": {"nope": 1}}, "local.nope"),
])
def test_bad_local_profiles_name_the_field(tmp_path: Path, changes: Dict[str, Any],
                                           message: str) -> None:
    data = {**profile_data(), "backend": "local", **changes}
    with pytest.raises(InvalidInput, match=re.escape(message)):
        load_model(write_json(tmp_path, data, "p.json"), Profile)


def test_the_slurm_backend_ignores_pyxis_checks_of_the_local_one(tmp_path: Path) -> None:
    data = {**profile_data(), "container": {"runtime": "pyxis"}, "local": {"gpus": [0]}}
    assert load_model(write_json(tmp_path, data, "p.json"), Profile).backend == "slurm"
