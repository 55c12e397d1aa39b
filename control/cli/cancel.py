"""``synthbatch cancel``."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import click

from synthbatch.control.cli.common import common, run_id_argument


@click.command("cancel")
@run_id_argument()
@click.option("--shard", "shards", type=click.IntRange(min=0), multiple=True,
              help="Cancel only this shard (repeatable; default: every unfinished shard).")
@click.option("--wait", "wait_s", type=click.FloatRange(0, 3600), default=60.0,
              show_default=True, help="Seconds to wait for Slurm to confirm the jobs ended.")
@common
def cancel_cmd(run_id: str, shards: Tuple[int, ...], wait_s: float,
               profile: Optional[str]) -> Any:
    """scancel the jobs RUN_ID recorded (only those); their shards become cancelled."""
    from synthbatch.control import api

    data = api.cancel(run_id, shards, profile, wait_s=wait_s)
    if not data["scancelled"] and data["converged"]:
        text = f"run {run_id}: nothing left to cancel"
    else:
        text = f"run {run_id}: scancel {' '.join(data['scancelled']) or '(no jobs)'}"
        if not data["converged"]:
            text += (f"; still ending after {wait_s:g}s: {', '.join(data['waiting_for'])} "
                     f"(status shows them as cancelling)")
    counts: dict = {}
    for state in data["states"].values():
        counts[state] = counts.get(state, 0) + 1
    text += "\n  shards: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    text += "".join(f"\n  note: {note}" for note in data.get("notes", []))
    return {"data": data, "text": text}
