"""The table of rejected inputs: each through ``synthbatch plan``, exit 2, one line naming
the file and the field path, secret-like values never echoed."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
from click.testing import CliRunner

from synthbatch.control.cli.main import cli
from synthbatch.control.images import registry
from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

QUICKSTART = REPO / "examples" / "fake-server.toml"
TESTBED = REPO / "examples" / "profiles" / "testbed.toml"
HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
SK = "sk-" + "proj1234567890abcdefXYZ"
AWS = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"  # an AWS secret access key's shape
Data = Dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One rejected input: how to break the run and/or the profile, and what to expect."""

    id: str
    where: str  # the field path the message must name
    run: Callable[[Data], Any] = lambda d: None
    profile: Callable[[Data], Any] = lambda d: None
    blame: str = "run"  # which file the message names
    fragment: str = ""
    secret: str = ""
    toml: Optional[Callable[[str], str]] = None


def dep(data: Data, **changes: Any) -> None:
    data["deployments"][0].update(changes)


def vllm(data: Data, **changes: Any) -> None:
    data["deployments"][0] = {"alias": "tiny", "engine": "vllm", "model": "org/model",
                              **changes}


def dd(**changes: Any) -> Callable[[Data], None]:
    """Make the run's client a Data Designer config with ``changes``."""
    def change(data: Data) -> None:
        client = {"data_designer": "/c/dd.yaml", "python": "/envs/dd/bin/python", **changes}
        data["client"] = {k: v for k, v in client.items() if v is not None}
    return change


def pyxis(data: Data) -> None:
    data["container"] = {"runtime": "pyxis", "mounts": [
        {"host": "/shared/models", "container": "/models", "read_only": True}]}
    data["secrets"] = ["HF_TOKEN"]


def put(path: List[Any], value: Any) -> Callable[[Data], None]:
    def apply(data: Data) -> None:
        target = data
        for key in path[:-1]:
            target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
        target[path[-1]] = value
    return apply


CASES = [
    # unknown keys
    Case("unknown-top", "recrods", put(["recrods"], 3)),
    Case("unknown-retries", "retries.in_allocaton", put(["retries", "in_allocaton"], 1)),
    Case("negative-restarts", "retries.in_allocation", put(["retries", "in_allocation"], -1)),
    Case("unknown-deployment", "deployments[0].gpu", lambda d: dep(d, gpu=1)),
    Case("unknown-profile", "partitions", profile=put(["partitions"], "x"), blame="profile"),
    Case("unknown-container", "container.runtim", profile=put(["container", "runtim"], "x"),
         blame="profile"),
    Case("unknown-secret-ref", "deployments[0].env.HF_TOKEN.extra",
         lambda d: dep(d, env={"HF_TOKEN": {"secret": "HF_TOKEN", "extra": 1}})),
    # duplicate keys
    Case("duplicate-toml", "records",
         toml=lambda t: t.replace("records = 30", "records = 30\nrecords = 31")),
    Case("duplicate-table-key-toml", "shards.count",
         toml=lambda t: t.replace("count = 3", "count = 3\ncount = 4")),
    # wrong types
    Case("string-for-int", "records", put(["records"], "30")),
    Case("bool-for-int", "deployments[0].replicas", lambda d: dep(d, replicas=True)),
    Case("string-for-float", "client.temperature", put(["client", "temperature"], "hot")),
    Case("profile-string-for-int", "gpus_per_node", profile=put(["gpus_per_node"], "4"),
         blame="profile"),
    Case("mount-read-only-type", "container.mounts[0].read_only", profile=lambda d: (
        pyxis(d), d["container"]["mounts"][0].update(read_only="yes")), blame="profile"),
    Case("string-for-list", "deployments[0].extra_args",
         lambda d: vllm(d, extra_args="--enforce-eager")),
    # control characters
    Case("control-prompt", "client.prompt_template",
         put(["client", "prompt_template"], "n={index}\x07")),
    Case("control-served-name", "deployments[0].served_name",
         lambda d: dep(d, served_name="tiny\n")),
    Case("control-extra-arg", "deployments[0].extra_args[1]",
         lambda d: vllm(d, extra_args=["--x", "a\x1bb"])),
    Case("control-account", "account", profile=put(["account"], "acct\x00"), blame="profile"),
    # relative paths, '..', reserved mount
    Case("relative-model", "deployments[0].model", lambda d: dep(d, model="./models/x")),
    Case("dotdot-model", "deployments[0].model", lambda d: dep(d, model="/models/../etc")),
    Case("relative-executable", "deployments[0].executable",
         lambda d: vllm(d, executable="bin/vllm")),
    Case("relative-extra-arg", "deployments[0].extra_args[1]",
         lambda d: vllm(d, extra_args=["--chat-template", "../t.jinja"])),
    Case("dotdot-extra-arg", "deployments[0].extra_args[0]",
         lambda d: vllm(d, extra_args=["--chat-template=/a/../b.jinja"])),
    Case("relative-workspace", "workspace", profile=put(["workspace"], "ws"), blame="profile"),
    Case("relative-mount", "container.mounts[0].host", profile=lambda d: (
        pyxis(d), d["container"]["mounts"][0].update(host="shared")), blame="profile"),
    Case("reserved-mount", "container.mounts[0].container", profile=lambda d: (
        pyxis(d), d["container"]["mounts"][0].update(container="/synthbatch/m")),
        blame="profile"),
    Case("reserved-arg", "deployments[0].extra_args[1]",
         lambda d: vllm(d, extra_args=["--download-dir", "/synthbatch/run/x"])),
    Case("reserved-env", "deployments[0].env.DATA",
         lambda d: dep(d, env={"DATA": "/synthbatch/data"})),
    # literal secrets (never echoed)
    Case("literal-secret-env-name", "deployments[0].env.HF_TOKEN",
         lambda d: dep(d, env={"HF_TOKEN": HF}), secret=HF,
         fragment="the value starts with 'hf_' like a Hugging Face token"),
    Case("literal-secret-env-value", "deployments[0].env.FOO",
         lambda d: dep(d, env={"FOO": SK}), secret=SK,
         fragment="the value starts with 'sk-' like an OpenAI key"),
    Case("literal-secret-env-short", "deployments[0].env.DB_PASSWORD",
         lambda d: dep(d, env={"DB_PASSWORD": "hunter2"}), secret="hunter2",
         fragment="the name has 'PASSWORD' and the value is not a number"),
    Case("literal-secret-env-random", "deployments[0].env.FOO",
         lambda d: dep(d, env={"FOO": AWS}), secret=AWS, fragment="a long random token"),
    # the message is whole: no word of it is taken for a secret (was "*** like a ...")
    Case("literal-secret-message-intact", "deployments[0].env.HF_TOKEN",
         lambda d: dep(d, env={"HF_TOKEN": "hf_abc"}), secret="hf_abc",
         fragment='looks like a literal secret: the name has \'TOKEN\' and the value is not '
                  'a number, boolean, path, URL or variable name (value not shown); write '
                  '{ secret = "NAME" } and list NAME in the profile\'s secrets'),
    Case("unknown-secret-named-key-intact", "client.max_token",
         put(["client", "max_token"], 24), fragment=": unknown field (did you mean max_tokens?)"),
    Case("api-key-flag", "deployments[0].extra_args[0]",
         lambda d: vllm(d, extra_args=["--api-key", SK]), secret=SK,
         fragment="--api-key is set by synthbatch"),  # was "--api-key *** set"
    Case("api-key-in-command", "deployments[0].command[8]",
         lambda d: d["deployments"][0]["command"].append("--api-key=s3cr3t-value"),
         secret="s3cr3t-value", fragment="'--api-key' takes a secret"),
    Case("token-in-args", "deployments[0].extra_args[1]",
         lambda d: vllm(d, extra_args=["--tokenizer", HF]), secret=HF,
         fragment="the argument starts with 'hf_' like a Hugging Face token"),
    Case("literal-secret-client-env", "client.env.OPENAI_API_KEY", lambda d: d.update(
        client={"command": ["python3", "/c/client.py"], "env": {"OPENAI_API_KEY": SK}}),
        secret=SK),
    Case("secret-not-declared", "deployments[0].env.HF_TOKEN",
         lambda d: dep(d, env={"HF_TOKEN": {"secret": "HF_TOKEN"}}), fragment="secrets"),
    Case("secret-value-as-name", "secrets[0]", profile=put(["secrets"], [HF]),
         blame="profile", secret=HF, fragment="it starts with 'hf_' like a Hugging Face token"),
    # readiness_path is a URL path, checked at plan time (was: refused after the queue wait)
    Case("readiness-path-space", "deployments[0].readiness_path",
         lambda d: dep(d, readiness_path="/health x"), fragment="is not a URL path"),
    Case("readiness-path-fragment", "deployments[0].readiness_path",
         lambda d: dep(d, readiness_path="/health#x"), fragment="is not a URL path"),
    Case("readiness-path-bad-escape", "deployments[0].readiness_path",
         lambda d: dep(d, readiness_path="/health%zz"), fragment="is not a URL path"),
    Case("readiness-path-relative", "deployments[0].readiness_path",
         lambda d: dep(d, readiness_path="health"), fragment="starts with '/'"),
    # runtime-owned flags
    Case("reserved-port", "deployments[0].extra_args[0]",
         lambda d: vllm(d, extra_args=["--port", "8000"]), fragment="--port"),
    Case("reserved-tp-short", "deployments[0].extra_args[0]",
         lambda d: vllm(d, extra_args=["-tp=2"]), fragment="-tp"),
    Case("reserved-sglang", "deployments[0].extra_args[0]", lambda d: d["deployments"][0].update(
        engine="sglang", model="org/m", command=None, extra_args=["--tp-size", "2"]),
        fragment="--tp-size"),
    Case("reserved-llamacpp", "deployments[0].extra_args[0]", lambda d: d.update(deployments=[
        {"alias": "tiny", "engine": "llamacpp", "model": "/m/q.gguf", "extra_args": ["-m", "x"]}
    ])),
    # GPU shapes
    Case("tp-pp-mismatch", "deployments[0].tensor_parallel",
         lambda d: vllm(d, tensor_parallel=2, pipeline_parallel=2, gpus=2), fragment="2 x 2"),
    # (vLLM TP 8 on the 4-GPU profile was refused here; issue 17: it spans 2 nodes now.
    # A command of the user's own does not span nodes unless it says how.)
    Case("replica-too-big", "deployments[0].gpus", lambda d: dep(d, gpus=8),
         fragment="8 GPUs per replica but the profile has 4 per node"),
    Case("replica-uneven-over-nodes", "deployments[0].nodes_per_replica",
         lambda d: vllm(d, tensor_parallel=8, nodes_per_replica=3),
         fragment="8 GPU(s) per replica do not split evenly over 3 nodes"),
    Case("replica-rank-too-big", "deployments[0].nodes_per_replica",
         lambda d: vllm(d, tensor_parallel=16, nodes_per_replica=2),
         fragment="16 GPUs per replica over 2 nodes (8 per node) but the profile has 4"),
    Case("replica-across-nodes-and-nodes", "deployments[0].nodes",
         lambda d: vllm(d, tensor_parallel=8, replicas=2, nodes=2),
         fragment="takes its own nodes"),
    Case("llamacpp-across-nodes", "deployments[0].nodes_per_replica", lambda d: d.update(
        deployments=[{"alias": "tiny", "engine": "llamacpp", "model": "/m/q.gguf", "gpus": 2,
                      "nodes_per_replica": 2}]), fragment="runs on one node"),
    Case("rank-placeholder-on-one-node", "deployments[0].command",
         lambda d: dep(d, command=["s", "{port}", "--rank", "{node_rank}"]),
         fragment="{node_rank} is only for a replica of several nodes"),
    Case("command-across-nodes-without-rank", "deployments[0].command",
         lambda d: dep(d, gpus=2, nodes_per_replica=2), fragment="must contain {node_rank}"),
    Case("shared-node-unknown", "deployments[0].shared_node",
         lambda d: dep(d, shared_node="judge"), fragment="not an earlier deployment"),
    Case("shared-node-does-not-fit", "deployments[1].shared_node", lambda d: d.update(
        deployments=[d["deployments"][0], dict(d["deployments"][0], alias="judge", gpus=4,
                                               shared_node="tiny")]),
        fragment="do not fit on the shared deployment's nodes"),
    Case("reserved-headless", "deployments[0].extra_args[0]",
         lambda d: vllm(d, extra_args=["--headless"]), fragment="--headless"),
    Case("reserved-master-port", "deployments[0].extra_args[1]",
         lambda d: vllm(d, extra_args=["--enforce-eager", "--master-port=1"]),
         fragment="--master-port"),
    Case("reserved-dist-init-addr", "deployments[0].extra_args[0]",
         lambda d: d["deployments"][0].update(engine="sglang", model="org/m", command=None,
                                              extra_args=["--dist-init-addr", "h:1"]),
         fragment="--dist-init-addr"),
    Case("replicas-do-not-fit", "deployments[0].replicas",
         lambda d: vllm(d, tensor_parallel=2, replicas=3), fragment="need 6 GPUs"),
    Case("nodes-over-replicas", "deployments[0].nodes", lambda d: dep(d, nodes=2)),
    Case("tp-on-openai", "deployments[0].tensor_parallel", lambda d: dep(d, tensor_parallel=2)),
    Case("llamacpp-hub-id", "deployments[0].model", lambda d: d.update(deployments=[
        {"alias": "tiny", "engine": "llamacpp", "model": "org/model"}])),
    # ports
    Case("port-base-high", "port_base", profile=put(["port_base"], 70000), blame="profile"),
    Case("port-base-low", "port_base", profile=put(["port_base"], 80), blame="profile"),
    Case("ports-past-65535", "port_base", lambda d: d.update(deployments=[
        dict(alias=f"m{i}", model="m", command=["s", "{port}"], gpus=0, replicas=64)
        for i in range(9)], client=dict(d["client"], model="m0")),
        profile=put(["port_base"], 65000), blame="profile", fragment="65535"),
    # engines, images, options
    Case("openai-without-command", "deployments[0].command", lambda d: dep(d, command=None)),
    Case("vllm-with-command", "deployments[0].command",
         lambda d: vllm(d, command=["vllm", "{port}"])),
    Case("image-without-runtime", "deployments[0].image", lambda d: dep(d, image="img")),
    Case("image-not-registered", "deployments[0].image", lambda d: vllm(d, image="nope"),
         profile=pyxis),
    Case("model-not-mounted", "deployments[0].model",
         lambda d: vllm(d, image="img", model="/elsewhere/m"), profile=pyxis),
    Case("sbatch-option-not-allowed", "sbatch_options.time",
         profile=put(["sbatch_options"], {"time": "1"}), blame="profile"),
    Case("sbatch-option-value", "sbatch_options.constraint",
         profile=put(["sbatch_options"], {"constraint": "a b"}), blame="profile"),
    Case("charliecloud-read-only", "container.mounts[0].read_only", profile=lambda d: (
        pyxis(d), d["container"].update(runtime="charliecloud")), blame="profile"),
    Case("mounts-without-runtime", "container", profile=lambda d: (
        pyxis(d), d["container"].update(runtime="none")), blame="profile"),
    Case("negative-throttle", "shards.throttle", put(["shards", "throttle"], -1)),
    Case("unknown-resume", "resume", put(["resume"], "sometimes")),
    Case("unknown-output-format", "output_format", put(["output_format"], "parquet")),
    Case("dd-relative-config", "client.data_designer", dd(data_designer="dd.yaml"),
         fragment="must be an absolute path"),
    Case("dd-python-file-without-function", "client.data_designer",
         dd(data_designer="/c/build.py"), fragment="'build.py:builder'"),
    Case("dd-not-a-config-file", "client.data_designer", dd(data_designer="/c/dd.txt")),
    Case("dd-without-python-or-image", "client.python", dd(python=None),
         fragment="scripts/client-env dd"),
    Case("dd-model-to-unknown-deployment", "client.models.writer",
         dd(models={"writer": "nope"}), fragment="is not a deployment alias (have: tiny)"),
    Case("dd-metrics-port", "client.run_config.otel_metrics_port",
         dd(run_config={"otel_metrics_port": 9464}), fragment="several clients"),
    Case("dd-nested-run-config", "client.run_config.request_admission",
         dd(run_config={"request_admission": {"x": 1}})),
    Case("dd-literal-secret-env", "client.env.OPENAI_API_KEY",
         dd(env={"OPENAI_API_KEY": SK}), secret=SK),
    Case("dd-image-without-runtime", "client.image", dd(image="img")),
]


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c.id for c in CASES}) == len(CASES)


def write_inputs(tmp_path: Path, case: Case) -> Dict[str, Path]:
    workspace = tmp_path / "ws"
    image = tmp_path / "img.sqsh"
    image.write_bytes(b"image")
    registry.add(workspace, "img", str(image))
    prof = tomllib.loads(TESTBED.read_text())
    prof["workspace"] = str(workspace)
    case.profile(prof)
    profile_path = tmp_path / "profile.json"
    profile_path.write_text(json.dumps(prof))
    if case.toml is not None:
        run_path = tmp_path / "run.toml"
        run_path.write_text(case.toml(QUICKSTART.read_text()))
    else:
        data = copy.deepcopy(tomllib.loads(QUICKSTART.read_text()))
        case.run(data)
        run_path = tmp_path / "run.json"
        run_path.write_text(json.dumps(data))
    return {"run": run_path, "profile": profile_path}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rejected(tmp_path: Path, case: Case) -> None:
    files = write_inputs(tmp_path, case)
    result = CliRunner().invoke(cli, ["plan", str(files["run"]), "--profile",
                                      str(files["profile"])])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"synthbatch: error: {files[case.blame]}: "), line
    assert f" {case.where}: " in line, line
    assert case.fragment in line, line
    if case.secret:
        assert case.secret not in result.stderr
        assert case.secret[4:12] not in result.stderr
