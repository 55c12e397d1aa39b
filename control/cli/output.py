"""Printing results and errors: human text, or one JSON object with ``--json``.

Everything printed goes through ``agent_stdlib.text.visible`` here, at the edge: results
quote state files and logs (reasons, notes, scheduler errors, log text), which are
untrusted. Newlines and tabs are kept; every other control character is shown as an
escape (``\\x1b``), in human text and in every string of ``--json`` alike.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import sys
import time
from typing import Any, BinaryIO, Callable, Dict, List

import click

from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.cli.render import state_cell
from synthbatch.control.errors import MAX_MESSAGE, DamagedState, SynthbatchError, one_line
from synthbatch.control.readapi import norm

KEEP = "\n\t"
# A control character other than newline and tab as json.dumps writes it (ASCII only).
JSON_CONTROL = re.compile(r"\\(?:[bfr]|u00[01][0-9a-fA-F]|u007[fF]|u00[89][0-9a-fA-F])")
JSON_CONTROL_BYTES = re.compile(JSON_CONTROL.pattern.encode("ascii"))


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
    emit_encoded_json(json.dumps(data, sort_keys=True).encode("utf-8"), lambda: data)


def emit_encoded_json(text: bytes, data: Callable[[], Dict[str, Any]]) -> None:
    """``emit_json(data())`` for a ``text`` that already is ``json.dumps(data(),
    sort_keys=True)`` in UTF-8 (``status --json`` prints the settled index's rows as they
    are, without decoding them)."""
    # Rare: the common case serialises once and looks for a backslash (0.1 ms for 10,000
    # shards, where walking every string first would add ~60 ms to a ~300 ms status).
    if b"\\" in text and JSON_CONTROL_BYTES.search(text):
        text = json.dumps(shown(data()), sort_keys=True).encode("utf-8")
    click.echo(text)


def emit_text(text: str, err: bool = False, colour: bool = False) -> None:
    """Human text on stdout (or stderr), made visible; with ``colour``, run and shard
    states coloured (``paint``) when the stream is a terminal and NO_COLOR is not set."""
    shown_text = visible(text, KEEP)
    if colour and use_colour(err):
        click.echo(paint(shown_text), err=err, color=True)
        return
    click.echo(shown_text, err=err)


# States as status, runs and wait print them -> their colour on a terminal.
COLOURS = {state: report.colour for state, report in norm.REPORT.items() if report.colour}
STATE_CELL = state_cell(COLOURS)


def use_colour(err: bool = False) -> bool:
    """True on a terminal, unless NO_COLOR is set (https://no-color.org) or TERM=dumb."""
    stream = sys.stderr if err else sys.stdout
    return stream.isatty() and not os.environ.get("NO_COLOR") and \
        os.environ.get("TERM") != "dumb"


def paint(text: str) -> str:
    """``text`` (already made visible) with the state column of each line in its colour
    (``render.state_cell``); a state word anywhere else (a reason, a note) stays plain."""
    return STATE_CELL.sub(lambda m: m.group("lead") + click.style(
        m.group("state"), fg=COLOURS[m.group("state")]), text)


def fit_width(line: str, width: int) -> str:
    """``line`` cut to ``width`` columns (with ``…``) so that a terminal never wraps it."""
    return line if len(line) <= width else line[: max(1, width - 1)] + "…"


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
    details: List[str] = []
    if isinstance(err, SynthbatchError):
        code, message, hint, exit_code = err.code, err.message, err.hint, err.exit_code
        details = [one_line(line, MAX_MESSAGE) for line in err.details]
    else:
        code, message, hint, exit_code = "internal", f"{type(err).__name__}: {err}", None, 1
    message = one_line(message, MAX_MESSAGE)
    hint = one_line(hint, MAX_MESSAGE) if hint else None
    if as_json:
        payload: Dict[str, Any] = {"code": code, "message": message}
        if hint:
            payload["hint"] = hint
        if details:
            payload["details"] = details
        click.echo(json.dumps({"error": payload}, sort_keys=True), err=True)
    else:
        click.echo(f"synthbatch: error: {message}" + (f" (hint: {hint})" if hint else ""),
                   err=True)
        for line in details:  # one line per problem
            click.echo(f"  {line}", err=True)
    return exit_code


def is_tty() -> bool:
    """True when stdout is a terminal."""
    return sys.stdout.isatty()


class ByteProgress:
    """A one-line progress bar on stderr for hashing large images (only on a terminal).

    Called as ``progress(done, total)``; redraws at most every :attr:`interval` seconds and
    ends its line on :meth:`close`. Off the terminal (pipes, CI logs) it prints nothing.
    """

    interval = 0.2
    width = 30

    def __init__(self, label: str, stream: Any = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        """Redraw the bar: ``done`` of ``total`` bytes."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval and done < total:
            return
        self._last = now
        share = done / total if total else 1.0
        bar = "#" * int(share * self.width)
        self.stream.write(f"\r{visible(self.label)} [{bar:<{self.width}}] {share:6.1%} "
                          f"{done / 2**30:.2f}/{total / 2**30:.2f} GiB")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (if one was drawn)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
