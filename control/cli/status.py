"""``synthbatch status`` (with ``--watch``)."""

from __future__ import annotations

import shutil
import time
from typing import Any, Callable, Dict, List, Optional

import click

from synthbatch.agent_stdlib.text import visible
from synthbatch.control.cli.common import common, run_id_argument
from synthbatch.control.cli.output import (
    emit_encoded_json,
    emit_json,
    emit_text,
    fit_width,
    is_tty,
    paint,
    use_colour,
)
from synthbatch.control.cli.render import frame, plain_line, shard_text, status_text
from synthbatch.control.errors import InvalidInput


class Screen:
    """Draws watch frames: redrawn in place on a terminal, else a line per change.

    On a terminal every line is cut to its width first: a wrapped line takes two rows,
    and moving the cursor up by the number of lines drawn would then leave rows of the
    old frame behind on a narrow terminal. States are coloured unless NO_COLOR is set.
    """

    def __init__(self, tty: bool, width: Optional[Callable[[], int]] = None,
                 colour: Optional[bool] = None) -> None:
        self.tty = tty
        self.drawn = 0
        self.last: Optional[str] = None
        self.width = width or (lambda: shutil.get_terminal_size().columns)
        self.colour = use_colour() if colour is None else colour

    def show(self, data: Dict[str, Any]) -> None:
        """Draw one refresh."""
        if not self.tty:
            line = plain_line(data)
            if line != self.last:
                emit_text(f"{time.strftime('%H:%M:%S')} {line}")
            self.last = line
            return
        width = max(20, self.width()) - 1  # the last column would wrap on some terminals
        lines: List[str] = [fit_width(visible(line, ""), width) for line in frame(data, width)]
        text = "\n".join(lines)
        # color=True: this screen is a terminal (click would strip escapes it cannot see)
        if self.drawn:
            click.echo(f"\x1b[{self.drawn}F\x1b[J", nl=False, color=True)  # up N, clear
        click.echo(paint(text) if self.colour else text, color=True)  # visible, then cut
        self.drawn = len(lines)


@click.command("status")
@run_id_argument(required=False)
@click.option("--watch", is_flag=True,
              help="Refresh until the run ends (backing off while nothing changes).")
@click.option("--interval", type=click.FloatRange(1.0, 600.0), default=2.0, show_default=True,
              help="First refresh interval of --watch, seconds.")
@click.option("--exit-status", is_flag=True,
              help="Exit 6 if the run ended with a failed shard, 7 if cancelled, 9 if it can "
                   "never end (as `wait`).")
@click.option("--shard", type=click.IntRange(min=0), default=None,
              help="Show this shard only: its whole reason and the last lines of the log "
                   "it names (else its client or Slurm log).")
@common
def status_cmd(run_id: Optional[str], watch: bool, interval: float, exit_status: bool,
               shard: Optional[int], profile: Optional[str], as_json: bool) -> Any:
    """Show the shards of RUN_ID (default: the latest run) by state, records, tokens,
    rate, ETA and failures.

    Exits 5 (after printing what the records say) when Slurm could not be asked about a
    run that is not over; --watch shows that as a note and keeps refreshing. With --json
    --watch, one JSON object is printed when the run ends. With --exit-status, a run that
    ended failed exits 6, cancelled 7, and one that can never end 9 (`synthbatch wait` also
    waits for it to end). With --shard N: that shard's whole reason and the last lines of
    its failing step's log.
    """
    from synthbatch.control import api
    from synthbatch.control.readapi import outcome, unreachable

    run_id = run_id or api.latest_run(profile)
    if shard is not None:
        if watch or exit_status:
            raise InvalidInput("--shard shows one shard once: not with --watch or "
                               "--exit-status")
        detail = api.shard_status(run_id, shard, profile)
        return {"data": detail, "text": shard_text(detail)}
    if not watch and as_json:  # the settled rows are printed as the index keeps them
        fresh = api.status_refresh(run_id, profile)
        emit_encoded_json(fresh.json_bytes(), fresh.data)
        error = unreachable(fresh.summary) or \
            (outcome(fresh.summary, waited=False) if exit_status else None)
        if error is not None:
            raise error
        return None
    if not watch:
        data = api.status(run_id, profile).to_dict()
        error = unreachable(data) or (outcome(data, waited=False) if exit_status else None)
        if error is None:
            return {"data": data, "text": status_text(data), "colour": True}
        if not unreachable(data):
            emit_text(status_text(data), colour=True)
            raise error
        # the error line on stderr is the one message about the scheduler
        emit_text(status_text({**data, "scheduler_error": None}), colour=True)
        raise error
    from synthbatch.control.readapi import Backoff, watch_loop

    screen = Screen(is_tty() and not as_json)
    show = (lambda data: None) if as_json else screen.show
    try:
        last = watch_loop(lambda: api.status(run_id, profile).to_dict(), show,
                          Backoff(base_s=interval))
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # 128 + SIGINT, as a shell reports it
    if as_json:
        emit_json(last)
    error = outcome(last, waited=False) if exit_status else None
    if error is not None:
        raise error
    return None
