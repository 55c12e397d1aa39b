"""Column logic in a run file (issue 35): typed expressions, conditional parameters,
constraints and skip conditions plan into the columns' params, and every bad one is one
line naming ``client.columns[i].field`` (and the position in an expression)."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest

from synthbatch.control.runs.dataschema import known_schema
from tests.conftest import REPO
from tests.unit.control.config.recipes import RECIPE, plan_of, rejection

SEEDLESS = RECIPE.replace('[client.seed_data]\npath = "{config_dir}/topics.jsonl"\n'
                          'order = "shuffle"\n', "").replace("{topic}", "{level}")
LOGIC = '''
[[client.columns]]
name = "category"
type = "category"
values = ["books", "games"]

[[client.columns]]
name = "price"
type = "uniform"
low = 1
high = 100
[client.columns.conditional_params]
"category == 'books'" = { low = 5, high = 30 }

[[client.columns]]
name = "opened"
type = "datetime"
start = 2024-01-01
end = 2024-07-01
unit = "day"
conditional_params = { "price > 50" = { start = 2024-06-01 } }

[[client.columns]]
name = "start"
type = "integer"
low = 0
high = 10

[[client.columns]]
name = "end"
type = "integer"
low = 0
high = 10
constraints = ["end > start"]

[[client.columns]]
name = "n2"
type = "expression"
expr = "start * 2"
dtype = "int"

[[client.columns]]
name = "note"
type = "llm-text"
model = "gen"
prompt = "A note on {category}"
skip_when = "category == 'games'"

[[deployments]]'''
TEXT = SEEDLESS.replace("\n[[deployments]]", LOGIC, 1)


def error(tmp_path: Path, old: str, new: str) -> str:
    return rejection(tmp_path, TEXT, old, new, plan_of)


def test_column_logic_plans_into_params(tmp_path: Path) -> None:
    spec = plan_of(tmp_path, TEXT).client
    assert spec is not None
    by_name = {c.name: c.params for c in spec.columns}
    assert by_name["price"] == {"low": 1.0, "high": 100.0, "conditional_params": {
        "category == 'books'": {"low": 5.0, "high": 30.0}}}
    assert by_name["opened"]["conditional_params"] == {
        "price > 50": {"start": "2024-06-01T00:00:00"}}  # as the sampler reads it
    assert by_name["end"]["constraints"] == ["end > start"]
    assert by_name["n2"] == {"expr": "start * 2", "dtype": "int"}
    assert by_name["note"]["skip_when"] == "category == 'games'"
    assert by_name["level"] == {"values": ["beginner", "expert"], "weights": [3.0, 1.0]}


def test_a_recipe_without_logic_plans_as_before(tmp_path: Path) -> None:
    """No new key appears in a column that does not use the logic (reuse digests and the
    plan of an existing recipe stay the same)."""
    spec = plan_of(tmp_path, SEEDLESS).client
    assert spec is not None
    for column in spec.columns:
        assert not {"skip_when", "conditional_params", "constraints", "expr",
                    "dtype"} & set(column.params)


@pytest.mark.parametrize("old,new,message", [
    ('expr = "start * 2"', 'expr = "start *"',
     "client.columns[9].expr: position 8: expected a value, found the end"),
    ('expr = "start * 2"', 'expr = "star * 2"',
     "client.columns[9].expr: position 1: unknown column star (have: answer, category, "),
    ('expr = "start * 2"', "expr = \"start + 'a'\"",
     "client.columns[9].expr: position 7: cannot apply '+' to an int and a text"),
    ('expr = "start * 2"', 'expr = "[start]"',
     "client.columns[9].expr: position 1: it gives a list, which is never an int (dtype int)"),
    ('expr = "start * 2"', 'expr = "upper(start)"',
     "client.columns[9].expr: position 7: upper() does not take an int"),
    ('dtype = "int"', 'dtype = "integer"',
     "client.columns[9].dtype: Input should be 'int', 'float', 'bool', 'text' or 'json'"),
    ('expr = "start * 2"', 'template = "{start}"\nexpr = "start"',
     "client.columns[9].expr: give either template or expr"),
    ('expr = "start * 2"', 'expr = "n2 + 1"', "client.columns[9].expr: cycle: n2 -> n2"),
    ('"category == \'books\'" = { low = 5, high = 30 }',
     '"category == \'books\'" = { low = 50, high = 30 }',
     "client.columns[5].conditional_params.\"category == 'books'\".high: 30 is not above "
     "low 50"),
    ('"category == \'books\'" = { low = 5, high = 30 }',
     '"category == \'books\'" = { lo = 5 }',
     "client.columns[5].conditional_params.\"category == 'books'\".lo: not a parameter of "
     "a uniform column (have: decimals, high, low)"),
    ('"category == \'books\'" = { low = 5, high = 30 }',
     '"category = \'books\'" = { low = 5 }',
     "client.columns[5].conditional_params.\"category = 'books'\": position 10: "
     "unexpected '='"),
    ('"category == \'books\'" = { low = 5, high = 30 }',
     '"categry == \'books\'" = { low = 5 }',
     "client.columns[5].conditional_params.\"categry == 'books'\": position 1: unknown "
     "column categry"),
    ('"category == \'books\'" = { low = 5, high = 30 }',
     '"category > 3" = { low = 5 }',
     "client.columns[5].conditional_params.\"category > 3\": position 10: cannot order a "
     "text and an int with '>'"),
    ('{ "price > 50" = { start = 2024-06-01 } }', '{ "price > 50" = { start = 2024-08-01 } }',
     "client.columns[6].conditional_params.\"price > 50\".end: 2024-07-01T00:00:00 is not "
     "after start 2024-08-01T00:00:00"),
    ('constraints = ["end > start"]', 'constraints = ["end > 20"]',
     "client.columns[8].constraints[0]: no value of end can meet 'end > 20' (it draws from "
     "11 value(s))"),
    ('constraints = ["end > start"]', 'constraints = ["end > startt"]',
     "client.columns[8].constraints[0]: position 7: unknown column startt"),
    ('constraints = ["end > start"]', 'constraints = ["end >"]',
     "client.columns[8].constraints[0]: position 6: expected a value, found the end"),
    ('constraints = ["end > start"]', 'constraints = []', "client.columns[8].constraints: "),
    ('skip_when = "category == \'games\'"', 'skip_when = "category == "',
     "client.columns[10].skip_when: position 13: expected a value, found the end"),
    ('skip_when = "category == \'games\'"', 'skip_when = "note == 1"',
     "client.columns[10].skip_when: cycle: note -> note"),
    ('skip_when = "category == \'games\'"', 'conditional_params = { "true" = { max_tokens = 9 } }',
     "client.columns[10].conditional_params: only a sampler column has conditional params "
     "(this is llm-text)"),
    ('skip_when = "category == \'games\'"', 'constraints = ["len(note) > 3"]',
     "client.columns[10].constraints: only a sampler column has constraints (this is "
     "llm-text)"),
])
def test_bad_column_logic_names_the_field(tmp_path: Path, old: str, new: str,
                                          message: str) -> None:
    assert error(tmp_path, old, new).startswith(message)


def test_the_merged_schema_takes_the_declared_and_conditional_types(tmp_path: Path) -> None:
    """A typed expression is an int column in Parquet, not text (a shard of ints would
    otherwise conflict with the plan's schema); a category's conditional values count."""
    text = TEXT.replace('values = ["books", "games"]', 'values = [1, 2]\n'
                        'conditional_params = { "start > 5" = { values = [2.5] } }')
    text = text.replace("category == 'books'", "category == 1").replace(
        "category == 'games'", "category == 2")
    schema = known_schema(plan_of(tmp_path, text))
    assert schema is not None
    assert schema.field("n2").type == pa.int64()
    assert schema.field("category").type == pa.float64()
    assert schema.field("level").type == pa.string()
    assert known_schema(plan_of(tmp_path, TEXT.replace('dtype = "int"', 'dtype = "json"'))
                        ).field("n2").type == pa.null()  # inferred from the data


def test_the_documented_example_plans(tmp_path: Path) -> None:
    """docs/generator.md's "Column logic" example is a valid recipe as written."""
    doc = (REPO / "docs" / "generator.md").read_text(encoding="utf-8")
    section = doc.split("## Column logic", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    spec = plan_of(tmp_path, SEEDLESS.replace("\n[[deployments]]",
                                              "\n" + example + "\n[[deployments]]", 1)).client
    assert spec is not None
    assert [c.name for c in spec.columns][-6:] == ["category", "price", "start", "end",
                                                   "review", "label"]


def test_the_documented_column_examples_plan_as_written(tmp_path: Path) -> None:
    """docs/generator.md's examples of the samplers (timedelta, mixture, identity...),
    llm-code and validation columns plan together as written (plus the two columns they
    read: a task and a query)."""
    doc = (REPO / "docs" / "generator.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", doc, re.S)
              if b.startswith("[[client.columns]]")]
    wanted = ("timedelta", "mixture", "identity", "llm-code", "validation", "datetime")
    examples = [b for b in blocks if any(f'type = "{k}"' in b for k in wanted)]
    assert len(examples) == 4, [b[:60] for b in blocks]
    readers = ('\n[[client.columns]]\nname = "task"\ntype = "category"\n'
               'values = ["adds two numbers"]\n\n[[client.columns]]\nname = "query"\n'
               'type = "llm-text"\nmodel = "gen"\nprompt = "SQL for {task}"\n')
    columns = readers + "\n" + "\n".join(examples)
    spec = plan_of(tmp_path, SEEDLESS.replace("\n[[deployments]]",
                                              columns + "\n[[deployments]]", 1)).client
    assert spec is not None
    kinds = {c.name: c.type for c in spec.columns}
    assert {kinds[n] for n in ("ships_on", "wait_minutes", "customer", "solution",
                               "solution_ok", "query_ok")} == {
        "timedelta", "mixture", "identity", "llm-code", "validation"}
