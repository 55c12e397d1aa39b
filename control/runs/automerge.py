"""Merge on completion (issue 34): what a run asked for at submit, and the merge job's work.

``submit --merge-to PATH [--format jsonl|parquet] [--allow-partial]`` (or ``[output]`` in
the run file) is resolved at submit time (``target``: one line naming ``--merge-to`` when
the path cannot be written) and kept with the run's automatic settings in
``<run>/auto/settings.json`` (``auto_retry``, ``max_attempts``, ``merge``). The round job
(``control.runs.autoround``) submits the merge job once the run is over; the merge job
runs ``control.runs.merge.merge_run`` (the one merge path) and records its outcome in
``<run>/auto/merge.json`` for ``status``. Records: temp + fsync + rename; a damaged one
reads as absent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Optional

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    ensure_dir,
    read_json_or_none,
    write_json_atomic,
)
from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.errors import InvalidInput, SynthbatchError

# What a merge on completion came to (its record's "state"; not a shard's state).
MERGED, PARTIAL, NOT_MERGED, MERGE_FAILED, WAITING = (
    "merged", "partial", "not merged", "failed", "waiting")

FLAG = "--merge-to"


def target(raw: str, base: Path, fmt: Optional[str]) -> Path:
    """``raw`` resolved against ``base`` (the working directory for ``--merge-to``, the run
    file's folder for ``[output] merge_to``); InvalidInput naming ``--merge-to`` when the
    merge could not write there (``fmt`` None: the folder only, before the run file is
    read)."""
    path = (base / Path(raw).expanduser()).resolve()
    parent = path.parent
    if not parent.is_dir():
        raise InvalidInput(f"{FLAG} {quoted(raw)}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"{FLAG} {quoted(raw)}: cannot write in {parent}")
    if fmt == "jsonl" and path.is_dir():
        raise InvalidInput(f"{FLAG} {quoted(raw)}: {path} is a directory (jsonl merges "
                           f"into one file)")
    if fmt == "parquet" and path.exists() and not path.is_dir():
        raise InvalidInput(f"{FLAG} {quoted(raw)}: {path} is a file (parquet merges into "
                           f"a folder)")
    return path


def settings(auto_retry: bool, max_attempts: int, merge_to: Optional[Path], fmt: str,
             allow_partial: bool) -> Dict[str, Any]:
    """The run's automatic settings as plain data (``merge`` None: no merge job)."""
    merge = None if merge_to is None else {"to": str(merge_to), "format": fmt,
                                            "allow_partial": allow_partial}
    return {"auto_retry": auto_retry, "max_attempts": max_attempts, "merge": merge}


def save_settings(layout: RunLayout, data: Dict[str, Any]) -> None:
    """Write ``<run>/auto/settings.json`` (before the first automatic job is submitted)."""
    ensure_dir(layout.auto)
    write_json_atomic(layout.auto_settings, data)


def load_settings(layout: RunLayout) -> Dict[str, Any]:
    """The run's automatic settings; a run from before them (or damaged): retries on, no
    merge, ``max_attempts`` unknown (None)."""
    data = read_json_or_none(layout.auto_settings) or {}
    merge = data.get("merge")
    if not (isinstance(merge, dict) and isinstance(merge.get("to"), str)):
        merge = None
    attempts = data.get("max_attempts")
    return {"auto_retry": data.get("auto_retry", True) is not False,
            "max_attempts": attempts if type(attempts) is int else None, "merge": merge}


def load_result(layout: RunLayout) -> Optional[Dict[str, Any]]:
    """What the merge job recorded (``state``: merged / partial / failed / not merged)."""
    return read_json_or_none(layout.auto_merge)


def record_result(layout: RunLayout, result: Dict[str, Any]) -> None:
    """Write ``<run>/auto/merge.json``."""
    ensure_dir(layout.auto)
    write_json_atomic(layout.auto_merge, result)


def not_merged(failed: Any) -> Dict[str, Any]:
    """The record of a run that ended without a winner for ``failed`` shards and without
    ``allow_partial``: no merge job, and status says why."""
    shards = sorted(failed)
    return {"state": NOT_MERGED, "missing_shards": shards,
            "reason": f"shards without a winner: {', '.join(map(str, shards))}; "
                      f"`synthbatch merge --allow-partial` merges the rest"}


def outcome(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """The merge job's record from ``merge_run``'s manifest."""
    missing = list(manifest.get("missing_shards") or [])
    return {"state": MERGED if manifest.get("complete") else PARTIAL,
            "output": manifest.get("output"), "records": manifest.get("records"),
            "missing_shards": missing, "bad_shards": manifest.get("bad_shards") or [],
            "manifest": manifest.get("manifest")}


def run_merge(layout: RunLayout) -> Dict[str, Any]:
    """The merge job's work: ``merge_run`` as the run asked, its outcome recorded."""
    from synthbatch.control.runs.merge import merge_run

    merge = load_settings(layout)["merge"]
    if merge is None:
        result: Dict[str, Any] = {"state": MERGE_FAILED, "reason": "no merge was asked for"}
    else:
        try:
            result = outcome(merge_run(layout, Path(merge["to"]),
                                       bool(merge.get("allow_partial")),
                                       str(merge.get("format") or "jsonl")))
        except SynthbatchError as err:
            result = {"state": MERGE_FAILED, "output": merge["to"], "reason": err.message}
    record_result(layout, result)
    return result


def view(layout: RunLayout) -> Optional[Dict[str, Any]]:
    """``status``'s ``merge``: what was asked and what happened (None: no merge asked)."""
    merge = load_settings(layout)["merge"]
    if merge is None:
        return None
    result = load_result(layout) or {"state": WAITING}
    return {**merge, **result}


def auto_settings(config: Any, run_file: Path, max_attempts: int,
                  merge_to: Optional[Any] = None, fmt: Optional[str] = None,
                  allow_partial: bool = False) -> Dict[str, Any]:
    """``submit``'s automatic settings: the run file's ``auto_retry`` and ``[output]``, with
    ``--merge-to`` (relative to the working directory), ``--format`` and
    ``--allow-partial`` over them; the target checked now (InvalidInput naming
    ``--merge-to``)."""
    output = getattr(config, "output", None)
    fmt = fmt or (output.format if output is not None else "jsonl")
    if fmt not in ("jsonl", "parquet"):
        raise InvalidInput(f"--format {quoted(fmt)}: expected jsonl or parquet")
    if merge_to is not None:
        to: Optional[Path] = target(str(merge_to), Path.cwd(), fmt)
    elif output is not None and output.merge_to:
        to = target(output.merge_to, run_file.parent, fmt)
    else:
        to = None
    partial = allow_partial or bool(output is not None and output.allow_partial)
    retries = config is None or bool(config.auto_retry)
    return settings(retries, max_attempts, to, fmt, partial)
