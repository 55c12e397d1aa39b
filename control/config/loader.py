"""Validating authored files: plain data (``control.config.document``) -> pydantic models."""

from __future__ import annotations

import difflib
import re
import typing
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Type, TypeVar

from pydantic import BaseModel, ValidationError

from synthbatch.control.config.document import read_document as read_document  # re-exported
from synthbatch.control.config.document import tomllib as tomllib  # re-exported (starter)
from synthbatch.control.config.rules import key_text, unknown_field
from synthbatch.control.errors import InvalidInput
from synthbatch.control.secrets import redact

M = TypeVar("M", bound=BaseModel)


FIELD_PREFIX = re.compile(
    r'^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[A-Za-z0-9_$-]+|\."(?:[^"\\]|\\.)*")*): ')


def _location(loc: Tuple[Any, ...]) -> str:
    parts: List[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif str(item) == "[key]" or (str(item).startswith("<") and str(item).endswith(">")):
            continue  # a dict-key marker or a union tag (see deployment.EnvValue)
        else:
            text = key_text(str(item))
            parts.append(("." if parts else "") + text)
    return "".join(parts)


def _names(loc: Tuple[Any, ...]) -> str:
    """The names along ``loc`` (``client.env.HF_TOKEN``): what a secret name is looked for in."""
    return ".".join(item for item in loc if isinstance(item, str))


def _models(hint: Any, tag: Optional[str] = None) -> List[Type[BaseModel]]:
    """The model classes a field's type can hold (through Optional, lists, dicts, tagged
    unions); only the one tagged ``tag`` when the union's members carry tags."""
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return [hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        labels = [getattr(m, "tag", None) for m in hint.__metadata__]
        if tag is not None and any(labels) and tag not in labels:
            return []
        return _models(args[0], tag)
    if origin in (list, List):
        return _models(args[0], tag) if args else []
    if origin in (dict, Dict):
        return _models(args[1], tag) if len(args) == 2 else []
    return [m for arg in args for m in _models(arg, tag)]  # Union / Optional


def known_fields(model: Type[BaseModel], loc: Tuple[Any, ...]) -> List[str]:
    """The field names of the table at ``loc`` (the location of its unknown key)."""
    current: List[Type[BaseModel]] = [model]
    for index, item in enumerate(loc):
        text = str(item)
        if isinstance(item, int) or text == "[key]":
            continue
        if text.startswith("<") and text.endswith(">"):
            continue  # a union's tag: the field before it already chose that member
        following = str(loc[index + 1]) if index + 1 < len(loc) else None
        nested: List[Type[BaseModel]] = []
        for m in current:
            if text in m.model_fields:
                wanted = following if following and following.startswith("<") else None
                nested += _models(m.model_fields[text].annotation, wanted)
        current = nested
    return sorted({name for m in current for name in m.model_fields})


def _preferred(errors: List[Dict[str, Any]], model: Optional[Type[BaseModel]]) -> Dict[str, Any]:
    """The error to report: an unknown key that is a near miss of a field comes first
    (``max_token`` is why ``max_tokens`` is "missing"); else the first error."""
    if model is not None:
        for item in errors:
            loc = tuple(item["loc"])
            if item["type"] == "extra_forbidden" and loc and difflib.get_close_matches(
                    str(loc[-1]), known_fields(model, loc[:-1]), n=1, cutoff=0.6):
                return item
    return errors[0]


def first_error(err: ValidationError, model: Optional[Type[BaseModel]] = None) -> str:
    """One line naming the first invalid field and why; secret-like values redacted.

    A model-level message that starts with a field path (``tensor_parallel: ...``) is
    joined to the model's location (``deployments[0].tensor_parallel: ...``). With the
    ``model`` that was validated, an unknown key says which field was meant
    (``client.max_token: unknown field (did you mean max_tokens?)``).
    """
    item = _preferred(err.errors(), model)
    loc = tuple(item["loc"])
    message = item["msg"].removeprefix("Value error, ")
    if item["type"] == "extra_forbidden" and model is not None and loc:
        message = unknown_field(str(loc[-1]), known_fields(model, loc[:-1]))
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
        raise InvalidInput(f"{path}: {first_error(err, model)}") from err
