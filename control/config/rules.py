"""Field rules that need no pydantic: the run-reading commands check profiles with them too.

``control.config.fields`` wraps these checks into pydantic types; ``control.config.workspace``
calls them directly, so both give the same message for the same value.
"""

from __future__ import annotations

import difflib
import re
from pathlib import PurePosixPath
from typing import Iterable, Tuple

from synthbatch.agent_stdlib.text import QUOTE_LIMIT, quoted

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Paths that end up in #SBATCH lines and scripts: no spaces, quotes, '%' or shell syntax.
PATH_MAX, NAME_MAX = 4095, 255  # bytes: what Linux can open (else ENAMETOOLONG)
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@,=-]*$")


def key_text(key: str) -> str:
    """A key as a message names it in a field path: bare, or quoted (a marked excerpt when
    long, see ``agent_stdlib.text.quoted``) when it holds control characters or is long."""
    return quoted(key) if len(key) > QUOTE_LIMIT or CONTROL.search(key) else key


def check_text(value: str) -> str:
    """``value`` unless it holds control characters (ValueError)."""
    if CONTROL.search(value):
        raise ValueError("control characters are not allowed")
    return value


def check_version(value: object, known: Tuple[int, ...] = (1,)) -> int:
    """``value`` if it is one of the ``known`` integers, else ValueError. Exactly an
    integer: ``1.0`` and ``true`` are refused, although Python finds them equal to 1
    (which is why a ``Literal[1]`` field would take them)."""
    if type(value) is not int or value not in known:
        raise ValueError("Input should be " + " or ".join(map(str, known)))
    return value


def check_path_length(value: str) -> None:
    """ValueError if ``value`` is longer than any path Linux can open: ``PATH_MAX`` bytes,
    ``NAME_MAX`` per component (``stat`` would fail with ENAMETOOLONG)."""
    def size(text: str) -> int:
        return len(text.encode("utf-8", "surrogatepass"))

    if size(value) > PATH_MAX or any(size(part) > NAME_MAX for part in value.split("/")):
        raise ValueError(f"{quoted(value)} is longer than a path can be ({PATH_MAX} bytes, "
                         f"{NAME_MAX} per component)")


def check_abs_path(value: str) -> str:
    """``value`` if it is an absolute path without ``..`` (else ValueError)."""
    check_text(value)
    path = PurePosixPath(value)
    if not path.is_absolute():
        raise ValueError(f"{quoted(value)} must be an absolute path")
    check_path_length(value)
    if ".." in path.parts:
        raise ValueError(f"{quoted(value)} must not contain '..'")
    return value


def check_safe_path(value: str) -> str:
    """``value`` if it is an absolute path safe in scripts (else ValueError)."""
    check_abs_path(value)
    if not SAFE_PATH.fullmatch(value):
        raise ValueError(f"{quoted(value)} may only contain letters, digits and ._/+@,=-")
    return value


def unknown_field(name: str, known: Iterable[str]) -> str:
    """What an unknown key is told: the closest field name, else every field name."""
    fields = sorted(known)
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    if close:
        return f"unknown field (did you mean {close[0]}?)"
    return f"unknown field (fields here: {', '.join(fields)})" if fields else "unknown field"
