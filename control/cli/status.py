"""``synthbatch status`` (with ``--watch``)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import click

from control.cli.common import common
from control.cli.output import emit_json, emit_text, is_tty
from control.cli.render import frame, plain_line, status_text


class Screen:
    """Draws watch frames: redrawn in place on a terminal, else a line per change."""

    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.drawn = 0
        self.last: Optional[str] = None

    def show(self, data: Dict[str, Any]) -> None:
        """Draw one refresh."""
        if not self.tty:
            line = plain_line(data)
            if line != self.last:
                emit_text(f"{time.strftime('%H:%M:%S')} {line}")
            self.last = line
            return
        lines: List[str] = frame(data)
        if self.drawn:
            click.echo(f"\x1b[{self.drawn}F\x1b[J", nl=False)  # up N lines, clear below
        emit_text("\n".join(lines))  # after our own escapes: the lines are made visible
        self.drawn = len(lines)


@click.command("status")
@click.argument("run_id")
@click.option("--watch", is_flag=True,
              help="Refresh until the run ends (backing off while nothing changes).")
@click.option("--interval", type=click.FloatRange(1.0, 600.0), default=2.0, show_default=True,
              help="First refresh interval of --watch, seconds.")
@common
def status_cmd(run_id: str, watch: bool, interval: float, profile: Optional[str],
               as_json: bool) -> Any:
    """Show the shards of RUN_ID by state, records, tokens, rate, ETA and failures.

    Exits 5 (after printing what the records say) when Slurm could not be asked about a
    run that is not over; --watch shows that as a note and keeps refreshing. With --json
    --watch, one JSON object is printed when the run ends.
    """
    from control import api
    from control.runs.status import unreachable

    if not watch:
        data = api.status(run_id, profile)
        error = unreachable(data)
        if error is None:
            return {"data": data, "text": status_text(data)}
        if as_json:
            emit_json(data)
        else:  # the error line on stderr is the one message about the scheduler
            emit_text(status_text({**data, "scheduler_error": None}))
        raise error
    from control.runs.watch import Backoff
    from control.runs.watch import watch as watch_loop

    screen = Screen(is_tty() and not as_json)
    show = (lambda data: None) if as_json else screen.show
    try:
        last = watch_loop(lambda: api.status(run_id, profile), show,
                          Backoff(base_s=interval))
    except KeyboardInterrupt:
        return None
    if as_json:
        emit_json(last)
    return None
