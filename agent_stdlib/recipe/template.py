"""Templates: text with ``{column}`` and ``{column.field}`` placeholders.

``{name}`` is replaced by the value of a column (or a seed-data field, or ``{index}``,
the record index); ``{name.a.b}`` walks into an object value (a structured column, a
judge's scores, a JSON seed field) by key, and into a list by position (``{steps.0}``).
``{{ name }}`` as NeMo Data Designer (Jinja) writes it is the same placeholder as
``{name}`` (whitespace inside allowed); any other ``{{`` and ``}}`` are literal braces, so a
JSON example in a prompt (``{{"a": 1}}``) keeps its braces. A string value is inserted as
it is, ``null`` and a missing field as nothing, a number or boolean in JSON spelling
(``3``, ``2.5``, ``true``) and an object or list as compact JSON.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, List, Sequence, Tuple, Union

from ..errors import AgentError

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
PLACEHOLDER = re.compile(rf"({NAME})((?:\.[A-Za-z0-9_]+)*)")
DD_PLACEHOLDER = re.compile(rf"\{{\{{\s*({NAME}(?:\.[A-Za-z0-9_]+)*)\s*\}}\}}")
Ref = Tuple[str, Tuple[str, ...]]  # (column name, field path)
Part = Union[str, Ref]


class TemplateError(AgentError, ValueError):
    """A template that does not parse; the message shows the placeholder."""


def parse(text: str) -> Tuple[Part, ...]:
    """The literal pieces and placeholders of ``text``, in order; TemplateError if bad."""
    parts: List[Part] = []
    literal: List[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        dd = DD_PLACEHOLDER.match(text, i) if char == "{" else None
        if dd:
            if literal:
                parts.append("".join(literal))
                literal = []
            match = PLACEHOLDER.fullmatch(dd.group(1))
            assert match is not None
            parts.append((match.group(1), tuple(p for p in match.group(2).split(".") if p)))
            i = dd.end()
        elif char in "{}" and text.startswith(char * 2, i):
            literal.append(char)
            i += 2
        elif char == "}":
            raise TemplateError("a lone '}' (write '}}' for a literal brace)")
        elif char == "{":
            end = text.find("}", i + 1)
            inner = text[i + 1:end] if end >= 0 else text[i + 1:]
            match = PLACEHOLDER.fullmatch(inner)
            if end < 0 or not match:
                shown = text[i:end + 1] if end >= 0 else text[i:i + 40]
                raise TemplateError(f"bad placeholder {shown} (write {{name}} or "
                                    f"{{name.field}}; '{{{{' and '}}}}' for literal braces)")
            if literal:
                parts.append("".join(literal))
                literal = []
            path = tuple(p for p in match.group(2).split(".") if p)
            parts.append((match.group(1), path))
            i = end + 1
        else:
            literal.append(char)
            i += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def references(text: str) -> List[Ref]:
    """Every placeholder of ``text`` as (name, field path), in order of appearance."""
    return [p for p in parse(text) if not isinstance(p, str)]


def names(text: str) -> List[str]:
    """The distinct column names ``text`` refers to, in order of first appearance."""
    seen: List[str] = []
    for name, _ in references(text):
        if name not in seen:
            seen.append(name)
    return seen


def show(value: Any) -> str:
    """A value as a template inserts it (see the module docstring)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def lookup(value: Any, path: Sequence[str]) -> Any:
    """Walk ``path`` into ``value``; None where a key or position is missing."""
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return value


def render(parts: Sequence[Part], value_of: Callable[[str], Any]) -> str:
    """The text of parsed ``parts`` with ``value_of(name)`` filled in."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        else:
            out.append(show(lookup(value_of(part[0]), part[1])))
    return "".join(out)
