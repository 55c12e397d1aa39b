"""Deployments served from a serving environment's Python ({config_dir}-relative paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan


def _run(**deployment: object) -> dict:
    dep = {"alias": "smol", "engine": "llamacpp",
           "model": "{config_dir}/../.work/serving/llamacpp/model.gguf",
           "python": "{config_dir}/../.work/serving/llamacpp/venv/bin/python"}
    dep.update(deployment)
    return {"schema_version": 1, "name": "t", "records": 4, "shards": {"count": 2},
            "client": {"model": "smol", "prompt_template": "x {index}"},
            "deployments": [dep]}


def _plan(data: dict, config_dir: str = "/repo/examples"):
    profile = Profile(schema_version=1, workspace="/tmp/ws")
    return make_plan(RunConfig.model_validate(data), profile, "t-1", Path(config_dir))


def test_config_dir_paths_resolve_against_the_run_file() -> None:
    dep = _plan(_run()).deployments[0]
    assert dep.command[:4] == ("/repo/.work/serving/llamacpp/venv/bin/python", "-I", "{agent}",
                               "serve-llamacpp")
    assert dep.command[5] == "/repo/.work/serving/llamacpp/model.gguf"
    assert dep.model == "/repo/.work/serving/llamacpp/model.gguf"
    assert "{config_dir}" not in " ".join(dep.command)


def test_python_and_executable_together_are_rejected() -> None:
    with pytest.raises(ValidationError, match="either executable .* or python"):
        RunConfig.model_validate(_run(executable="/usr/bin/llama-server"))


def test_python_is_not_for_the_openai_engine() -> None:
    with pytest.raises(ValidationError, match="python: only for engines"):
        RunConfig.model_validate(_run(engine="openai", command=["x", "{port}"]))


@pytest.mark.parametrize("bad", ["venv/bin/python", "{config_dir}/a b", "{config_dir}/$x",
                                 "{config_dir}"])
def test_bad_serving_python_paths(bad: str) -> None:
    with pytest.raises(ValidationError):
        RunConfig.model_validate(_run(python=bad))
