"""``synthbatch retry``."""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

import click

from synthbatch.control.cli.common import common, run_id_argument
from synthbatch.control.cli.output import emit_json, emit_text
from synthbatch.control.errors import Conflict, InvalidInput


def interactive() -> bool:
    """True when a person can answer a prompt (stdin is a terminal)."""
    return sys.stdin.isatty()


def describe(data: Dict[str, Any]) -> str:
    """One line per shard (attempt, where it resumes from), then the submissions."""
    lines = []
    for item in data["shards"]:
        resume = (f", resumes {item['resume_records']} record(s) of attempt "
                  f"{item['resume_from']}" if item["resume_from"] else ", starts clean")
        lines.append(f"  shard {item['shard']}: attempt {item['attempt']}{resume}")
    for sub in data["submissions"]:
        lines.append(f"  submission {sub['number']}: job {sub['job_id']} "
                     f"({len(sub['shards'])} shard(s))")
    lines.extend(f"  not retried: {why}" for why in data["exhausted"] + data["skipped"])
    lines.extend(f"  past the limit: {why}" for why in data.get("over_limit", ()))
    return "\n".join(lines)


@click.command("retry")
@run_id_argument()
@click.option("--shard", "shards", type=click.IntRange(min=0), multiple=True,
              help="Retry only this shard (repeatable; default: every shard whose latest "
                   "attempt failed or was cancelled, without a winner).")
@click.option("--resume", type=click.Choice(["auto", "always", "never"]), default=None,
              help="Continue from a previous attempt's kept output (default: the run's "
                   "resume policy).")
@click.option("--auto", "auto", is_flag=True,
              help="Only failed shards below the run's max_attempts; never prompts.")
@click.option("--dry-run", is_flag=True, help="Show what would be submitted; submit nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@common
def retry_cmd(run_id: str, shards: Tuple[int, ...], resume: Optional[str], auto: bool,
              dry_run: bool, yes: bool, profile: Optional[str], as_json: bool) -> Any:
    """Submit the next attempt of RUN_ID's failed or cancelled shards (one held array)."""
    from synthbatch.control import api

    if not (yes or auto or dry_run):
        if as_json or not interactive():
            raise InvalidInput("retry needs --yes when it cannot ask (not a terminal or --json)")
        preview = api.retry(run_id, shards, resume, dry_run=True, profile=profile)
        if not preview["shards"]:
            return _report(run_id, preview, as_json)
        emit_text(f"run {run_id}: would submit\n{describe(preview)}")
        if not click.confirm("Submit?", default=False):
            return {"data": {**preview, "aborted": True}, "text": "aborted; nothing submitted"}
    return _report(run_id, api.retry(run_id, shards, resume, dry_run=dry_run, auto=auto,
                                     profile=profile), as_json)


def _report(run_id: str, data: Dict[str, Any], as_json: bool) -> Dict[str, Any]:
    """What retry did; exit 4 (after saying so) when shards were skipped as damaged."""
    dry_run = data["dry_run"]
    if not data["shards"]:
        text = f"run {run_id}: nothing to retry"
        if data["exhausted"] or data["skipped"]:
            text += "\n" + describe(data)
    else:
        verb = "would submit" if dry_run else "submitted"
        text = f"run {run_id}: {verb}\n{describe(data)}"
    if not data["skipped"]:
        return {"data": data, "text": text}
    # Shards with damaged records were left out: say what was done, then exit 4 so that a
    # script knows not every shard that needs a retry got one.
    if as_json:
        emit_json(data)
    else:
        emit_text(text)
    raise Conflict(f"run {run_id}: {len(data['skipped'])} shard(s) not retried: "
                   + "; ".join(data["skipped"]),
                   hint="repair or move aside the damaged records, then retry them")
