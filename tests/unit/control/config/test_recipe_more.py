"""The timedelta, mixture, identity, llm-code and validation columns in a run file: what
they plan into, and one line naming ``client.columns[i].field`` for each bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.control.errors import InvalidInput
from tests.unit.control.config.recipes import RECIPE, load, plan_of

MORE = """
[[client.columns]]
name = "start"
type = "datetime"
start = "2024-01-01"
end = "2024-02-01"
unit = "day"

[[client.columns]]
name = "end"
type = "timedelta"
reference = "start"
dt_min = 1
dt_max = 30
unit = "D"

[[client.columns]]
name = "score"
type = "mixture"
components = [{ type = "gaussian", mean = 0, stddev = 1, weight = 2 }, { type = "integer", low = 5, high = 9 }]

[[client.columns]]
name = "customer"
type = "identity"
locale = "fr_FR"
age_range = [20, 40]

[[client.columns]]
name = "code"
type = "llm-code"
model = "gen"
prompt = "Write Python for {question}; greet {customer.first_name}."
language = "python"
require_block = true

[[client.columns]]
name = "code_ok"
type = "validation"
validator = "python"
target = "code"
run = true
timeout_s = 2
on_invalid = "error"

[[client.columns]]
name = "shape"
type = "validation"
validator = "json_schema"
target = "answer"
schema = { type = "object", required = ["answer"] }

[[client.columns]]
name = "label"
type = "expression"
template = "{code_ok.valid}/{shape.errors}/{end}"
"""  # noqa: E501 (inline tables)


def with_more(extra: str = MORE) -> str:
    return RECIPE.replace("[[deployments]]", extra + "\n[[deployments]]", 1)


def error(tmp_path: Path, old: str, new: str) -> str:
    text = with_more()
    assert old in text, old
    with pytest.raises(InvalidInput) as info:
        load(tmp_path, text.replace(old, new, 1))
    message = info.value.message
    assert "\n" not in message and message.startswith(f"{tmp_path / 'run.toml'}: ")
    return message.split(": ", 1)[1]


def test_the_new_kinds_plan_into_columns(tmp_path: Path) -> None:
    spec = plan_of(tmp_path, with_more()).client
    assert spec is not None
    params: Dict[str, Any] = {c.name: c.params for c in spec.columns}
    assert params["end"] == {"reference": "start", "dt_min": 1, "dt_max": 30, "unit": "day"}
    assert params["score"]["components"] == [
        {"type": "gaussian", "weight": 2.0, "mean": 0.0, "stddev": 1.0},
        {"type": "integer", "weight": 1.0, "low": 5, "high": 9}]
    assert params["customer"] == {"locale": "fr_FR", "age_range": [20, 40]}
    assert params["code"]["language"] == "python" and params["code"]["require_block"]
    assert params["code_ok"] == {"validator": "python", "target": "code", "run": True,
                                 "timeout_s": 2.0, "on_invalid": "error"}
    assert params["shape"] == {"validator": "json_schema", "target": "answer",
                               "on_invalid": "keep",
                               "schema": {"type": "object", "required": ["answer"]}}


C = "client.columns"


@pytest.mark.parametrize("old,new,message", [
    ('reference = "start"', 'reference = "end"', f"{C}[5].reference: cycle: end -> end"),
    ("dt_max = 30", "dt_max = 1", f"{C}[5].dt_max: 1 is not above dt_min 1"),
    ('unit = "D"', 'unit = "week"', f"{C}[5].unit: "),
    ('type = "integer", low = 5', 'type = "subcategory", low = 5',
     f"{C}[6].components[1].type: 'subcategory' cannot be mixed"),
    ("low = 5, high = 9", "low = 9, high = 5", f"{C}[6].components[1].high: 5 is below low 9"),
    ("stddev = 1, weight = 2", "stddev = 1, weight = 0",
     f"{C}[6].components[0].weight: expected a positive number"),
    ('locale = "fr_FR"', 'locale = "xx_XX"', f"{C}[7].locale: "),
    ("age_range = [20, 40]", "age_range = [40, 20]", f"{C}[7].age_range: 40 is above 20"),
    ("{customer.first_name}", "{customer.nickname}",
     f"{C}[8].prompt: customer has no field 'nickname' (have: first_name, last_name"),
    ('model = "gen"\nprompt = "Write Python', 'model = "gem"\nprompt = "Write Python',
     f"{C}[8].model: 'gem' is not a deployment alias"),
    ('target = "code"', 'target = "label"', f"{C}[9].target: cycle: code_ok -> label -> "
     "code_ok"),
    ("run = true", 'pattern = "x"', f"{C}[9].pattern: belongs to validator 'regex', not "
     "'python'"),
    ('validator = "json_schema"', 'validator = "xml"', f"{C}[10].validator: "),
    ('schema = { type = "object", required = ["answer"] }', "",
     f"{C}[10].schema: a json_schema validator needs one"),
    ('schema = { type = "object", required = ["answer"] }',
     'schema = { type = "object", minProperties = 1 }',
     f"{C}[10].schema.minProperties: unsupported keyword"),
    ("{code_ok.valid}", "{code_ok.verdict}", f"{C}[11].template: code_ok has no field "
     "'verdict' (have: valid, errors)"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path: Path, old: str, new: str,
                                                message: str) -> None:
    assert error(tmp_path, old, new).startswith(message)


def test_a_regex_validator_needs_a_pattern_that_compiles(tmp_path: Path) -> None:
    regex = MORE + '\n[[client.columns]]\nname = "r"\ntype = "validation"\n' \
        'validator = "regex"\ntarget = "question"\npattern = "(unclosed"\n'
    with pytest.raises(InvalidInput) as info:
        load(tmp_path, with_more(regex))
    assert info.value.message.split(": ", 1)[1].startswith(
        f"{C}[12].pattern: not a regular expression")
