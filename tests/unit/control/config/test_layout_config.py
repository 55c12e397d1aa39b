"""Config of the cache-friendly layout: ``client.context``, a column's ``context`` and
``continue_from``; bad values give one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.control.errors import InvalidInput
from tests.unit.control.config.recipes import RECIPE as BASE
from tests.unit.control.config.recipes import load, plan_of

RECIPE = BASE.replace('on_error = "drop"\n', 'on_error = "drop"\ncontext = "About {topic}."\n')


def error(tmp_path: Path, text: str) -> str:
    """The one-line message loading ``text`` gives, without the file's name."""
    with pytest.raises(InvalidInput) as info:
        load(tmp_path, text)
    message = info.value.message
    assert "\n" not in message
    return message.split(": ", 1)[1]


def test_context_and_continue_from_reach_the_plan(tmp_path: Path) -> None:
    text = RECIPE.replace('prompt = "Answer the question', 'continue_from = "question"\n'
                          'context = "Be exact."\nprompt = "Answer the question', 1)
    spec = plan_of(tmp_path, text).client
    assert spec is not None and spec.context == "About {topic}."
    assert spec.columns[2].params["continue_from"] == "question"
    assert spec.columns[2].params["context"] == "Be exact."


@pytest.mark.parametrize("old,new,message", [
    ('context = "About {topic}."', 'context = "About {question}."',
     "client.context: {question} is an LLM column: the context comes before every LLM "
     "request of the record"),
    ('context = "About {topic}."', 'context = "About {topic"',
     "client.context: "),
    ('prompt = "Answer the question', 'continue_from = "answer"\nprompt = "Answer the question',
     "client.columns[2].continue_from: a column cannot continue its own conversation"),
    ('prompt = "Answer the question', 'continue_from = "level"\nprompt = "Answer the question',
     "client.columns[2].continue_from: 'level' is not an LLM column (have: question, grade)"),
    ('prompt = "Question: {question}', 'continue_from = "answer"\nprompt = "Question: {question}',
     "client.columns[3].continue_from: answer runs on model 'gen', this column on 'judge'"),
    ('prompt = "Answer the question', 'continue_from = "grade"\nprompt = "Answer the question',
     "client.columns[2].continue_from: grade runs on model 'judge'"),
    ('prompt = "Answer the question', 'continue_from = "no such"\nprompt = "Answer the question',
     "client.columns[2].continue_from: 'no such' is not a column name"),
])
def test_bad_layout_fields_name_the_field(tmp_path: Path, old: str, new: str,
                                          message: str) -> None:
    assert old in RECIPE, old
    got = error(tmp_path, RECIPE.replace(old, new, 1))
    assert got.startswith(message), got


def test_context_belongs_to_the_columns_form(tmp_path: Path) -> None:
    text = """schema_version = 1
name = "t"
records = 3
[shards]
count = 1
[client]
model = "gen"
prompt_template = "Say {index}"
context = "shared"
[[deployments]]
alias = "gen"
model = "fake-model"
command = ["{python}", "server.py", "--port", "{port}"]
"""
    got = error(tmp_path, text)
    assert got.startswith("client.context: needs columns"), got
