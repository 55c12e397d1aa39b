"""Validating authored files: plain data (``control.config.document``) -> pydantic models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, List, Tuple, Type, TypeVar

from pydantic import BaseModel, ValidationError

from control.config.document import read_document as read_document  # re-exported
from control.config.document import tomllib as tomllib  # re-exported (starter)
from control.config.rules import CONTROL
from control.errors import InvalidInput
from control.secrets import redact

M = TypeVar("M", bound=BaseModel)


FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[A-Za-z0-9_$-]+)*): ")


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


def _names(loc: Tuple[Any, ...]) -> str:
    """The names along ``loc`` (``client.env.HF_TOKEN``): what a secret name is looked for in."""
    return ".".join(item for item in loc if isinstance(item, str))


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
    message = redact(message, item.get("input"), _names(loc))
    return redact(f"{where}: {message}" if where else message)


def load_model(path: Path, model: Type[M]) -> M:
    """Read ``path`` and validate it as ``model``; InvalidInput names file and field."""
    data = read_document(path)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise InvalidInput(f"{path}: {first_error(err)}") from err
