"""The digest rules of column reuse (issue 31): what changes a digest and what does not."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from synthbatch.agent_stdlib.recipe.columns import Node, analyze
from synthbatch.agent_stdlib.recipe.reuse import compare, definition_digests, request_digest

MODELS = {"m": {"engine": "vllm", "model": "/models/a", "served_name": "a",
                "image_digest": "sha256:00", "args": ["--dtype", "bfloat16"]}}


def _cols(prompt_b: str = "Answer {a}", order: Optional[List[int]] = None,
          extra: Optional[Dict[str, Any]] = None) -> List[Node]:
    nodes = [Node("topic", "category", {"values": ["x", "y"]}),
             Node("a", "llm-text", {"model": "m", "prompt": "Ask about {topic}"}),
             Node("b", "llm-text", {"model": "m", "prompt": prompt_b, **(extra or {})}),
             Node("c", "llm-text", {"model": "m", "prompt": "Judge {b}"}),
             Node("d", "llm-text", {"model": "m", "prompt": "Other {topic}"})]
    return [nodes[i] for i in order] if order else nodes


def _digests(nodes: List[Node], models: Any = MODELS) -> Dict[str, str]:
    return definition_digests(nodes, analyze(nodes).inputs, models)


def test_same_definition_same_digest() -> None:
    assert _digests(_cols()) == _digests(_cols())


def test_whitespace_in_a_prompt_changes_the_column_and_its_dependants_only() -> None:
    old, new = _digests(_cols()), _digests(_cols("Answer  {a}"))
    assert [n for n in old if old[n] != new[n]] == ["b", "c"]


def test_position_in_the_file_does_not_change_a_digest() -> None:
    assert _digests(_cols()) == _digests(_cols(order=[4, 3, 2, 1, 0]))


def test_sampling_parameter_changes_the_digest() -> None:
    old, new = _digests(_cols()), _digests(_cols(extra={"temperature": 0.7}))
    assert old["b"] != new["b"] and old["a"] == new["a"]


def test_upstream_sampler_change_reaches_every_llm_column_using_it() -> None:
    nodes = _cols()
    nodes[0] = Node("topic", "category", {"values": ["x", "z"]})
    old, new = _digests(_cols()), _digests(nodes)
    assert sorted(n for n in old if old[n] != new[n]) == ["a", "b", "c", "d", "topic"]


def test_model_identity_changes_llm_columns_not_samplers() -> None:
    other = {"m": {**MODELS["m"], "image_digest": "sha256:11"}}
    old, new = _digests(_cols()), _digests(_cols(), other)
    assert sorted(n for n in old if old[n] != new[n]) == ["a", "b", "c", "d"]


def test_request_digest_rules() -> None:
    body = {"model": "a", "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.0, "max_tokens": 64}
    same = request_digest(MODELS["m"], dict(reversed(list(body.items()))))
    assert request_digest(MODELS["m"], body) == same
    assert request_digest(MODELS["m"], {**body, "stream": True}) == same
    from synthbatch.agent_stdlib.recipe.reuse import DIGEST_VERSION, _digest, canonical_json

    # the digest is that of the whole request's canonical JSON (runs made before agree)
    assert same == _digest({"v": DIGEST_VERSION, "model": MODELS["m"], "body": body})
    assert request_digest({}, body, canonical_json(MODELS["m"])) == same
    assert request_digest(MODELS["m"], {**body, "messages": [
        {"role": "user", "content": "hi "}]}) != same
    assert request_digest(MODELS["m"], {**body, "seed": 1}) != same
    assert request_digest(MODELS["m"], {**body, "response_format": {"type": "json_object"}}) != same
    assert request_digest({**MODELS["m"], "served_name": "b"}, body) != same


def test_compare_says_which_llm_columns_are_reused() -> None:
    nodes = _cols("Answer  {a}")
    result = compare(nodes, _digests(nodes), [_digests(_cols())])
    assert (result.reused, result.regenerated) == (["a", "d"], ["b", "c"])
    assert result.summary() == "reuse: 2 of 4 LLM columns (a, d); regenerate: b, c"
