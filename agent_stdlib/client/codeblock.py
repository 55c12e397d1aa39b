"""The code of an ``llm-code`` answer: the first fenced block of the declared language,
else the first fenced block, else the whole answer stripped."""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

FENCED = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([^\s`]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$",
                    re.S | re.M)
ALIASES = {"py": "python", "python3": "python", "js": "javascript", "ts": "typescript",
           "sh": "bash", "shell": "bash", "postgresql": "sql", "sqlite": "sql"}


def _name(tag: str) -> str:
    tag = tag.lower()
    return ALIASES.get(tag, tag)


def blocks(text: str) -> List[Tuple[str, str]]:
    """Every fenced block of ``text`` as (language tag, code), in order ("" untagged)."""
    return [(_name(m.group(2)), m.group(3).rstrip("\n")) for m in FENCED.finditer(text)]


def extract(text: str, language: Optional[str] = None) -> Tuple[str, Optional[str], bool]:
    """(code, the language of its block or None, whether it came from a fenced block)."""
    found = blocks(text)
    wanted = _name(language) if language else None
    for tag, code in found:
        if wanted and tag == wanted:
            return code, tag, True
    if found:
        tag, code = found[0]
        return code, tag or None, True
    return text.strip(), None, False
