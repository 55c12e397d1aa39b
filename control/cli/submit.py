"""``synthbatch submit`` (with ``--wait``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Tuple

import click

from synthbatch.control.cli.common import common, slurm_overrides
from synthbatch.control.cli.wait import finish, wait_options, wait_until_over


@click.command("submit")
@click.argument("run_file", type=click.Path(path_type=Path))
@slurm_overrides
@click.option("--wait", "wait", is_flag=True,
              help="Then wait until the run ends; exit as `synthbatch wait` does.")
@click.option("--reuse", "reuse", multiple=True, metavar="RUN_ID",
              help="Take LLM cells whose request is identical from this earlier run "
                   "(repeatable; docs/generator.md \"Reusing an earlier run\").")
@click.option("--merge-to", "merge_to", metavar="PATH",
              help="Once the run is over, a CPU-only job merges it into PATH (docs/retry.md "
                   "\"Merge on completion\").")
@click.option("--format", "merge_format", type=click.Choice(["jsonl", "parquet"]),
              default=None, help="Format of the --merge-to merge (default: the run file's, "
                                 "else jsonl).")
@click.option("--allow-partial", "allow_partial", is_flag=True,
              help="Merge the shards that won even when others used every attempt.")
@wait_options
@common
def submit_cmd(run_file: Path, partition: Optional[str], account: Optional[str],
               qos: Optional[str], time_limit: Optional[str], reservation: Optional[str],
               gpus: Optional[int], deadline_hours: Optional[float], pilot: Optional[str],
               wait: bool, reuse: Tuple[str, ...], merge_to: Optional[str],
               merge_format: Optional[str], allow_partial: bool, timeout_s: Optional[float],
               interval: float, quiet: bool, profile: Optional[str], as_json: bool) -> Any:
    """Submit RUN_FILE as one Slurm job array; print the run id.

    Refuses (exit 2, nothing submitted) what `synthbatch plan` calls a failed check, and
    keeps no run when Slurm refuses the sbatch (exit 2, Slurm's message);
    warnings go to stderr and into the run's run.json. -p/-A/-q/-t/--reservation override
    the profile for this run (recorded in run.json and the plan). With --wait: the run
    id, then progress on stderr until the run ends, then its status; exit 0 only if every
    shard succeeded (6 failed, 7 cancelled, 8 --timeout, 9 it can never end).
    """
    from synthbatch.control import api
    from synthbatch.control.cli.output import emit_text

    run = api.submit(run_file, profile, partition=partition, account=account, qos=qos,
                     time_limit=time_limit, reservation=reservation, gpus=gpus,
                     deadline_hours=deadline_hours, pilot=pilot, reuse=reuse,
                     merge_to=merge_to, merge_format=merge_format, allow_partial=allow_partial)
    data = run.to_dict()
    for line in data["warnings"]:
        emit_text(f"synthbatch: warning: {line}", err=True)
    if not wait:
        return {"data": data, "text": data["run_id"]}
    if not as_json:
        click.echo(data["run_id"])  # first, so a script has it while the run goes on
    final = wait_until_over(run.run_id, profile, timeout_s, interval, quiet or as_json)
    finish(final, as_json, extra=data)
    return None
