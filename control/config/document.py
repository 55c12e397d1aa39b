"""Reading authored files into plain data: TOML or JSON, strictly (no pydantic here).

Duplicate keys, files over 1 MiB, non-UTF-8 bytes, syntax errors and values nested
deeper than ``MAX_DEPTH`` are InvalidInput naming the file (and the key, for a duplicate or
a nesting too deep). Every authored file (run, profile, benchmark sweep, a sweep's base
run) is read here, so these rules hold for all of them. ``control.config.loader`` validates the
data with pydantic; the run-reading commands use it through ``control.config.workspace``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from synthbatch.control.config.rules import key_text
from synthbatch.control.errors import InvalidInput
from synthbatch.control.secrets import redact

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

MAX_BYTES = 1 << 20
# Authored files nest a few levels (client.columns[12].scores[0].name is 5); the parsers
# and validators recurse, so a deeper document is refused before anything walks it.
MAX_DEPTH = 32


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")


def _table_of(lines: List[str], number: int) -> str:
    """The field path prefix of line ``number``: ``shards.`` or ``deployments[1].``
    (one pass over the lines above it)."""
    prefix = ""
    counts: Dict[str, int] = {}
    for line in lines[:number - 1]:
        match = HEADER.match(line)
        if match:
            name = match.group(2).replace('"', "").replace("'", "")
            if match.group(1) == "[[":
                counts[name] = counts.get(name, 0) + 1
                prefix = f"{name}[{counts[name] - 1}]."
            else:
                prefix = name + "."
    return prefix


def _describe_parse_error(message: str, text: str) -> str:
    """Name the key of a TOML 'Cannot overwrite a value' error (a duplicate key)."""
    match = re.search(r"Cannot overwrite a value \(at line (\d+)", message)
    if match:
        lines = text.splitlines()
        number = int(match.group(1))
        if 0 < number <= len(lines) and "=" in lines[number - 1]:
            key = lines[number - 1].split("=", 1)[0].strip()
            return f"{_table_of(lines, number)}{key_text(key)}: duplicate key (at line {number})"
    return " ".join(message.split())


def too_deep(data: Any, limit: int = MAX_DEPTH) -> Optional[str]:
    """The top-level key under which ``data`` nests deeper than ``limit`` tables/arrays
    (``""`` for the root), or None; iterative, so any depth is safe to ask about."""
    stack: List[Tuple[Any, int, str]] = [(data, 0, "")]
    while stack:
        value, depth, top = stack.pop()
        if isinstance(value, dict):
            items: Iterable[Tuple[str, Any]] = value.items()
        elif isinstance(value, list):
            items = ((top, item) for item in value)
        else:
            continue
        if depth >= limit:
            return top
        for key, item in items:
            stack.append((item, depth + 1, top if depth else str(key)))
    return None


def read_document(path: Path) -> Dict[str, Any]:
    """Parse a TOML (``.toml``) or JSON (``.json``) file into plain data."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InvalidInput(f"{path}: cannot read ({err.strerror})") from err
    if len(raw) > MAX_BYTES:
        raise InvalidInput(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidInput(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from err
    try:
        if path.suffix == ".json":
            data = json.loads(text, object_pairs_hook=_no_duplicates)
        else:
            data = tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as err:
        message = redact(_describe_parse_error(str(err), text))
        raise InvalidInput(f"{path}: {message}") from err
    except RecursionError:  # the parsers recurse per level: far too deep for MAX_DEPTH
        raise InvalidInput(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: the top level must be a table/object")
    top = too_deep(data)
    if top is not None:
        raise InvalidInput(f"{path}: {key_text(top)}: nested deeper than {MAX_DEPTH} levels")
    return data
