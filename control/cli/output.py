"""Printing results and errors: human text, or one JSON object with ``--json``."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional

import click

from control.errors import MAX_MESSAGE, SynthbatchError, one_line


def emit_json(data: Dict[str, Any]) -> None:
    """One JSON object on stdout."""
    click.echo(json.dumps(data, sort_keys=True))


def emit_error(err: Exception, as_json: bool) -> int:
    """Report an error on stderr (one line, or ``{"error": ...}``); return the exit code.

    Messages are redacted (tokens, ``--api-key`` values, URL userinfo) and capped.
    """
    if isinstance(err, SynthbatchError):
        code, message, hint, exit_code = err.code, err.message, err.hint, err.exit_code
    else:
        code, message, hint, exit_code = "internal", f"{type(err).__name__}: {err}", None, 1
    message = one_line(message, MAX_MESSAGE)
    hint = one_line(hint, MAX_MESSAGE) if hint else None
    if as_json:
        payload: Dict[str, Optional[str]] = {"code": code, "message": message}
        if hint:
            payload["hint"] = hint
        click.echo(json.dumps({"error": payload}, sort_keys=True), err=True)
    else:
        click.echo(f"synthbatch: error: {message}" + (f" (hint: {hint})" if hint else ""),
                   err=True)
    return exit_code


def is_tty() -> bool:
    """True when stdout is a terminal."""
    return sys.stdout.isatty()
