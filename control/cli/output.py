"""Printing results and errors: human text, or one JSON object with ``--json``."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional

import click

from control.errors import SynthbatchError

MAX_MESSAGE = 500


def emit_json(data: Dict[str, Any]) -> None:
    """One JSON object on stdout."""
    click.echo(json.dumps(data, sort_keys=True))


def emit_error(err: Exception, as_json: bool) -> int:
    """Report an error on stderr (one line, or ``{"error": ...}``); return the exit code."""
    if isinstance(err, SynthbatchError):
        code, message, hint, exit_code = err.code, err.message, err.hint, err.exit_code
    else:
        code, message, hint, exit_code = "internal", f"{type(err).__name__}: {err}", None, 1
    message = " ".join(str(message).split())[:MAX_MESSAGE]
    if as_json:
        payload: Dict[str, Optional[str]] = {"code": code, "message": message}
        if hint:
            payload["hint"] = hint
        click.echo(json.dumps({"error": payload}, sort_keys=True), err=True)
    else:
        click.echo(f"synthbatch: error: {message}" + (f" (hint: {hint})" if hint else ""),
                   err=True)
    return exit_code


def status_lines(data: Dict[str, Any]) -> str:
    """The human rendering of ``status``."""
    counts = ", ".join(f"{n} {state}" for state, n in data["counts"].items())
    lines = [f"run {data['run_id']}: {data['state']}  "
             f"records {data['records_done']}/{data['records']}  shards: {counts}"]
    if not data.get("accounting", True):
        lines.append("(accounting is disabled on this cluster: sacct evidence unavailable)")
    for shard in data["shards"]:
        reason = f"  {shard['reason']}" if shard.get("reason") else ""
        lines.append(f"  shard {shard['index']:>5}  {shard['state']:<10} "
                     f"{shard['records_done']:>8}/{shard['records']:<8} "
                     f"attempt {shard['attempt']}  job {shard['job_id'] or '-'}{reason}")
    return "\n".join(lines)


def is_tty() -> bool:
    """True when stdout is a terminal."""
    return sys.stdout.isatty()
