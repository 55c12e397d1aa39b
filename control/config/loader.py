"""Reading authored files: TOML or JSON, strictly (duplicate keys, control characters)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple, Type, TypeVar

from pydantic import BaseModel, ValidationError

from control.config.fields import CONTROL
from control.config.secrets import redact, secret_name
from control.errors import InvalidInput

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.9/3.10 only
    import tomli as tomllib

M = TypeVar("M", bound=BaseModel)
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


FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[A-Za-z0-9_-]+)*): ")


def _location(loc: Tuple[Any, ...]) -> str:
    parts: List[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item) == "[key]" or (str(item).startswith("<") and str(item).endswith(">")):
            continue  # a dict-key marker or a union tag (see deployment.EnvValue)
        else:
            text = repr(str(item)) if CONTROL.search(str(item)) else str(item)
            parts.append(("." if parts else "") + text)
    return "".join(parts)


def _sensitive(loc: Tuple[Any, ...]) -> bool:
    return any(isinstance(item, str) and secret_name(item) for item in loc)


def first_error(err: ValidationError) -> str:
    """One line naming the first invalid field and why; secret-like values redacted.

    A model-level message that starts with a field path (``tensor_parallel: ...``) is
    joined to the model's location (``deployments[0].tensor_parallel: ...``).
    """
    item = err.errors()[0]
    loc = tuple(item["loc"])
    message = item["msg"].removeprefix("Value error, ")
    where = _location(loc)
    match = FIELD_PREFIX.match(message)
    if match:
        inner = match.group(1)
        where = f"{where}{'' if inner.startswith('[') or not where else '.'}{inner}"
        message = message[match.end():]
    message = redact(message, item.get("input"), _sensitive(loc))
    return redact(f"{where}: {message}" if where else message)


def load_model(path: Path, model: Type[M]) -> M:
    """Read ``path`` and validate it as ``model``; InvalidInput names file and field."""
    data = read_document(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(f"{path}: {first_error(err)}") from err
