"""The chat-completion requests of LLM columns and what their answers become.

* ``llm-text``: the answer's text;
* ``llm-code``: the code of the answer's fenced block (:mod:`codeblock`); the cell's meta
  records the block's ``language``; with ``require_block`` an answer without a fenced
  block is :class:`InvalidOutput` (retried, then ``on_error`` decides);
* ``llm-structured``: the column's JSON schema goes out as ``response_format``
  (``{"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}``, which
  vLLM, SGLang and llama.cpp's server accept) and the answer is always checked against it
  here (``agent_stdlib.recipe.schema``): engines that ignore ``response_format``, or a
  truncated answer, give :class:`InvalidOutput`, which the caller retries;
* ``llm-judge``: a rubric (each score's description and options) goes out as the system
  prompt with a schema of the scores; the answer becomes
  ``{"<score>": {"score": <option>, "reasoning": "..."}}``. An option whose key is an
  integer (``"1"``) scores as that integer. The schema bounds each reasoning's length by
  the column's ``max_tokens`` (:func:`reasoning_chars`), so that constrained decoding
  closes the object in time; the answer itself is read leniently (a bare score, a
  missing or longer reasoning are accepted).
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..recipe.budget import answer_schema
from ..recipe.judge import judge_schema, option_value, reasoning_chars
from ..recipe.kinds import default
from ..recipe.schema import validate
from .codeblock import extract

FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n(.*?)\n?```\s*$", re.S)


__all__ = ["InvalidOutput", "judge_schema", "option_value", "parse_answer", "reasoning_chars",
           "request_body"]


class InvalidOutput(Exception):
    """An answer that is not what the column asked for (retried like a failed request)."""


def rubric(scores: List[Dict[str, Any]]) -> str:
    """The judge's instructions: every score's description and options, and the format."""
    lines = ["You are a careful, impartial judge. Score the user's input on each rubric "
             "below."]
    example = {}
    for score in scores:
        lines.append(f"Rubric {score['name']!r}" + (f": {score['description']}"
                                                    if score.get("description") else ""))
        for key, meaning in score["options"].items():
            lines.append(f"  {key}: {meaning}")
        example[score["name"]] = {"reasoning": "<one or two sentences>",
                                  "score": "<one of: " + ", ".join(score["options"]) + ">"}
    lines.append("Answer with one JSON object and nothing else, like: "
                 + json.dumps(example, ensure_ascii=False))
    return "\n".join(lines)


def request_body(kind: str, name: str, params: Dict[str, Any], served: str, prompt: str,
                 system: Optional[str], shared: Sequence[str] = (),
                 history: Optional[List[Dict[str, str]]] = None) -> Dict[str, Any]:
    """The chat-completions request of one LLM cell (:func:`messages` lays it out)."""
    if kind == "llm-judge":
        system = rubric(params["scores"]) if not system else \
            f"{system}\n\n{rubric(params['scores'])}"
    body: Dict[str, Any] = {"model": served, "messages": messages(prompt, system, shared,
                                                                  history),
                            "max_tokens": params.get("max_tokens", default(kind, "max_tokens")),
                            "temperature": params.get("temperature",
                                                      default(kind, "temperature"))}
    if params.get("top_p") is not None:
        body["top_p"] = params["top_p"]
    schema = answer_schema(kind, params)
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": name, "schema": schema, "strict": True}}
    return body


def messages(prompt: str, own: Optional[str], shared: Sequence[str] = (),
             history: Optional[List[Dict[str, str]]] = None) -> List[Dict[str, str]]:
    """A request laid out so that what several requests of a record share comes first, in
    the same bytes (an engine's prefix cache reuses only a common *prefix*):

    * without ``history``: one system message of the ``shared`` texts (the recipe's
      context, then the column's), then the column's own instructions ``own`` (its system
      prompt, a judge's rubric), then the user's ``prompt``;
    * with ``history`` (a column that continues another's conversation: its messages and
      the answer): that conversation unchanged, then one user message of the column's
      ``shared`` texts, own instructions and prompt.
    """
    parts = [t for t in shared if t]
    if history is not None:
        text = "\n\n".join(parts + ([own] if own else []) + [prompt])
        return [dict(m) for m in history] + [{"role": "user", "content": text}]
    head = "\n\n".join(parts + ([own] if own else []))
    out = [{"role": "system", "content": head}] if head else []
    out.append({"role": "user", "content": prompt})
    return out


def json_answer(text: str) -> Any:
    """The JSON value of an answer: as it is, inside a Markdown fence, or the outermost
    ``{...}``/``[...]`` of a chatty answer; InvalidOutput if there is none."""
    candidates = [text.strip()]
    fenced = FENCE.match(candidates[0])
    if fenced:
        candidates.append(fenced.group(1))
    for first, last in ("{}", "[]"):
        start, end = text.find(first), text.rfind(last)
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise InvalidOutput(f"the answer is not JSON: {text[:80]!r}")


def _judged(value: Any, scores: List[Dict[str, Any]]) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidOutput("the judge's answer is not a JSON object")
    out = {}
    for score in scores:
        name = score["name"]
        given = value.get(name)
        reasoning = ""
        if isinstance(given, dict):
            reasoning = given.get("reasoning") if isinstance(given.get("reasoning"), str) \
                else ""
            given = given.get("score")
        options = {str(option_value(k)): option_value(k) for k in score["options"]}
        key = given if isinstance(given, str) else json.dumps(given)
        if key not in options:
            raise InvalidOutput(f"score {name}: {json.dumps(given)[:40]} is not one of "
                                f"{', '.join(options)}")
        out[name] = {"score": options[key], "reasoning": reasoning}
    return out


def parse_answer(kind: str, params: Dict[str, Any], data: Any) -> Tuple[Any, Dict[str, Any]]:
    """(the cell's value, its meta: finish reason, usage, served model) of a 200 answer."""
    try:
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (KeyError, IndexError, TypeError) as err:
        raise InvalidOutput("the answer has no choices[0].message.content") from err
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    meta = {"served_model": data.get("model"), "finish_reason": choice.get("finish_reason"),
            "usage": usage, "text": text}
    if not isinstance(text, str):
        raise InvalidOutput("the answer has no text")
    if kind == "llm-text":
        return text, meta
    if kind == "llm-code":
        code, language, fenced = extract(text, params.get("language"))
        if params.get("require_block") and not fenced:
            raise InvalidOutput(f"the answer has no fenced code block: {text[:80]!r}")
        meta["language"] = language
        return code, meta
    value = json_answer(text)
    if kind == "llm-judge":
        return _judged(value, params["scores"]), meta
    problem = validate(value, params["schema"])
    if problem:
        raise InvalidOutput(f"the answer does not match the schema: {problem}")
    return value, meta
