"""A built-in generator recipe (the issue's question-answer-judge chain) and how the config
tests load and plan it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput
from synthbatch.control.planning.planner import make_plan
from tests.fakes import profile_data

RECIPE = """schema_version = 1
name = "qa"
records = 30
[shards]
count = 3

[client]
seed = 1234
on_error = "drop"

[client.seed_data]
path = "{config_dir}/topics.jsonl"
order = "shuffle"

[[client.columns]]
name = "level"
type = "category"
values = ["beginner", "expert"]
weights = [3, 1]

[[client.columns]]
name = "question"
type = "llm-text"
model = "gen"
system = "You write exam questions."
prompt = "Write one {level} question about {topic}."
max_tokens = 64
temperature = 0.8

[[client.columns]]
name = "answer"
type = "llm-structured"
model = "gen"
prompt = "Answer the question and explain: {question}"
schema = { type = "object", properties = { answer = { type = "string" }, steps = { type = "array", items = { type = "string" } } }, required = ["answer"] }

[[client.columns]]
name = "grade"
type = "llm-judge"
model = "judge"
prompt = "Question: {question}\\nAnswer: {answer.answer}"
scores = [{ name = "correct", options = { "1" = "correct", "0" = "wrong" } }]

[[deployments]]
alias = "gen"
model = "fake-model"
command = ["{python}", "server.py", "--port", "{port}"]

[[deployments]]
alias = "judge"
model = "fake-model"
command = ["{python}", "server.py", "--port", "{port}"]
"""  # noqa: E501 (the issue's inline schema table)


def write(tmp_path: Path, text: str) -> Path:
    """``text`` as ``tmp_path/run.toml``."""
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str = RECIPE) -> RunConfig:
    """The run file ``text`` loaded as the CLI loads it."""
    return load_model(write(tmp_path, text), RunConfig)


def plan_of(tmp_path: Path, text: str = RECIPE) -> Plan:
    """The plan of the run file ``text`` on the test profile."""
    return make_plan(load(tmp_path, text), Profile.model_validate(profile_data()),
                     "qa-20240101-000000-abcdef", tmp_path)


def rejection(tmp_path: Path, text: str, old: str, new: str,
              make: Callable[[Path, str], Any] = load) -> str:
    """The one-line error (after the file name) of ``text`` with ``old`` made ``new``."""
    assert old in text, old
    with pytest.raises(InvalidInput) as info:
        make(tmp_path, text.replace(old, new, 1))
    message = info.value.message
    assert "\n" not in message and message.startswith(f"{tmp_path / 'run.toml'}: ")
    return message.split(": ", 1)[1]
