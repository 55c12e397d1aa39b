"""Plain data -> TOML text that reads back as the same data (``profile show``).

Scalars first, then one ``[table]`` per nested object and ``[[table]]`` per object in a
list, as a person would write them. TOML has no null: a field that is ``None`` (not set)
becomes a comment line, so the text re-parses to the same values once defaults are filled
in.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def key(name: str) -> str:
    """A TOML key: bare when it can be, else a quoted string."""
    return name if BARE_KEY.fullmatch(name) else json.dumps(name)


def value(item: Any) -> str:
    """One TOML value (strings as JSON strings: every JSON escape is a TOML escape)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, float):
        if math.isnan(item):
            return "nan"
        if math.isinf(item):
            return "inf" if item > 0 else "-inf"
        return repr(item)
    if isinstance(item, str):
        return json.dumps(item)
    if isinstance(item, (list, tuple)):
        return "[" + ", ".join(value(v) for v in item) + "]"
    if isinstance(item, dict):
        return "{ " + ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items()
                                if v is not None) + " }"
    raise TypeError(f"no TOML form for {type(item).__name__}")


def _is_tables(item: Any) -> bool:
    return isinstance(item, (list, tuple)) and bool(item) and all(isinstance(v, dict)
                                                                  for v in item)


def _table(data: Dict[str, Any], path: List[str], lines: List[str]) -> None:
    nested = []
    for name, item in data.items():
        if item is None:
            lines.append(f"# {key(name)} is not set")
        elif isinstance(item, dict) or _is_tables(item):
            nested.append((name, item))
        else:
            lines.append(f"{key(name)} = {value(item)}")
    for name, item in nested:
        where = path + [key(name)]
        if isinstance(item, dict):
            lines += ["", f"[{'.'.join(where)}]"]
            _table(item, where, lines)
        else:
            for entry in item:
                lines += ["", f"[[{'.'.join(where)}]]"]
                _table(entry, where, lines)


def toml_text(data: Dict[str, Any]) -> str:
    """``data`` as a TOML document (ends with a newline)."""
    lines: List[str] = []
    _table(data, [], lines)
    return "\n".join(lines) + "\n"
