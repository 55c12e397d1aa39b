"""Reading authored files into plain data: TOML or JSON, strictly (no pydantic here).

Duplicate keys, files over 1 MiB, non-UTF-8 bytes and syntax errors are InvalidInput
naming the file (and the key, for a duplicate). ``control.config.loader`` validates the
data with pydantic; the run-reading commands use it through ``control.config.workspace``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

from control.errors import InvalidInput
from control.secrets import redact

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

MAX_BYTES = 1 << 20


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")


def _table_of(lines: List[str], number: int) -> str:
    """The field path prefix of line ``number``: ``shards.`` or ``deployments[1].``."""
    above = lines[:number - 1]
    for line in reversed(above):
        match = HEADER.match(line)
        if match:
            name = match.group(2).replace('"', "").replace("'", "")
            if match.group(1) == "[[":
                index = sum(1 for x in above if (m := HEADER.match(x)) and m.group(1) == "[["
                            and m.group(2).replace('"', "").replace("'", "") == name) - 1
                return f"{name}[{index}]."
            return name + "."
    return ""


def _describe_parse_error(message: str, text: str) -> str:
    """Name the key of a TOML 'Cannot overwrite a value' error (a duplicate key)."""
    match = re.search(r"Cannot overwrite a value \(at line (\d+)", message)
    if match:
        lines = text.splitlines()
        number = int(match.group(1))
        if 0 < number <= len(lines) and "=" in lines[number - 1]:
            key = lines[number - 1].split("=", 1)[0].strip()
            return f"{_table_of(lines, number)}{key}: duplicate key (at line {number})"
    return " ".join(message.split())


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
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: the top level must be a table/object")
    return data
