"""The ``synthbatch`` command line: a thin shell over ``control.api``."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import click

from control.cli.output import emit_error, emit_json, status_lines

F = Callable[..., Any]


def common(func: F) -> F:
    """Add ``--profile``, ``--json`` and ``--debug``; map errors to exit codes once."""

    @click.option("--profile", "profile", default=None,
                  help="Profile name or path (default: $SYNTHBATCH_PROFILE, then 'default').")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    @click.option("--debug", is_flag=True, help="Show tracebacks.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, debug: bool, **kwargs: Any) -> None:
        try:
            result = func(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the one place errors become exit codes
            if debug:
                raise
            sys.exit(emit_error(err, as_json))
        if as_json:
            emit_json(result["data"])
        else:
            click.echo(result["text"])

    return wrapper


@click.group()
@click.version_option(package_name="synthbatch")
def cli() -> None:
    """Run large LLM synthetic-data generation jobs on Slurm."""


@cli.command("plan")
@click.argument("run_file", type=click.Path(path_type=Path))
@common
def plan_cmd(run_file: Path, profile: Optional[str]) -> Any:
    """Validate and resolve RUN_FILE; print the plan summary and the batch script."""
    from control import api

    data = api.plan(run_file, profile)
    shards = data["plan"]["shards"]
    text = (f"run {data['plan']['name']}: {data['records']} records in {data['shards']} "
            f"shards ({shards[0]['num_records']} per shard at most)\n"
            f"--- batch script ---\n{data['script']}")
    return {"data": data, "text": text}


@cli.command("submit")
@click.argument("run_file", type=click.Path(path_type=Path))
@common
def submit_cmd(run_file: Path, profile: Optional[str]) -> Any:
    """Submit RUN_FILE as one Slurm job array; print the run id."""
    from control import api

    data = api.submit(run_file, profile)
    return {"data": data, "text": data["run_id"]}


@cli.command("status")
@click.argument("run_id")
@common
def status_cmd(run_id: str, profile: Optional[str]) -> Any:
    """Show the shards of RUN_ID by state, with records done and failure reasons."""
    from control import api

    data = api.status(run_id, profile)
    return {"data": data, "text": status_lines(data)}


@cli.command("merge")
@click.argument("run_id")
@click.option("--output", type=click.Path(path_type=Path), default=None,
              help="Output JSONL file (default: <run>/merged/records.jsonl).")
@click.option("--allow-partial", is_flag=True, help="Merge the shards that have winners.")
@common
def merge_cmd(run_id: str, output: Optional[Path], allow_partial: bool,
              profile: Optional[str]) -> Any:
    """Concatenate the verified winners of RUN_ID in shard order."""
    from control import api

    data = api.merge(run_id, output, allow_partial, profile)
    return {"data": data,
            "text": f"merged {data['records']} records into {data['output']}"}


@cli.command("runs")
@common
def runs_cmd(profile: Optional[str]) -> Any:
    """List the runs of the workspace, newest first."""
    from control import api

    data = api.runs(profile)
    lines = [f"{r['run_id']}  {r.get('shards', '?')} shards" for r in data["runs"]]
    return {"data": data, "text": "\n".join(lines) or "no runs"}


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="synthbatch")
