"""One Slurm array shared by several runs: the benchmark cases of one shape.

Every member stays an ordinary run (its own plan, records, status, cancel, retry and
merge). Its plan places its tasks at ``[first_task, first_task + n)`` of the array
(``ArraySpec.first_task``, mapped by ``agent_stdlib.arrays``); the batch script
(``render_shared_script``) picks the member of ``$SLURM_ARRAY_TASK_ID``. Each member's
submission record names the array's job name, the whole group (``<run id>/<number>``)
and its own task ids, so that status and cancel ask for and scancel only its tasks
(``12_3``, never the array ``12``), and GPU-hours count only its tasks.

Submit is ``submit_all``'s protocol lifted to the group: every member's record (no job
id yet) -> one held ``sbatch`` -> the job id in every member's record (which implies its
first attempts ``submitted``: they get no record of their own) -> release -> every record
``released``. A crash anywhere leaves
records that :func:`recover_shared`, run from any member's status, finishes for the
whole group: the job id one member recorded (else the one job of the shared name) is
adopted by the others, their attempts marked, the job released. It never cancels a
shared job (the other members' tasks are in it): two jobs of one shared name are named
in a note instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import Plan, SubmissionRecord
from synthbatch.agent_stdlib.layout import JOB_PREFIX, RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    canonical,
    load_record,
    write_bytes_atomic,
    write_json_atomic,
)
from synthbatch.control.runs.status.records import RECOVERY_GRACE_S
from synthbatch.control.runs.store import load_plan, load_submissions
from synthbatch.control.runs.submit import arrays
from synthbatch.control.runs.submit.arrays import HELD, Staged, mark_submitted
from synthbatch.control.slurm.parsers import split_job_id
from synthbatch.control.slurm.renderer import BatchScript, SharedMember, render_shared_script
from synthbatch.control.slurm.scheduler import Scheduler

if TYPE_CHECKING:
    from synthbatch.control.config.profile import Profile


def shape(plan: Plan) -> str:
    """What makes runs share an array: the allocation they ask Slurm for (every
    ``#SBATCH`` line comes from ``plan.resources`` and the profile)."""
    return canonical(dataclasses.asdict(plan.resources))


def groups(plans: Sequence[Plan], max_array_size: Optional[int]
           ) -> List[List[Tuple[int, int]]]:
    """Indices of ``plans`` grouped by :func:`shape`, each with its first task id.

    Pure. Members keep their order; a group is closed when the next member's tasks would
    reach ``max_array_size`` (Slurm refuses task ids at or above it); a run with more
    shards than fit alone is a group of its own at task 0 (its plan's arrays split it).
    """
    limit = max_array_size or None
    open_groups: Dict[str, List[Tuple[int, int]]] = {}
    ends: Dict[str, int] = {}
    done: List[List[Tuple[int, int]]] = []
    for index, plan in enumerate(plans):
        key, count = shape(plan), len(plan.shards)
        start = ends.get(key, 0)
        if key in open_groups and limit is not None and start + count > limit:
            done.append(open_groups.pop(key))
            start = 0
        if limit is not None and count > limit:
            done.append([(index, 0)])
            continue
        open_groups.setdefault(key, []).append((index, start))
        ends[key] = start + count
    done.extend(open_groups.values())
    return sorted(done, key=lambda group: group[0][0])


def shared_job_name(group: Sequence[str]) -> str:
    """The job name of a shared array: unique to its group of submissions."""
    digest = hashlib.sha256("\n".join(group).encode("utf-8")).hexdigest()[:16]
    return f"{JOB_PREFIX}shared-{digest}"


def _next_number(layout: RunLayout) -> int:
    return max((r.number for r in load_submissions(layout)), default=0) + 1


def submit_shared(members: Sequence[Staged], profile: Profile, scheduler: Scheduler
                  ) -> List[SubmissionRecord]:
    """Submit every shard's attempt 1 of ``members`` (runs of one shape, their plans at
    disjoint ``first_task`` ranges of one array) as one held array; return each member's
    submission record, in order."""
    numbers = [_next_number(m.layout) for m in members]
    group = tuple(f"{m.plan.run_id}/{n}" for m, n in zip(members, numbers))
    name = shared_job_name(group)
    tasks = [{s.index: m.plan.array_task(s.index)[1] for s in m.plan.shards} for m in members]
    lead = members[0]
    if any(m.agent_sha256 != lead.agent_sha256 for m in members):
        raise ValueError("the runs of a shared array must have one agent bundle")
    indices = sorted(t for mine in tasks for t in mine.values())
    if len(set(indices)) != len(indices):
        raise ValueError("the runs of a shared array must have disjoint task ranges")
    spec = BatchScript(job_name=name, run_dir=str(lead.layout.root),
                       agent_pyz=lead.agent_name, agent_sha256=lead.agent_sha256,
                       plan_sha256=lead.plan_sha256, submission=numbers[0],
                       python=profile.python, resources=lead.plan.resources,
                       signal_lead_s=profile.signal_lead_s, slurm_bin=profile.slurm_bin,
                       log_name="shared-%A_%a.out",
                       # every member's allow-list: each agent narrows its steps to its own
                       export=tuple(sorted(set().union(*(m.plan.job_env() for m in members)))))
    script = render_shared_script(spec, [
        SharedMember(first_task=min(t.values()), count=len(t), run_dir=str(m.layout.root),
                     plan_sha256=m.plan_sha256, submission=n,
                     array_index=m.plan.array_task(0)[0])
        for m, n, t in zip(members, numbers, tasks)]).encode("utf-8")
    records = []
    for member, number, mine in zip(members, numbers, tasks):
        write_bytes_atomic(member.layout.submission_script(number), script, mode=0o700)
        record = SubmissionRecord(number=number, argv=(), job_id=None,
                                  attempts={str(k): 1 for k in sorted(mine)},
                                  submitted_at=time.time(), released=False, job_name=name,
                                  group=group, tasks=tuple(mine[k] for k in sorted(mine)))
        write_json_atomic(member.layout.submission_json(number), record.to_dict())
        records.append(record)
    throttle = lead.plan.array_throttle or profile.array_throttle
    job_id, argv = arrays.sbatch_adopting(
        scheduler, str(lead.layout.submission_script(numbers[0])), indices, throttle, name, [])
    records = [r.replace(argv=tuple(argv), job_id=job_id) for r in records]
    for member, record in zip(members, records):
        write_json_atomic(member.layout.submission_json(record.number), record.to_dict())
    # the first attempts have no records: each member's record, with the job id, implies them
    scheduler.release(job_id)
    records = [r.replace(released=True) for r in records]
    for member, record in zip(members, records):
        write_json_atomic(member.layout.submission_json(record.number), record.to_dict())
    return records


def _member(layout: RunLayout, ref: str) -> Tuple[RunLayout, Optional[SubmissionRecord]]:
    """The layout and record of ``<run id>/<number>`` (a sibling of ``layout``'s run)."""
    run_id, _, number = ref.rpartition("/")
    if not run_id or "/" in run_id or run_id.startswith(".") or not number.isdigit():
        raise StateError(f"shared submission {ref[:80]!r}: not <run id>/<number>")
    member = RunLayout(layout.root.parent / run_id)
    return member, load_record(member.submission_json(int(number)), SubmissionRecord)


def recover_shared(layout: RunLayout, scheduler: Scheduler, record: SubmissionRecord,
                   now: Optional[float] = None) -> List[str]:
    """Finish the shared submission ``record`` of ``layout``'s run belongs to, for every
    member of its group; one note per action (nothing while any record is younger than
    RECOVERY_GRACE_S: the submit may still be running)."""
    now = time.time() if now is None else now
    name = str(record.job_name)
    try:
        members = [_member(layout, ref) for ref in record.group]
    except StateError as err:
        return [f"shared array {name}: {err}"]
    found = [(m, r) for m, r in members if r is not None]
    if any(now - r.submitted_at < RECOVERY_GRACE_S for _, r in found):
        return []
    recorded = {r.job_id for _, r in found if r.job_id}
    rows = [row for row in scheduler.jobs_named(name) if not row.terminal]
    active = {split_job_id(row.job_id)[0] for row in rows}
    if len(recorded) > 1 or (not recorded and len(active) > 1):
        return [f"shared array {name}: several jobs ({', '.join(sorted(recorded | active))});"
                " none adopted: cancel the duplicate by hand"]
    if not recorded and not active:
        return []
    job = (recorded or active).pop()
    notes = []
    for member, mine in found:
        if mine.job_id is None:
            mine = arrays.adopt(member, mine, job)
            notes.append(f"{member.root.name} submission {mine.number}: adopted job {job}")
        if not mine.released:
            mark_submitted(member, load_plan(member), mine)
    if any(split_job_id(row.job_id)[0] == job and row.reason == HELD for row in rows):
        scheduler.release(job)
    for member, mine in found:
        if not mine.released:
            write_json_atomic(member.submission_json(mine.number),
                              mine.replace(job_id=job, released=True).to_dict())
    notes.append(f"shared array {name}: job {job} released")
    return notes
