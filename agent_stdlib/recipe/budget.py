"""Can a column's ``max_tokens`` hold its shortest valid answer? (the plan-time warning)

:func:`minimal_answer` builds the shortest JSON document a schema (of the subset in
:mod:`agent_stdlib.recipe.schema`) accepts: every required property, no optional one,
empty strings (or ``minLength`` characters), ``minItems`` items, the first ``enum`` value,
0 (or the lower bound) for numbers. :func:`estimate_tokens` counts it the way BPE
tokenizers split JSON: one token per four characters of a word, per two of a run of
punctuation. For a judge the answer is the rubric's schema with each reasoning empty, so a
``max_tokens`` below the estimate can never give a valid answer, and one below
:data:`ROOM_FACTOR` times it leaves almost no room for the reasoning the rubric asks for.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from .judge import judge_schema
from .kinds import default

ROOM_FACTOR = 2
WORDS = re.compile(r"[A-Za-z0-9_]+|\s+|[^A-Za-z0-9_\s]+")


def minimal_answer(schema: Dict[str, Any]) -> Any:
    """The shortest document ``schema`` accepts (best effort within the subset)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return min(schema["enum"], key=lambda v: len(json.dumps(v)))
    if schema.get("anyOf"):
        return min((minimal_answer(s) for s in schema["anyOf"]),
                   key=lambda v: len(json.dumps(v)))
    kinds = schema.get("type", "object" if "properties" in schema else "null")
    kind = kinds if isinstance(kinds, str) else _shortest_kind(kinds)
    if kind == "object":
        props = schema.get("properties", {})
        return {name: minimal_answer(props.get(name, {})) for name in schema.get("required",
                                                                                 [])}
    if kind == "array":
        return [minimal_answer(schema.get("items", {}))] * int(schema.get("minItems", 0))
    if kind == "string":
        return "x" * int(schema.get("minLength", 0))
    if kind in ("number", "integer"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return 0 if low is None or low <= 0 else int(math.ceil(low)) + (
            1 if "exclusiveMinimum" in schema and low == math.ceil(low) else 0)
    return {"boolean": False, "null": None}.get(kind)


def _shortest_kind(kinds: List[str]) -> str:
    for kind in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if kind in kinds:
            return kind
    return "null"


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` as a BPE tokenizer splits JSON: one per four characters of a
    word, one per two characters of a run of punctuation (``":"``), one a run of spaces."""
    return sum(math.ceil(len(p) / 4) if p[0].isalnum() or p[0] == "_" else
               1 if p[0].isspace() else math.ceil(len(p) / 2) for p in WORDS.findall(text))


def answer_schema(kind: str, params: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The schema a structured or judge column's answer must satisfy (None otherwise)."""
    if kind == "llm-structured" and isinstance(params.get("schema"), dict):
        return dict(params["schema"])
    if kind == "llm-judge" and params.get("scores"):
        return judge_schema(params["scores"],
                            int(params.get("max_tokens", default(kind, "max_tokens"))))
    return None


def budget_problem(kind: str, params: Dict[str, Any]) -> Optional[Tuple[str, int]]:
    """``(message, tokens)`` when the column's ``max_tokens`` cannot hold its minimal
    valid answer (or leaves a judge no room to reason), else None."""
    schema = answer_schema(kind, params)
    if schema is None:
        return None
    text = json.dumps(minimal_answer(schema), separators=(",", ":"))
    need = estimate_tokens(text)
    have = int(params.get("max_tokens", default(kind, "max_tokens")))
    how = (f"its shortest valid answer {text[:60]}{'...' if len(text) > 60 else ''} is "
           f"about {need} tokens (one per 4 characters of a word, per 2 of punctuation)")
    if have < need:
        return f"max_tokens {have} cannot hold a valid answer: {how}", need
    if kind == "llm-judge" and have < ROOM_FACTOR * need:
        return (f"max_tokens {have} leaves the judge almost no room for its reasoning: "
                f"{how}; give at least {ROOM_FACTOR * need}"), need
    return None
