"""``synthbatch plan``: the dry run, with the checks this login node can make."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import click

from synthbatch.control.cli.common import common, slurm_overrides

MARK = {"ok": "ok  ", "warning": "warn", "error": "FAIL"}


def checks_text(checks: List[Dict[str, str]]) -> List[str]:
    """The checks as ``plan`` and ``submit`` print them: what was checked here, then what
    only the compute node can tell."""
    from synthbatch.control.readapi import NODE_ONLY

    here = [c for c in checks if c["level"] != "node"]
    there = [c for c in checks if c["level"] == "node"]
    lines = ["checks on this login node:"] if here else []
    lines += [f"  {MARK[c['level']]}  {c['field']}: {c['message']}" for c in here]
    lines.append("checked on the compute node (preflight, before any server starts):")
    lines += [f"  {c['field']}: {c['message']}" for c in there]
    lines.append(f"  always: {NODE_ONLY}")
    return lines


def refusal(checks: List[Dict[str, str]], what: str) -> Optional[Exception]:
    """InvalidInput for the checks that are errors (None when there are none)."""
    from synthbatch.control.errors import InvalidInput

    bad = [c for c in checks if c["level"] == "error"]
    if not bad:
        return None
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return InvalidInput(f"{what}: {bad[0]['field']}: {bad[0]['message']}{more}",
                        hint="submit refuses a run with a failed check")


@click.command("plan")
@click.argument("run_file", type=click.Path(path_type=Path))
@slurm_overrides
@click.option("--reuse", "reuse", multiple=True, metavar="RUN_ID",
              help="Say which LLM columns this earlier run would give (repeatable).")
@common
def plan_cmd(run_file: Path, partition: Optional[str], account: Optional[str],
             qos: Optional[str], time_limit: Optional[str], reservation: Optional[str],
             gpus: Optional[int], deadline_hours: Optional[float], pilot: Optional[str],
             reuse: Tuple[str, ...], profile: Optional[str], as_json: bool) -> Any:
    """Validate and resolve RUN_FILE; check what this login node can see (paths, serving
    environments, images, secrets, whether the request fits the partition's nodes); print
    the plan summary, the checks and the batch script. Exits 2 when a check failed."""
    from synthbatch.control import api
    from synthbatch.control.cli.output import emit_json, emit_text

    data = api.plan(run_file, profile, partition=partition, account=account, qos=qos,
                    time_limit=time_limit, reservation=reservation, gpus=gpus,
                    deadline_hours=deadline_hours, pilot=pilot, reuse=reuse).to_dict()
    text = "\n".join([data["summary"].rstrip(), *checks_text(data["checks"]),
                      "--- batch script ---", data["script"].rstrip("\n")])
    error = refusal(data["checks"], "check failed")
    if error is None:
        return {"data": data, "text": text}
    emit_json(data) if as_json else emit_text(text)
    raise error
