"""What the batch script told the agent: arguments, the verified plan, shard and attempt.

The shard comes from ``--shard``, or from the array task (``SLURM_ARRAY_TASK_ID``, or
``SYNTHBATCH_LOCAL_ARRAY_TASK_ID`` under the local backend): with ``plan.arrays`` the batch
script passes ``--array-index K`` and the task id maps to a shard through
:func:`agent_stdlib.arrays.task_shard` (the one home of that rule). Without
``--array-index`` (scripts rendered before arrays existed) a plan with one array behaves as
before: task id == shard index.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Tuple

from .. import localjob
from ..arrays import array_task, task_job_id, task_shard
from ..attempts import implied_attempt
from ..contracts import (
    MAX_REQUEUES_ENV,
    SCHEMA_VERSION,
    AttemptRecord,
    Plan,
    SubmissionRecord,
    sha256_bytes,
)
from ..layout import FIRST_ATTEMPT, RunLayout
from ..statefile import read_bytes, read_json
from .errors import AllocationFailure


@dataclass(frozen=True)
class Invocation:
    """What the batch script told the agent."""

    layout: RunLayout
    plan: Plan
    shard: int
    attempt: int
    agent_pyz: Path
    max_requeues: int = 0
    array_task: Optional[int] = None  # the array task id that runs ``shard``
    # the attempt's first revision as its submission record implies it (used while the
    # attempt has no attempt.json: a submit's first attempts get none until they start)
    first: Optional[AttemptRecord] = None


def load_verified_plan(path: Path, expected_sha256: str) -> Plan:
    """Read the plan, check its sha256 and schema, and return it.

    The plan is parsed from the very bytes whose digest was checked (reading the file
    again could see other bytes).
    """
    raw = read_bytes(path)
    if raw is None:
        raise AllocationFailure(f"{path}: plan is missing")
    digest = sha256_bytes(raw)
    if digest != expected_sha256:
        raise AllocationFailure(f"{path}: sha256 {digest} does not match {expected_sha256}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as err:
        raise AllocationFailure(f"{path}: not valid JSON ({err})") from err
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise AllocationFailure(f"{path}: unknown plan schema_version {version!r}")
    return Plan.from_dict(data)


def resolve_shard(plan: Plan, env: Mapping[str, str], shard: Optional[int],
                  array_index: Optional[int]) -> Tuple[int, int]:
    """``(shard, array task id)`` of this execution; AllocationFailure names what is off."""
    try:
        if shard is not None:
            index, task = plan.array_task(shard)
            if array_index is not None and index != array_index:
                raise AllocationFailure(f"shard {shard} is task {task} of array {index}, not "
                                        f"of --array-index {array_index}")
            return shard, task
        raw = env.get("SLURM_ARRAY_TASK_ID", "")
        if plan.runtime.launcher == "local":  # the local backend names it its own way
            raw = env.get(localjob.ARRAY_TASK_ID) or raw
        if not raw.isdigit():
            raise AllocationFailure("SLURM_ARRAY_TASK_ID is not set (not an array task?); "
                                    "pass --shard")
        if array_index is None and len(plan.arrays) > 1:
            raise AllocationFailure(f"the plan has {len(plan.arrays)} arrays and the batch "
                                    "script passed no --array-index")
        task = int(raw)
        return task_shard(plan.arrays, array_index, task), task
    except ValueError as err:  # ArrayError, or ContractError from plan.array_task
        raise AllocationFailure(str(err)) from err


def parse_args(argv: List[str]) -> argparse.Namespace:
    """The ``allocation`` role's arguments."""
    parser = argparse.ArgumentParser(prog="agent allocation")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--plan-sha256", required=True)
    parser.add_argument("--submission", required=True, type=int)
    parser.add_argument("--agent-pyz", required=True, type=Path)
    parser.add_argument("--shard", type=int, default=None,
                        help="shard index (default: from the array task)")
    parser.add_argument("--array-index", type=int, default=None,
                        help="which of plan.arrays this job is (default: the only one)")
    parser.add_argument("--max-requeues", type=int,
                        default=int(os.environ.get(MAX_REQUEUES_ENV, "0") or 0),
                        help="requeue the job on SIGUSR1 while SLURM_RESTART_COUNT is below "
                             "(default: $SYNTHBATCH_MAX_REQUEUES, set by the batch script)")
    return parser.parse_args(argv)


def invocation(args: argparse.Namespace, env: Mapping[str, str]) -> Invocation:
    """Load and cross-check everything the arguments name."""
    layout = RunLayout(args.run_dir)
    plan = load_verified_plan(layout.plan_json, args.plan_sha256)
    shard, task = resolve_shard(plan, env, args.shard, args.array_index)
    plan.shard(shard)
    data = read_json(layout.submission_json(args.submission))
    if data is None:
        raise AllocationFailure(f"{layout.submission_json(args.submission)}: missing")
    submission = SubmissionRecord.from_dict(data)
    if str(shard) not in submission.attempts:
        raise AllocationFailure(f"submission {args.submission} carries no shard {shard}")
    attempt = submission.attempts[str(shard)]
    number = task if task is not None else array_task(plan.arrays, shard)[1]
    job_id = task_job_id(submission.job_id, number) if submission.job_id else None
    first = implied_attempt(plan.run_id, shard, attempt, job_id, submission.number,
                            submission.submitted_at) if attempt == FIRST_ATTEMPT else None
    return Invocation(layout=layout, plan=plan, shard=shard, attempt=attempt,
                      agent_pyz=args.agent_pyz, max_requeues=max(0, args.max_requeues),
                      array_task=task, first=first)
