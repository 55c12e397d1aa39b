"""Validated field types shared by every authored model."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.rules import CONTROL as CONTROL  # re-exported
from synthbatch.control.config.rules import SAFE_PATH as SAFE_PATH  # re-exported
from synthbatch.control.config.rules import check_abs_path as _abs_path
from synthbatch.control.config.rules import check_path_length
from synthbatch.control.config.rules import check_safe_path as _safe_path
from synthbatch.control.config.rules import check_text as _text
from synthbatch.control.config.rules import check_version as _version
from synthbatch.control.secrets import credential

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TIME_LIMIT = re.compile(r"([0-9]+-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}|[0-9]+")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A model on a hub: "name" or "org/name".
MAX_HUB_ID = 200  # the hub allows 96 characters per part
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# An absolute URL path and an optional query (RFC 3986 characters, %XX escapes), no fragment.
URL_PATH = re.compile(r"/(?:[A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})*"
                      r"(?:\?(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?")
# The name an engine serves a model under (what clients put in "model").
SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")
# Prompts may hold tabs and line breaks; every other control character is refused.
PROMPT_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class Strict(BaseModel):
    """Base of authored models: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _name(value: str) -> str:
    _text(value)
    if not NAME.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a name (letters, digits, '.', '_', '-'; max 64)")
    return value


CONFIG_DIR = "{config_dir}/"
RELATIVE_PART = re.compile(r"[A-Za-z0-9._/+@,=-]+")


def _config_path(value: str) -> str:
    """An absolute safe path, or ``{config_dir}/...`` resolved against the run file."""
    _text(value)
    if value.startswith(CONFIG_DIR):
        check_path_length(value)
        if not RELATIVE_PART.fullmatch(value[len(CONFIG_DIR):]):
            raise ValueError(f"{quoted(value)} may only contain letters, digits and ._/+@,=- "
                             f"after {{config_dir}}/")
        return value
    return _safe_path(value)


def _model(value: str) -> str:
    _text(value)
    if value.startswith(("/", CONFIG_DIR)):
        return _config_path(value)
    if not HUB_ID.fullmatch(value) or len(value) > MAX_HUB_ID:
        raise ValueError(f"must be an absolute path or a hub id like 'org/name' (at most "
                         f"{MAX_HUB_ID} characters)")
    return value


def _served_name(value: str) -> str:
    _text(value)
    if not SERVED_NAME.fullmatch(value):
        raise ValueError("may only contain letters, digits and ._/:- (max 128)")
    return value


def _url_path(value: str) -> str:
    _text(value)
    if not URL_PATH.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a URL path: it starts with '/', has no spaces "
                         f"and no '#', and may end in a ?query (other characters as %XX)")
    return value


def under(path: str, root: str) -> bool:
    """True if ``path`` is ``root`` or inside it (component-wise, both absolute)."""
    return PurePosixPath(path) == PurePosixPath(root) or PurePosixPath(root) in PurePosixPath(
        path).parents


def _time_limit(value: str) -> str:
    _text(value)
    if not TIME_LIMIT.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not a Slurm time limit ([D-]HH:MM:SS or minutes)")
    return value


def _prompt(value: str) -> str:
    if PROMPT_CONTROL.search(value):
        raise ValueError("control characters other than tab and line breaks are not allowed")
    return value


def _env_name(value: str) -> str:
    _text(value)
    rule = credential(value)
    if rule:
        raise ValueError(f"looks like a secret value, not a variable name: it {rule} "
                         f"(value not shown)")
    if not ENV_NAME.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not an environment variable name")
    return value


# ``schema_version``: exactly the integer 1 (a Literal[1] would take 1.0 and true).
SchemaVersion = Annotated[int, BeforeValidator(_version)]
Text = Annotated[str, AfterValidator(_text)]
Prompt = Annotated[str, AfterValidator(_prompt)]  # text that may span lines
Name = Annotated[str, AfterValidator(_name)]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
SafePath = Annotated[str, AfterValidator(_safe_path)]
TimeLimit = Annotated[str, AfterValidator(_time_limit)]
EnvName = Annotated[str, AfterValidator(_env_name)]
ModelRef = Annotated[str, AfterValidator(_model)]
ConfigPath = Annotated[str, AfterValidator(_config_path)]
ServedName = Annotated[str, AfterValidator(_served_name)]
UrlPath = Annotated[str, AfterValidator(_url_path)]
