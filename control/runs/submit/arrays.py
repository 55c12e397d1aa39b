"""Submit: plan, persist every record, then one held array, record its id, release.

Order matters: inputs, plan and agent exist before ``run.json`` (the commit marker); each
held array's job id is recorded in its submission record, then the arrays are released.
Nothing is written per shard: a first attempt has no folder or record until its agent
starts it (or ``cancel``/``status`` ends it); until then its submission record implies it
(``attempts.implied_attempt``: ``submitted`` with its task's job id once the record holds
the array's). A retry's attempts have ``created`` records, advanced to ``submitted`` with
one sync before the release. A crash anywhere leaves a state that ``status`` can explain
and finish (``recover_submissions``).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from synthbatch.agent_stdlib.arrays import task_job_id
from synthbatch.agent_stdlib.attempts import create_attempts, submit_attempts
from synthbatch.agent_stdlib.contracts import Plan, RunRecord, SubmissionRecord, sha256_bytes
from synthbatch.agent_stdlib.layout import RunLayout, job_name, runs_root
from synthbatch.agent_stdlib.statefile import (
    dumps,
    ensure_dir,
    publish_immutable,
    write_bytes_atomic,
    write_json_atomic,
    write_many,
)
from synthbatch.control.errors import SchedulerRejected, SchedulerUncertain, SynthbatchError
from synthbatch.control.runs.status.records import RECOVERY_GRACE_S
from synthbatch.control.runs.store import load_plan, load_submissions
from synthbatch.control.slurm.parsers import JobRow, split_job_id
from synthbatch.control.slurm.renderer import BatchScript, render_batch_script
from synthbatch.control.slurm.scheduler import Scheduler

if TYPE_CHECKING:
    from synthbatch.control.config.profile import Profile

HELD = "JobHeldUser"


@dataclass(frozen=True)
class Staged:
    """A run directory with everything the allocations need, before run.json."""

    layout: RunLayout
    plan: Plan
    plan_sha256: str
    agent_name: str
    agent_sha256: str


def stage_run(workspace: Path, plan: Plan, inputs: Dict[str, Path], agent_pyz: Path,
              agent_sha256: str, plan_bytes: Optional[bytes] = None,
              plan_sha256: Optional[str] = None) -> Staged:
    """Create the run directory: inputs, plan.json, agent and the (empty) shards folder.

    ``plan_bytes``/``plan_sha256`` are the plan as resolved (``runs/plan.resolve``), so
    the digest the batch script checks is computed once; without them they are made here.
    """
    root = ensure_dir(runs_root(workspace)) / plan.run_id
    root.mkdir(mode=0o700)
    layout = RunLayout(root)
    for folder in (layout.inputs, layout.submissions, layout.slurm_logs):
        ensure_dir(folder)
    for name, source in inputs.items():
        write_bytes_atomic(layout.inputs / name, source.read_bytes(), mode=0o600)
    if plan_bytes is None:
        plan_bytes = plan.to_json().encode("utf-8")
    publish_immutable(layout.plan_json, plan_bytes, mode=0o400)
    agent_name = f"agent-{agent_sha256}.pyz"
    write_bytes_atomic(root / agent_name, agent_pyz.read_bytes(), mode=0o400)
    ensure_dir(layout.shards)  # each shard's folder is made by its first writer
    return Staged(layout, plan, plan_sha256 or sha256_bytes(plan_bytes), agent_name,
                  agent_sha256)


def commit_run(staged: Staged, backend: str, warnings: Sequence[str] = (),
               overrides: Optional[Dict[str, str]] = None) -> RunRecord:
    """Write ``run.json``: from now on the run exists for every observer.

    ``warnings`` are the login-node checks' warnings, ``overrides`` the command line's
    overrides of the profile; both are kept in the record.
    """
    record = RunRecord(run_id=staged.plan.run_id, name=staged.plan.name,
                       created_at=time.time(), plan_sha256=staged.plan_sha256,
                       agent_pyz=staged.agent_name, agent_sha256=staged.agent_sha256,
                       backend=backend, job_name=job_name(staged.plan.run_id),
                       shard_count=len(staged.plan.shards), warnings=tuple(warnings),
                       overrides=dict(overrides or {}))
    publish_immutable(staged.layout.run_json, record.to_json().encode("utf-8"))
    return record


def array_groups(plan: Plan, shards: List[int]) -> List[Tuple[Optional[int], Dict[int, int]]]:
    """``(array index, {shard: task id})`` per Slurm array the shards belong to (pure)."""
    groups: Dict[Optional[int], Dict[int, int]] = {}
    for shard, index, task in plan.array_tasks(sorted(shards)):
        groups.setdefault(index, {})[shard] = task
    return sorted(groups.items(), key=lambda group: -1 if group[0] is None else group[0])


def submit_all(staged: Staged, profile: Profile, scheduler: Scheduler,
               attempts: Dict[int, int], implied: bool = False,
               withdraw: bool = False) -> List[SubmissionRecord]:
    """Submit ``attempts`` (shard -> attempt) as one held array per array of the plan.

    Three phases, so that a run of many arrays makes its attempts durable once: every
    array is sbatch-ed held and its job id recorded; then every attempt with a record (a
    retry's, ``created``) is recorded ``submitted`` with one sync; then every array is
    released. With ``implied`` (a submit's first attempts) the attempts have no record and
    get none: each submission record, once it holds its job id, implies them ``submitted``.
    Each submission record still goes ``job id`` -> ``released`` in that order, which
    recovery relies on. When an sbatch fails, the attempts it did not submit are left
    ``created`` (written now if they had no record), as a retry's are.

    With ``withdraw`` (a new run's submit), a run Slurm refused is not kept: when an sbatch
    is rejected (``SchedulerRejected``: Slurm answered no), the arrays held so far (never
    released, so never started) are scancelled and the run directory is removed, ``run.json``
    first; the error says so. Only if that scancel fails are they released as above.
    """
    existing = load_submissions(staged.layout)
    recorded = [r.job_id for r in existing if r.job_id]
    number = max((r.number for r in existing), default=0) + 1
    held: List[Tuple[SubmissionRecord, Dict[int, int], Dict[int, int]]] = []
    failure: Optional[BaseException] = None
    for array_index, tasks in array_groups(staged.plan, sorted(attempts)):
        mine = {shard: attempts[shard] for shard in tasks}
        try:
            record = _submit_held(staged, profile, scheduler, mine, number, recorded,
                                  array_index, tasks)
        except Exception as err:  # noqa: BLE001 - the arrays held so far still run
            failure = err
            break
        held.append((record, mine, tasks))
        recorded.append(record.job_id or "")
        number += 1
    if withdraw and isinstance(failure, SchedulerRejected) \
            and _withdrawn(staged.layout, scheduler, [r.job_id or "" for r, _, _ in held]):
        raise SchedulerRejected(f"{failure.message} (nothing was submitted: run "
                                f"{staged.plan.run_id} was not kept)",
                                hint="fix the profile or the flags Slurm refused, then "
                                     "submit again")
    _release_held(staged.layout, staged.plan.run_id, scheduler, held, implied)
    if failure is not None:
        _leave_created(staged, attempts, {shard for _, mine, _ in held for shard in mine})
        raise failure
    return [record.replace(released=True) for record, _, _ in held]


def _withdrawn(layout: RunLayout, scheduler: Scheduler, held: List[str]) -> bool:
    """scancel the held (never released) arrays of a run Slurm refused and remove the run:
    ``run.json`` first (from then on observers call it uncommitted), then its directory.
    False (nothing removed) when the scancel failed: the arrays may still be queued."""
    try:
        scheduler.cancel(held)
    except SynthbatchError:
        return False
    layout.run_json.unlink(missing_ok=True)
    remove_uncommitted(layout)
    return True


def _leave_created(staged: Staged, attempts: Dict[int, int], done: Set[int]) -> None:
    """Give the attempts an sbatch failure left unsubmitted a ``created`` record (their
    folders made first), unless they have one: ``retry`` submits them."""
    layout = staged.layout
    todo = [(shard, attempt) for shard, attempt in sorted(attempts.items())
            if shard not in done and not layout.attempt(shard, attempt).attempt_json.exists()]
    for shard, attempt in todo:
        ensure_dir(layout.attempt(shard, attempt).root)
    create_attempts((layout.attempt(shard, attempt).attempt_json, staged.plan.run_id, shard,
                     attempt, None) for shard, attempt in todo)


def _release_held(layout: RunLayout, run_id: str, scheduler: Scheduler,
                  held: List[Tuple[SubmissionRecord, Dict[int, int], Dict[int, int]]],
                  implied: bool) -> None:
    """Record the held arrays' attempts ``submitted`` (one sync; none when their records
    are ``implied``), then release each, then record every release (one sync for all: a
    record still saying not released after a crash is released again by recovery, which
    only asks Slurm to release a job that is still held)."""
    if not implied:
        submit_attempts((layout.attempt_json_path(shard, attempt), run_id, shard, attempt,
                         task_job_id(str(record.job_id), tasks[shard]), record.number)
                        for record, mine, tasks in held
                        for shard, attempt in sorted(mine.items()))
    released = []
    try:
        for record, _, _ in held:
            scheduler.release(str(record.job_id))
            released.append(record)
    finally:
        write_many((layout.submission_json(record.number),
                    dumps(record.replace(released=True).to_dict())) for record in released)


def _submit_held(staged: Staged, profile: Profile, scheduler: Scheduler,
                 attempts: Dict[int, int], number: int, recorded: List[str],
                 array_index: Optional[int], tasks: Dict[int, int]) -> SubmissionRecord:
    """One held sparse array for ``attempts`` (shard -> attempt), its job id recorded.

    ``tasks`` maps each shard to its array task id (the shard itself when the plan has one
    array); ``array_index`` tells the agent which of the plan's arrays this job is.
    """
    layout, plan = staged.layout, staged.plan
    script = layout.submission_script(number)
    write_bytes_atomic(script, render_batch_script(BatchScript(
        job_name=job_name(plan.run_id), run_dir=str(layout.root), agent_pyz=staged.agent_name,
        agent_sha256=staged.agent_sha256, plan_sha256=staged.plan_sha256, submission=number,
        python=profile.python, resources=plan.resources, signal_lead_s=profile.signal_lead_s,
        slurm_bin=profile.slurm_bin, array_index=array_index,
        export=plan.job_env())).encode("utf-8"), mode=0o700)
    record = SubmissionRecord(number=number, argv=(), job_id=None,
                              attempts={str(k): v for k, v in sorted(attempts.items())},
                              submitted_at=time.time(), released=False)
    write_json_atomic(layout.submission_json(number), record.to_dict())
    throttle = plan.array_throttle or profile.array_throttle
    job_id, argv = sbatch_adopting(scheduler, str(script), sorted(tasks.values()), throttle,
                           job_name(plan.run_id), recorded)
    record = record.replace(argv=tuple(argv), job_id=job_id)
    write_json_atomic(layout.submission_json(number), record.to_dict())
    return record


def sbatch_adopting(scheduler: Scheduler, script: str, indices: List[int], throttle: int,
            name: str, recorded: List[str]) -> tuple[str, List[str]]:
    """sbatch; when its outcome is unknown, look for the job by name before resubmitting."""
    for tries in (1, 2):
        try:
            return scheduler.submit_held_array(script, indices, throttle, name)
        except SchedulerUncertain:
            found = unrecorded_jobs(scheduler.jobs_named(name), recorded)
            if len(found) == 1:
                return found[0], ["sbatch", "(adopted by job name after an unclear answer)"]
            if found or tries == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def unrecorded_jobs(rows: List[JobRow], recorded: List[str]) -> List[str]:
    """Array job ids among ``rows`` that no submission record names, ascending."""
    ids = {split_job_id(row.job_id)[0] for row in rows}
    return sorted(ids - set(recorded), key=int)


def adopt(layout: RunLayout, record: SubmissionRecord, job_id: str) -> SubmissionRecord:
    """Record ``job_id`` for a submission whose sbatch answer was lost."""
    record = record.replace(job_id=job_id, argv=("sbatch", "(adopted by job name)"))
    write_json_atomic(layout.submission_json(record.number), record.to_dict())
    return record


def mark_submitted(layout: RunLayout, plan: Plan, record: SubmissionRecord) -> None:
    """Record the attempts of a held submission that are still ``created`` (a retry's, its
    submit died before advancing them) ``submitted`` (one sync). Attempts without a record
    need nothing: the record's job id implies them ``submitted``."""
    assert record.job_id is not None
    job_id = record.job_id
    pairs = [(shard, attempt) for shard, attempt in sorted((int(k), v)
                                                           for k, v in record.attempts.items())
             if os.path.lexists(layout.attempt_json_path(shard, attempt))]
    submit_attempts(((layout.attempt_json_path(shard, attempt), plan.run_id, shard, attempt,
                      task_job_id(job_id, plan.array_task(shard)[1]), record.number)
                     for shard, attempt in pairs), only_created=True)


def recover_submissions(layout: RunLayout, scheduler: Scheduler, committed: bool,
                        records: List[SubmissionRecord], rows: List[JobRow],
                        now: Optional[float] = None) -> List[str]:
    """Finish submissions a crash interrupted; return one note per action taken.

    ``rows`` are squeue's rows for the run's job name. A job with that name that no record
    names is adopted by the oldest submission without a job id, or cancelled (a duplicate,
    or the run never committed). A recorded job never released is released once its
    attempts say ``submitted``. Nothing happens while any submission is younger than
    RECOVERY_GRACE_S: its ``submit`` may still be running.
    """
    now = time.time() if now is None else now
    if any(now - r.submitted_at < RECOVERY_GRACE_S for r in records):
        return []
    active = [r for r in rows if not r.terminal]
    held = {split_job_id(r.job_id)[0] for r in active if r.reason == HELD}
    orphans = unrecorded_jobs(active, [str(r.job_id) for r in records if r.job_id])
    notes: List[str] = []
    plan: Optional[Plan] = None  # read (and validated) only when attempts need job ids
    for record in records if committed else []:
        if record.job_id is None and orphans:
            record = adopt(layout, record, orphans.pop(0))
            notes.append(f"submission {record.number}: adopted job {record.job_id}")
        if record.job_id is not None and not record.released:
            plan = plan or load_plan(layout)
            mark_submitted(layout, plan, record)
            if record.job_id in held:
                scheduler.release(str(record.job_id))
            write_json_atomic(layout.submission_json(record.number),
                              record.replace(released=True).to_dict())
            notes.append(f"submission {record.number}: job {record.job_id} released")
    if orphans:
        scheduler.cancel(orphans)
        why = "duplicate submission" if committed else "the run never committed"
        notes.append(f"cancelled unrecorded job(s) {', '.join(orphans)} ({why})")
    return notes


def remove_uncommitted(layout: RunLayout) -> None:
    """Delete a run directory whose submit failed before ``run.json`` was written."""
    if not layout.run_json.exists():
        shutil.rmtree(layout.root, ignore_errors=True)
