"""``synthbatch logs``: the right log of a shard's latest execution."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import click

from synthbatch.control.cli.common import common, run_id_argument
from synthbatch.control.cli.output import VisibleStream, emit_text, is_tty


@click.command("logs")
@run_id_argument(required=False)
@click.option("--shard", type=click.IntRange(min=0), default=None,
              help="Shard index (default: the first failed, else the first running, else 0).")
@click.option("--step", default=None,
              help="client, server-<alias>-<replica>, proxy-<alias> or slurm "
                   "(default: the log a failure names, else client, else slurm).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing until the shard ends, like tail -F: waits for the log to "
                   "appear (right after submit), moves on to the next execution after a "
                   "requeue, or to a retry's attempt.")
@common
def logs_cmd(run_id: Optional[str], shard: Optional[int], step: Optional[str], follow: bool,
             profile: Optional[str], as_json: bool) -> Any:
    """Print a log of RUN_ID (default: the latest run) without knowing the run
    directory's layout.

    With --json: the file's path, the steps that have logs, and the last 64 KiB. On a
    terminal, control characters other than newline and tab are shown as escapes
    (``\\x1b``); piped, the file's bytes are copied as they are.
    """
    from synthbatch.control import api
    from synthbatch.control.readapi import logs

    run_id = run_id or api.latest_run(profile)
    if follow and not as_json:
        return _follow(run_id, shard, step, profile)
    data = api.logs(run_id, shard, step, profile)
    path = Path(data["path"])
    if as_json:
        return {"data": {**data, "text": logs.read_tail(path)}, "text": ""}
    emit_text(_header(data["shard"], data["attempt"], data["execution"], data["step"], path),
              err=True)
    logs.copy_from(path, _out(), 0)
    return None


def _out() -> Any:
    return VisibleStream(sys.stdout.buffer) if is_tty() else sys.stdout.buffer


def _follow(run_id: str, shard: Optional[int], step: Optional[str],
            profile: Optional[str]) -> None:
    """Wait for the log (notes on stderr), then follow it across executions and attempts."""
    from synthbatch.control import api
    from synthbatch.control.readapi import logs

    layout = api.run_dir(run_id, profile)
    index = logs.shard_index(layout, shard)
    try:
        first = logs.await_target(layout, index, step,
                                  notify=lambda note: emit_text(f"synthbatch: {note}", err=True))
    except KeyboardInterrupt:
        return None
    emit_text(_header(first.shard, first.attempt, first.execution, first.step, first.path),
              err=True)
    out = _out()
    current = [first]

    def newer() -> Optional[Path]:
        target = logs.newer_target(layout, current[0])
        if target is None:
            return None
        current[0] = target
        emit_text(_header(target.shard, target.attempt, target.execution, target.step,
                          target.path), err=True)
        return target.path

    try:
        logs.follow(first.path, out, lambda: logs.shard_ended(layout, index), newer=newer)
    except KeyboardInterrupt:
        pass
    return None


def _header(shard: int, attempt: Optional[int], execution: Optional[int], step: str,
            path: Path) -> str:
    """The ``==> ... <==`` line naming the file being printed (on stderr)."""
    return f"==> shard {shard} attempt {attempt} execution {execution}: {step} ({path}) <=="
