"""``synthbatch wait``: block until a run ends; the exit status says how it ended.

0 every shard succeeded, 6 a shard failed (or was lost), 7 shards were cancelled (none
failed), 8 ``--timeout`` passed first (5 if Slurm could not be asked then), 9 the run can
never end (its open shards pend with a reason Slurm keeps); the codes are
``control.errors``'s. ``submit --wait`` uses the same loop.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Set

import click

from synthbatch.control.cli.common import common, run_id_argument
from synthbatch.control.cli.output import emit_json, emit_text
from synthbatch.control.cli.render import plain_line, status_text


def progress_printer(quiet: bool) -> Any:
    """A ``show`` callback: a line on stderr whenever the refresh's line changes, and each
    note once (e.g. a cancel carried out now that Slurm answers again)."""
    last: List[Optional[str]] = [None]
    noted: Set[str] = set()

    def show(data: Dict[str, Any]) -> None:
        line = plain_line(data)
        if not quiet and line != last[0]:
            emit_text(f"{time.strftime('%H:%M:%S')} {line}", err=True)
        last[0] = line
        for note in data.get("notes") or []:
            if not quiet and note not in noted:
                emit_text(f"{time.strftime('%H:%M:%S')} note: {note}", err=True)
            noted.add(note)

    return show


def wait_until_over(run_id: str, profile: Optional[str], timeout_s: Optional[float],
                    interval_s: float, quiet: bool) -> Dict[str, Any]:
    """``api.wait`` with progress on stderr; KeyboardInterrupt ends it like a timeout."""
    from synthbatch.control import api

    return api.wait(run_id, profile, timeout_s=timeout_s, interval_s=interval_s,
                    show=progress_printer(quiet)).to_dict()


def finish(data: Dict[str, Any], as_json: bool, extra: Optional[Dict[str, Any]] = None) -> None:
    """Print the final status (JSON or text) and raise what the exit status must say."""
    from synthbatch.control.readapi import outcome

    if as_json:
        emit_json(data if extra is None else {**extra, "status": data})
    else:
        emit_text(status_text(data), colour=True)
    error = outcome(data)
    if error is not None:
        raise error


def wait_options(func: Any) -> Any:
    """``--timeout``, ``--interval`` and ``--quiet``, shared with ``submit --wait``."""
    func = click.option("--quiet", is_flag=True,
                        help="No progress lines on stderr while waiting.")(func)
    func = click.option("--interval", type=click.FloatRange(1.0, 600.0), default=5.0,
                        show_default=True,
                        help="First refresh interval, seconds (backs off to 30 s while "
                             "nothing changes).")(func)
    return click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.0),
                        default=None,
                        help="Stop waiting after this many seconds (exit 8).")(func)


@click.command("wait")
@run_id_argument(required=False)
@wait_options
@common
def wait_cmd(run_id: Optional[str], timeout_s: Optional[float], interval: float, quiet: bool,
             profile: Optional[str], as_json: bool) -> Any:
    """Wait until RUN_ID (default: the latest run) ends; exit 0 only if every shard
    succeeded.

    \b
    Exit status: 0 succeeded, 6 a shard failed (or was lost), 7 cancelled (no failure),
    8 still running at --timeout (5 if Slurm could not be asked then), 9 it can never end
    (every open shard pends with a reason Slurm keeps, e.g. PartitionTimeLimit).
    Progress goes to stderr (none with --json); the final status to stdout (one JSON
    object with --json).
    """
    from synthbatch.control import api

    run_id = run_id or api.latest_run(profile)  # --json: stderr holds only a JSON error
    finish(wait_until_over(run_id, profile, timeout_s, interval, quiet or as_json), as_json)
    return None
