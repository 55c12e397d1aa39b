"""A built-in generator recipe (``[[client.columns]]``): validation with the field path, and
the plan it makes (columns, seed data, the prompt-template form unchanged)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan, SeedDataSpec
from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs.plan import check_seed_data
from tests.unit.control.config.recipes import RECIPE, load, plan_of, rejection


def error(tmp_path: Path, old: str, new: str) -> str:
    return rejection(tmp_path, RECIPE, old, new)


def test_the_recipe_plans_into_columns_and_seed_data(tmp_path: Path) -> None:
    spec = plan_of(tmp_path).client
    assert spec is not None and (spec.seed, spec.on_error, spec.concurrency) == \
        (1234, "drop", None)
    assert spec.seed_data == SeedDataSpec(path=str(tmp_path / "topics.jsonl"), order="shuffle",
                                          fields=("topic",), rows=0)
    assert [c.name for c in spec.columns] == ["level", "question", "answer", "grade"]
    assert spec.columns[0] == ColumnSpec("level", "category",
                                         {"values": ["beginner", "expert"],
                                          "weights": [3.0, 1.0]})
    assert spec.columns[2].params["schema"]["required"] == ["answer"]
    assert spec.columns[3].params["temperature"] == 0.0  # a judge's default
    assert spec.model == spec.prompt_template == ""
    assert Plan.from_dict(plan_of(tmp_path).to_dict()) == plan_of(tmp_path)


@pytest.mark.parametrize("old,new,message", [
    ("{answer.answer}", "{answer.answr}",
     "client.columns[3].prompt: answer has no field 'answr' (its schema has: answer, steps)"),
    ('type = "llm-judge"', 'type = "llm-jdge"',
     "client.columns[3].type: unknown column type 'llm-jdge' (have: category, "),
    ('name = "level"\ntype = "category"', 'name = "level"',
     "client.columns[0].type: missing (have: category"),
    ('model = "judge"', 'model = "judg"',
     "client.columns[3].model: 'judg' is not a deployment alias (have: gen, judge)"),
    ("explain: {question}", "explain: {grade}",
     "client.columns[2].prompt: cycle: answer -> grade -> answer"),
    ('answer = { type = "string" }', 'answer = { type = "strin" }',
     "client.columns[2].schema.properties.answer.type: unknown type 'strin'"),
    ('answer = { type = "string" }', 'answer = { "$ref" = "#/x" }',
     "client.columns[2].schema.properties.answer.$ref: unsupported keyword"),
    ('required = ["answer"]', 'required = ["answer"], additionalProperties = false, '
     'minProperties = 1', "client.columns[2].schema.minProperties: unsupported keyword"),
    ('answer = { type = "string" }', 'answer = { type = "string", minLength = 5, '
     'maxLength = 2 }', "client.columns[2].schema.properties.answer: no document can "
     "satisfy it (minLength is above maxLength)"),
    ('options = { "1" = "correct", "0" = "wrong" }', "options = {}",
     "client.columns[3].scores[0].options: "),
    ('scores = [{ name = "correct"', 'scores = [{ name = "correct", options = { "1" = "x" }'
     ' }, { name = "correct"', "client.columns[3].scores[1].name: 'correct' is given twice"),
    ("weights = [3, 1]", "weights = [3]", "client.columns[0].weights: 1 weights for 2 values"),
    ("weights = [3, 1]", "weights = [3, 0]", "client.columns[0].weights[1]: "),
    ('name = "level"', 'name = "index"', "client.columns[0].name: 'index' is the record index"),
    ('name = "answer"', 'name = "question"',
     "client.columns[2].name: 'question' is already the name of columns[1]"),
    ('name = "level"', 'name = "_level"', "client.columns[0].name: '_level' is not a column"),
    ("seed = 1234", 'seed = 1234\nmax_tokens = 10',
     "client.max_tokens: belongs to the prompt_template form; with columns, set it on each"),
    ('prompt = "Write one', 'prompt = "\x01Write one', "Illegal character"),
    ('order = "shuffle"', 'order = "random"', "client.seed_data.order: "),
    ('on_error = "drop"', 'on_error = "skip"', "client.on_error: "),
])
def test_bad_recipes_name_the_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert error(tmp_path, old, new).startswith(message) or message in error(tmp_path, old,
                                                                             new)


SAMPLERS = """
[[client.columns]]
name = "sub"
type = "subcategory"
category = "level"
values = { beginner = ["a"], expert = ["b", "c"] }

[[client.columns]]
name = "when"
type = "datetime"
start = 2024-01-01
end = "2024-02-01T12:00:00"
unit = "hour"

[[client.columns]]
name = "n"
type = "integer"
low = 1
high = 6

[[client.columns]]
name = "x"
type = "uniform"
low = 0
high = 1.5
decimals = 2

[[client.columns]]
name = "g"
type = "gaussian"
mean = 10
stddev = 2

[[client.columns]]
name = "coin"
type = "bernoulli"
p = 0.25

[[client.columns]]
name = "id"
type = "uuid"
drop = true

[[client.columns]]
name = "visits"
type = "poisson"
mean = 3.5

[[client.columns]]
name = "hits"
type = "binomial"
n = 10
p = 0.3

[[client.columns]]
name = "label"
type = "expression"
template = "{sub}/{n}/{id}"
"""


def with_samplers(extra: str = SAMPLERS) -> str:
    return RECIPE.replace("[[deployments]]", extra + "\n[[deployments]]", 1)


def test_every_sampler_kind_validates_and_plans(tmp_path: Path) -> None:
    spec = plan_of(tmp_path, with_samplers()).client
    assert spec is not None
    params: Dict[str, Any] = {c.name: c.params for c in spec.columns}
    assert params["when"] == {"start": "2024-01-01T00:00:00", "end": "2024-02-01T12:00:00",
                              "unit": "hour"}
    assert params["sub"] == {"category": "level",
                             "values": {"beginner": ["a"], "expert": ["b", "c"]}}
    assert [c.drop for c in spec.columns if c.name == "id"] == [True]


@pytest.mark.parametrize("old,new,message", [
    ("expert = [", "experts = [", "client.columns[4].values: no values for level = 'expert'"),
    ('category = "level"', 'category = "n"', "client.columns[4].category: n is not a "
                                             "category column"),
    ('category = "level"', 'category = "nope"', "client.columns[4].category: unknown column "
                                                "nope (category columns: level)"),
    ("high = 6", "high = 0", "client.columns[6].high: 0 is below low 1"),
    ("high = 1.5", "high = 0", "client.columns[7].high: 0 is not above low 0"),
    ("stddev = 2", "stddev = 0", "client.columns[8].stddev: "),
    ("p = 0.25", "p = 1.5", "client.columns[9].p: "),
    ('end = "2024-02-01T12:00:00"', 'end = "2023-01-01"',
     "client.columns[5].end: 2023-01-01T00:00:00 is not after start"),
    ('end = "2024-02-01T12:00:00"', 'end = "February"',
     "client.columns[5].end: 'February' is not an ISO 8601 date"),
    ('template = "{sub}/{n}/{id}"', 'template = "{sub.x}"',
     "client.columns[13].template: sub is a subcategory value without fields"),
    ("mean = 3.5", "mean = 0", "client.columns[11].mean: "),
    ("\nn = 10", "\nn = -1", "client.columns[12].n: "),
    ("p = 0.3", "p = 2", "client.columns[12].p: "),
])
def test_bad_samplers_name_the_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        load(tmp_path, with_samplers(SAMPLERS.replace(old, new, 1)))
    assert message in info.value.message


def test_without_seed_data_unknown_names_fail_at_once(tmp_path: Path) -> None:
    text = RECIPE.replace('[client.seed_data]\npath = "{config_dir}/topics.jsonl"\n'
                          'order = "shuffle"\n', "")
    assert text != RECIPE
    with pytest.raises(InvalidInput) as info:
        load(tmp_path, text)
    assert info.value.message.endswith("client.columns[1].prompt: unknown column {topic} "
                                       "(have: answer, grade, index, level, question)")


def test_the_prompt_template_form_keeps_its_plan(tmp_path: Path) -> None:
    text = RECIPE[:RECIPE.index("[client]")] + (
        '[client]\nmodel = "gen"\nprompt_template = "Item {index}."\nmax_tokens = 8\n'
        + RECIPE[RECIPE.index("[[deployments]]"):])
    spec = plan_of(tmp_path, text).client
    assert spec is not None
    assert (spec.model, spec.prompt_template, spec.max_tokens, spec.columns,
            spec.seed_data, spec.concurrency) == ("gen", "Item {index}.", 8, (), None, None)
    bad = text.replace('prompt_template = "Item {index}."', 'prompt_template = "{topic}"')
    with pytest.raises(InvalidInput, match=r"client.prompt_template: unknown placeholder "
                                           r"\{topic\} \(allowed: \{index\}\)"):
        load(tmp_path, bad)
    with pytest.raises(InvalidInput, match=r"client.seed_data: needs columns"):
        load(tmp_path, text.replace("max_tokens = 8", 'max_tokens = 8\n[client.seed_data]\n'
                                                      'path = "/data/t.jsonl"'))
    with pytest.raises(InvalidInput, match=r"client.prompt_template: required"):
        load(tmp_path, text.replace('prompt_template = "Item {index}."\n', ""))


# ----------------------------------------------------------------------------- seed files


def test_a_visible_seed_file_is_checked_and_counted(tmp_path: Path) -> None:
    (tmp_path / "topics.jsonl").write_text('{"topic": "tides"}\n{"topic": "moons"}\n')
    config = load(tmp_path)
    plan = check_seed_data(plan_of(tmp_path), config.client, tmp_path / "run.toml")
    assert plan.client is not None and plan.client.seed_data is not None
    assert plan.client.seed_data.rows == 2


@pytest.mark.parametrize("content,message", [
    ("", "client.seed_data.path: {dir}/topics.jsonl: empty (no rows)"),
    ('{"topic": "a"}\n{"subject": "b"}\n',
     "client.seed_data.path: {dir}/topics.jsonl:2: no field 'topic'"),
    ('{"topic": "a"}\n{"topic": \n', "client.seed_data.path: {dir}/topics.jsonl:2: not valid"),
    ('{"topic": "a", "level": "x"}\n',
     "client.columns[0].name: 'level' is also a field of the seed data"),
])
def test_a_bad_visible_seed_file_fails_the_plan_with_file_and_line(
        tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "topics.jsonl").write_text(content)
    with pytest.raises(InvalidInput) as info:
        check_seed_data(plan_of(tmp_path), load(tmp_path).client, tmp_path / "run.toml")
    assert info.value.message.startswith(f"{tmp_path / 'run.toml'}: "
                                         + message.format(dir=tmp_path))


def test_a_seed_file_names_unknown_columns_once_its_fields_are_known(tmp_path: Path) -> None:
    (tmp_path / "topics.jsonl").write_text('{"topic": "a", "lang": "en"}\n')
    text = RECIPE.replace("about {topic}", "about {topc}")
    with pytest.raises(InvalidInput) as info:
        check_seed_data(plan_of(tmp_path, text), load(tmp_path, text).client,
                        tmp_path / "run.toml")
    assert info.value.message.endswith("client.columns[1].prompt: unknown column {topc} "
                                       "(have: answer, grade, index, lang, level, question, "
                                       "topic)")


def test_an_invisible_seed_file_is_left_to_preflight(tmp_path: Path) -> None:
    plan = plan_of(tmp_path)
    assert check_seed_data(plan, load(tmp_path).client, tmp_path / "run.toml") == plan


def test_the_plan_summary_shows_the_recipe_and_each_aliases_sizing(tmp_path: Path) -> None:
    from synthbatch.control.planning.summary import plan_summary

    (tmp_path / "topics.jsonl").write_text('{"topic": "tides"}\n')
    plan = check_seed_data(plan_of(tmp_path), load(tmp_path).client, tmp_path / "run.toml")
    text = plan_summary(plan, "0" * 64, 4)
    assert ("client: generate 4 columns, seed 1234, on_error drop, adaptive concurrency "
            "gen 128->1024, judge 128->1024") in text
    assert f"    seed data: {tmp_path}/topics.jsonl (shuffle, 1 rows)" in text
    assert "    column grade: llm-judge -> judge" in text
    fixed = plan_of(tmp_path, RECIPE.replace("seed = 1234", "seed = 1234\nconcurrency = 16"))
    assert "concurrency 16 per alias" in plan_summary(fixed, "0" * 64, 4)
    (tmp_path / "topics.jsonl").unlink()
    assert "not visible here: preflight checks it" in plan_summary(plan_of(tmp_path),
                                                                    "0" * 64, 4)
