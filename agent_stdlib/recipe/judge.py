"""The shape of a judge's answer: its options and JSON schema (shared by the generator,
which sends and checks it, and the plan-time token-budget check)."""

from __future__ import annotations

import re
from typing import Any, Dict, List

INTEGER = re.compile(r"-?[0-9]+")


def option_value(key: str) -> Any:
    """A judge option as it is scored: an integer for an integer key, else the key."""
    return int(key) if INTEGER.fullmatch(key) else key


def reasoning_chars(max_tokens: int, scores: int) -> int:
    """How long each score's reasoning may be: about three characters a token of the
    judge's ``max_tokens``, split over its scores, with room for the JSON around them, so
    that an engine decoding under the schema finishes the object instead of running out
    of tokens inside a sentence."""
    return max(16, max_tokens * 3 // (2 * max(1, scores)))


def judge_schema(scores: List[Dict[str, Any]], max_tokens: int = 256) -> Dict[str, Any]:
    """The JSON schema of a judge's answer."""
    properties = {}
    reasoning = {"type": "string", "maxLength": reasoning_chars(max_tokens, len(scores))}
    for score in scores:
        properties[score["name"]] = {
            "type": "object",
            "properties": {"reasoning": reasoning,
                           "score": {"enum": [option_value(k) for k in score["options"]]}},
            "required": ["reasoning", "score"], "additionalProperties": False}
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}
