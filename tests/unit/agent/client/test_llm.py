"""LLM cells: request bodies per column kind, and what answers become."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.client.llm import (
    InvalidOutput,
    json_answer,
    judge_schema,
    parse_answer,
    request_body,
)
from synthbatch.agent_stdlib.recipe.schema import check

SCORES = [{"name": "correct", "description": "Is it right?",
           "options": {"1": "correct", "0": "wrong"}},
          {"name": "tone", "options": {"calm": "calm", "rude": "rude"}}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
          "required": ["answer"]}


def answer(content: Any, **extra: Any) -> Dict[str, Any]:
    return {"model": "served", "choices": [{"message": {"content": content},
                                            "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4}, **extra}


def test_text_body_and_answer() -> None:
    body = request_body("llm-text", "q", {"max_tokens": 9, "temperature": 0.2, "top_p": 0.9},
                        "served", "Hi", "Be brief")
    assert body == {"model": "served", "max_tokens": 9, "temperature": 0.2, "top_p": 0.9,
                    "messages": [{"role": "system", "content": "Be brief"},
                                 {"role": "user", "content": "Hi"}]}
    value, meta = parse_answer("llm-text", {}, answer("text"))
    assert value == "text" and meta == {"served_model": "served", "finish_reason": "stop",
                                        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
                                        "text": "text"}


def test_structured_body_sends_the_schema_as_response_format() -> None:
    body = request_body("llm-structured", "answer", {"schema": SCHEMA}, "m", "Q?", None)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": SCHEMA, "strict": True}}
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert parse_answer("llm-structured", {"schema": SCHEMA},
                        answer('{"answer": "4"}'))[0] == {"answer": "4"}


@pytest.mark.parametrize("text", ['{"answer": "4"}', '```json\n{"answer": "4"}\n```',
                                  'Sure! Here it is: {"answer": "4"} Hope it helps.'])
def test_json_answers_are_found_in_fences_and_chatter(text: str) -> None:
    assert json_answer(text) == {"answer": "4"}


@pytest.mark.parametrize("content,message", [
    ('{"answer": 4}', "does not match the schema: $.answer: expected string"),
    ('{"answer": "4"', "the answer is not JSON"),
    (None, "the answer has no text"),
])
def test_bad_structured_answers_are_invalid_output(content: Any, message: str) -> None:
    with pytest.raises(InvalidOutput, match=message.replace("$", r"\$")):
        parse_answer("llm-structured", {"schema": SCHEMA}, answer(content))
    with pytest.raises(InvalidOutput, match="no choices"):
        parse_answer("llm-text", {}, {"choices": []})


def test_judge_sends_a_rubric_and_a_satisfiable_schema() -> None:
    body = request_body("llm-judge", "grade", {"scores": SCORES}, "m", "Q: x", "Be fair.")
    system = body["messages"][0]["content"]
    assert system.startswith("Be fair.\n\n") and "Rubric 'correct': Is it right?" in system
    assert "  1: correct" in system and "  rude: rude" in system
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema == judge_schema(SCORES)
    check(schema)
    reasoning = schema["properties"]["tone"]["properties"]["reasoning"]
    assert reasoning == {"type": "string", "maxLength": 256 * 3 // 4}  # 2 scores, 256 tokens
    small = request_body("llm-judge", "g", {"scores": SCORES[:1], "max_tokens": 64}, "m",
                         "x", None)["response_format"]["json_schema"]["schema"]
    assert small["properties"]["correct"]["properties"]["reasoning"]["maxLength"] == 96
    assert schema["properties"]["correct"]["properties"]["score"]["enum"] == [1, 0]


@pytest.mark.parametrize("content,value", [
    ({"correct": {"score": 1, "reasoning": "ok"}, "tone": {"score": "calm"}},
     {"correct": {"score": 1, "reasoning": "ok"}, "tone": {"score": "calm", "reasoning": ""}}),
    ({"correct": "0", "tone": "rude"},  # bare scores, an integer option given as text
     {"correct": {"score": 0, "reasoning": ""}, "tone": {"score": "rude", "reasoning": ""}}),
])
def test_judge_answers_become_scores(content: Any, value: Any) -> None:
    assert parse_answer("llm-judge", {"scores": SCORES},
                        answer(json.dumps(content)))[0] == value


@pytest.mark.parametrize("content", [{"correct": {"score": 2}, "tone": "calm"},
                                     {"tone": "calm"}, ["x"]])
def test_judge_answers_outside_the_options_are_invalid(content: Any) -> None:
    with pytest.raises(InvalidOutput):
        parse_answer("llm-judge", {"scores": SCORES}, answer(json.dumps(content)))
