"""Printing results and errors: human text, or one JSON object with ``--json``.

Everything printed goes through ``agent_stdlib.text.visible`` here, at the edge: results
quote state files and logs (reasons, notes, scheduler errors, log text), which are
untrusted. Newlines and tabs are kept; every other control character is shown as an
escape (``\\x1b``), in human text and in every string of ``--json`` alike.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
from typing import Any, BinaryIO, Dict, Optional

import click

from agent_stdlib.statefile import StateError
from agent_stdlib.text import visible
from control.errors import MAX_MESSAGE, DamagedState, SynthbatchError, one_line

KEEP = "\n\t"
# A control character other than newline and tab as json.dumps writes it (ASCII only).
JSON_CONTROL = re.compile(r"\\(?:[bfr]|u00[01][0-9a-fA-F]|u007[fF]|u00[89][0-9a-fA-F])")


def shown(value: Any) -> Any:
    """``value`` with every string in it (keys too) made visible."""
    if isinstance(value, str):
        return visible(value, KEEP)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v) for v in value]
    return value


def emit_json(data: Dict[str, Any]) -> None:
    """One JSON object on stdout, its strings made visible."""
    text = json.dumps(data, sort_keys=True)
    # Rare: the common case serialises once and looks for a backslash (0.1 ms for 10,000
    # shards, where walking every string first would add ~60 ms to a ~300 ms status).
    if "\\" in text and JSON_CONTROL.search(text):
        text = json.dumps(shown(data), sort_keys=True)
    click.echo(text)


def emit_text(text: str, err: bool = False) -> None:
    """Human text on stdout (or stderr), made visible."""
    click.echo(visible(text, KEEP), err=err)


class VisibleStream:
    """A binary stream that writes what it is given made visible, for bytes read from a
    log: decoded as UTF-8 across chunk boundaries, an undecodable byte shown as ``\\xNN``."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self._decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")

    def write(self, data: bytes) -> int:
        """Write ``data`` made visible; return ``len(data)``."""
        self.out.write(visible(self._decoder.decode(data), KEEP).encode("utf-8"))
        return len(data)

    def flush(self) -> None:
        """Write a character torn at the end of the data so far (as escapes), and flush."""
        self.out.write(visible(self._decoder.decode(b"", final=True), KEEP).encode("utf-8"))
        self.out.flush()


def emit_error(err: Exception, as_json: bool) -> int:
    """Report an error on stderr (one line, or ``{"error": ...}``); return the exit code.

    Messages are redacted (tokens, ``--api-key`` values, URL userinfo), made visible and
    capped (``control.errors.one_line``). A state file that could not be read is a
    ``damaged_state`` conflict (exit 4), not an internal error.
    """
    if isinstance(err, StateError):
        err = DamagedState(str(err))
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
