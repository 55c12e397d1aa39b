"""The plan-time token-budget warning (issue 35): a structured or judge column whose
``max_tokens`` cannot hold its shortest valid answer is named by ``plan``."""

from __future__ import annotations

import json
from pathlib import Path

from synthbatch.agent_stdlib.recipe.budget import budget_problem, estimate_tokens, minimal_answer
from synthbatch.agent_stdlib.recipe.schema import validate
from tests.conftest import REPO
from tests.fakes import plan_json

QA_FAKE = REPO / "examples" / "qa-fake.toml"
JUDGE = {"scores": [{"name": "correct", "options": {"1": "correct", "0": "wrong"}}]}


def test_the_minimal_answer_is_valid_and_short() -> None:
    schema = {"type": "object", "required": ["a", "n", "tags", "kind"],
              "properties": {"a": {"type": "string", "minLength": 2},
                             "n": {"type": "integer", "minimum": 3},
                             "tags": {"type": "array", "items": {"type": "string"},
                                      "minItems": 1},
                             "kind": {"enum": ["long-name", "s"]},
                             "extra": {"type": "string"}}}
    answer = minimal_answer(schema)
    assert answer == {"a": "xx", "n": 3, "tags": [""], "kind": "s"}
    assert validate(answer, schema) is None
    assert estimate_tokens('{"answer":""}') == 6


def test_a_judge_budget_below_its_answer_warns_and_a_roomy_one_does_not() -> None:
    message, need = budget_problem("llm-judge", {**JUDGE, "max_tokens": 8})
    assert message.startswith("max_tokens 8 cannot hold a valid answer: its shortest valid "
                              'answer {"correct":{"reasoning":"","score":1}} is about ')
    assert need > 8
    assert "almost no room" in budget_problem("llm-judge", {**JUDGE, "max_tokens": need})[0]
    assert budget_problem("llm-judge", {**JUDGE, "max_tokens": 256}) is None
    assert budget_problem("llm-text", {"max_tokens": 1}) is None


def test_plan_warns_naming_the_column(tmp_path: Path, profile_file: Path) -> None:
    text = QA_FAKE.read_text().replace("{config_dir}/..", str(REPO)).replace(
        "{config_dir}/data", str(REPO / "examples" / "data"))
    text = text.replace('prompt = "Question: {question}\\nAnswer: {answer.answer}"\n',
                        'prompt = "Question: {question}\\nAnswer: {answer.answer}"\n'
                        'max_tokens = 8\n')
    path = tmp_path / "run.toml"
    path.write_text(text)
    data = plan_json(path, profile_file)
    assert data["code"] == 0, data
    warned = [c for c in data["checks"] if c["level"] == "warning"]
    assert [c["field"] for c in warned] == [f"{path}: client.columns[4].max_tokens (grade)"]
    assert "cannot hold a valid answer" in warned[0]["message"]
    json.dumps(data)
