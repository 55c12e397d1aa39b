"""Submit: plan, persist every record, then one held array, record its id, release.

Order matters: inputs, plan, agent and ``created`` attempts exist before ``run.json``
(the commit marker); the job id is recorded (``submitted``) before ``scontrol release``,
so a crash anywhere leaves a state that ``status`` can explain.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

from agent_stdlib import states
from agent_stdlib.attempts import advance_attempt, create_attempt
from agent_stdlib.contracts import Plan, RunRecord, SubmissionRecord, sha256_bytes
from agent_stdlib.layout import RunLayout
from agent_stdlib.statefile import (
    ensure_dir,
    publish_immutable,
    write_bytes_atomic,
    write_json_atomic,
)
from control.config.profile import Profile
from control.runs.store import runs_root
from control.slurm.renderer import BatchScript, render_batch_script
from control.slurm.runner import CommandTimeout
from control.slurm.scheduler import Scheduler


@dataclass(frozen=True)
class Staged:
    """A run directory with everything the allocations need, before run.json."""

    layout: RunLayout
    plan: Plan
    plan_sha256: str
    agent_name: str
    agent_sha256: str


def job_name(run_id: str) -> str:
    """The Slurm job name of every job of a run (used to find unrecorded submissions)."""
    return f"synthbatch-{run_id}"


def _copy_private(source: Path, target: Path, mode: int) -> None:
    write_bytes_atomic(target, source.read_bytes(), mode=mode)


def stage_run(workspace: Path, plan: Plan, inputs: Dict[str, Path], agent_pyz: Path,
              agent_sha256: str) -> Staged:
    """Create the run directory: inputs, plan.json, agent and ``created`` attempts."""
    root = ensure_dir(runs_root(workspace)) / plan.run_id
    root.mkdir(mode=0o700)
    layout = RunLayout(root)
    for folder in (layout.inputs, layout.submissions, layout.slurm_logs):
        ensure_dir(folder)
    for name, source in inputs.items():
        _copy_private(source, layout.inputs / name, 0o600)
    plan_bytes = plan.to_json().encode("utf-8")
    publish_immutable(layout.plan_json, plan_bytes, mode=0o400)
    agent_name = f"agent-{agent_sha256}.pyz"
    _copy_private(agent_pyz, root / agent_name, 0o400)
    for shard in plan.shards:
        paths = layout.attempt(shard.index, 1)
        ensure_dir(paths.root)
        create_attempt(paths.attempt_json, plan.run_id, shard.index, 1)
    return Staged(layout, plan, sha256_bytes(plan_bytes), agent_name, agent_sha256)


def commit_run(staged: Staged, backend: str) -> RunRecord:
    """Write ``run.json``: from now on the run exists for every observer."""
    record = RunRecord(run_id=staged.plan.run_id, name=staged.plan.name,
                       created_at=time.time(), plan_sha256=staged.plan_sha256,
                       agent_pyz=staged.agent_name, agent_sha256=staged.agent_sha256,
                       backend=backend, job_name=job_name(staged.plan.run_id),
                       shard_count=len(staged.plan.shards))
    publish_immutable(staged.layout.run_json, record.to_json().encode("utf-8"))
    return record


def submit_attempts(staged: Staged, profile: Profile, scheduler: Scheduler,
                    attempts: Dict[int, int], number: int,
                    recorded: List[str]) -> SubmissionRecord:
    """One held sparse array for ``attempts`` (shard -> attempt), recorded, then released."""
    layout, plan = staged.layout, staged.plan
    script = layout.submission_script(number)
    write_bytes_atomic(script, render_batch_script(BatchScript(
        job_name=job_name(plan.run_id), run_dir=str(layout.root), agent_pyz=staged.agent_name,
        agent_sha256=staged.agent_sha256, plan_sha256=staged.plan_sha256, submission=number,
        python=profile.python, resources=plan.resources, signal_lead_s=profile.signal_lead_s,
        slurm_bin=profile.slurm_bin)).encode("utf-8"), mode=0o700)
    record = SubmissionRecord(number=number, argv=(), job_id=None,
                              attempts={str(k): v for k, v in sorted(attempts.items())},
                              submitted_at=time.time(), released=False)
    write_json_atomic(layout.submission_json(number), record.to_dict())
    job_id, argv = _sbatch(scheduler, str(script), sorted(attempts), profile.array_throttle,
                           job_name(plan.run_id), recorded)
    record = record.replace(argv=tuple(argv), job_id=job_id)
    write_json_atomic(layout.submission_json(number), record.to_dict())
    for shard, attempt in sorted(attempts.items()):
        advance_attempt(layout.attempt(shard, attempt).attempt_json, states.SUBMITTED,
                        job_id=f"{job_id}_{shard}", submission=number)
    scheduler.release(job_id)
    record = record.replace(released=True)
    write_json_atomic(layout.submission_json(number), record.to_dict())
    return record


def _sbatch(scheduler: Scheduler, script: str, indices: List[int], throttle: int,
            name: str, recorded: List[str]) -> tuple[str, List[str]]:
    try:
        return scheduler.submit_held_array(script, indices, throttle, name)
    except CommandTimeout:
        # sbatch may have succeeded: adopt the one job with our name that no record names.
        new = sorted(set(scheduler.jobs_named(name)) - set(recorded))
        if len(new) == 1:
            return new[0], ["sbatch", "(adopted by job name after a timeout)"]
        raise


def remove_uncommitted(layout: RunLayout) -> None:
    """Delete a run directory whose submit failed before ``run.json`` was written."""
    if not layout.run_json.exists():
        shutil.rmtree(layout.root, ignore_errors=True)
