"""The one wrapper every command goes through: common options, output, exit codes."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable

import click

from control.cli.output import emit_error, emit_json, emit_text

F = Callable[..., Any]


def common(func: F) -> F:
    """Add ``--profile``, ``--json`` and ``--debug``; map errors to exit codes once.

    The command returns ``{"data": ..., "text": ...}`` (printed as JSON or text), or None
    when it printed its own output (``--watch``, ``--follow``); a command that declares
    an ``as_json`` parameter receives the flag.
    """

    wants_json = "as_json" in inspect.signature(func).parameters

    @click.option("--profile", "profile", default=None,
                  help="Profile name or path (default: $SYNTHBATCH_PROFILE, then 'default').")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @click.option("--debug", is_flag=True, help="Show tracebacks.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, debug: bool, **kwargs: Any) -> None:
        if wants_json:
            kwargs["as_json"] = as_json
        try:
            result = func(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the one place errors become exit codes
            if debug:
                raise
            sys.exit(emit_error(err, as_json))
        if result is None:
            return
        if as_json:
            emit_json(result["data"])
        else:
            emit_text(result["text"])

    return wrapper
