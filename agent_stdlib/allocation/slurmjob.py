"""What this allocation is, as its scheduler tells it: identity from the environment, why a
SIGTERM came, and requeueing the job.

On Slurm (the ``srun`` launcher): ``SLURM_*`` variables, ``scontrol show job``, ``scontrol
requeue``. Measured on Slurm 22.05 while the batch step handles SIGTERM: after ``scontrol
requeue`` the job shows ``Restarts`` one higher than the running ``SLURM_RESTART_COUNT``; at
a time limit it shows ``Reason=TimeLimit``; after ``scancel`` neither.

Under the local backend (the ``local`` launcher): ``SYNTHBATCH_LOCAL_*`` variables and the
task's control folder (``agent_stdlib/localjob.py``): the supervisor writes the cause
before it signals, the agent asks for a requeue with a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from .. import localjob
from ..arrays import task_job_id
from ..localjob import CANCELLED, REQUEUED, TIME_LIMIT
from .steps import run_command


@dataclass(frozen=True)
class JobIdentity:
    """The scheduler's view of this allocation (all None outside Slurm)."""

    job_id: Optional[str]  # raw SLURM_JOB_ID; array tasks have their own
    array_job_id: Optional[str]
    array_task_id: Optional[int]
    restart_count: int
    node: Optional[str]
    nodelist: Optional[str]
    num_nodes: Optional[int]
    local_dir: Optional[str] = None  # the local backend's control folder of this task

    @property
    def key(self) -> Optional[str]:
        """The id squeue and the attempt record use: ``12_3`` for array tasks."""
        if self.array_job_id and self.array_task_id is not None:
            return task_job_id(self.array_job_id, self.array_task_id)
        return self.job_id


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def identity(env: Mapping[str, str]) -> JobIdentity:
    """Read this allocation's identity from Slurm's environment variables."""
    return JobIdentity(
        job_id=env.get("SLURM_JOB_ID") or None,
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") or None,
        array_task_id=_int(env.get("SLURM_ARRAY_TASK_ID")),
        restart_count=_int(env.get("SLURM_RESTART_COUNT")) or 0,
        node=env.get("SLURMD_NODENAME") or None,
        nodelist=env.get("SLURM_JOB_NODELIST") or None,
        num_nodes=_int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")),
    )


def local_identity(env: Mapping[str, str]) -> JobIdentity:
    """This task's identity as the local backend's supervisor gives it (all None outside)."""
    node = os.uname().nodename
    inside = bool(env.get(localjob.JOB_ID))
    return JobIdentity(
        job_id=env.get(localjob.JOB_ID) or None,
        array_job_id=env.get(localjob.ARRAY_JOB_ID) or None,
        array_task_id=_int(env.get(localjob.ARRAY_TASK_ID)),
        restart_count=_int(env.get(localjob.RESTART_COUNT)) or 0,
        node=node, nodelist=node if inside else None, num_nodes=1,
        local_dir=localjob.task_dir(env) if inside else None,
    )


def current_identity(launcher: str = "srun") -> JobIdentity:
    """This process's allocation identity: from Slurm, or (``local``) the local backend."""
    return local_identity(os.environ) if launcher == "local" else identity(os.environ)


def parse_show_job(text: str) -> Dict[str, str]:
    """``scontrol show job -o`` output -> its ``Key=Value`` fields (first occurrence)."""
    fields: Dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key and key not in fields:
            fields[key] = value
    return fields


def classify_termination(fields: Mapping[str, str], restart_count: int) -> str:
    """Why the job is ending: ``requeued``, ``time limit`` or ``cancelled``."""
    restarts = _int(fields.get("Restarts"))
    if restarts is not None and restarts > restart_count:
        return REQUEUED
    if fields.get("Reason") == "TimeLimit" or fields.get("JobState") == "TIMEOUT":
        return TIME_LIMIT
    return CANCELLED


def termination_cause(ident: JobIdentity) -> str:
    """Ask slurmctld (or the local supervisor) why this job got SIGTERM (``cancelled`` if
    it cannot be asked)."""
    if ident.local_dir:
        return localjob.read_cause(ident.local_dir)
    if not ident.job_id:
        return CANCELLED
    out = run_command(["scontrol", "show", "job", "-o", ident.job_id], timeout_s=3.0)
    return classify_termination(parse_show_job(out or ""), ident.restart_count)


def requeue(ident: JobIdentity) -> bool:
    """``scontrol requeue`` this job (it will get SIGTERM, then run again); True if accepted.

    Under the local backend: ask the supervisor to run the task again once it exits.
    """
    if ident.local_dir:
        return localjob.request_requeue(ident.local_dir, ident.restart_count)
    if not ident.job_id:
        return False
    return run_command(["scontrol", "requeue", ident.job_id], timeout_s=5.0) is not None


def parse_hostnames(text: str) -> List[str]:
    """``scontrol show hostnames`` output -> node names, in allocation order."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_node_addrs(text: str) -> Dict[str, str]:
    """``scontrol show node -o`` output -> node name -> ``NodeAddr`` (one line per node)."""
    addrs: Dict[str, str] = {}
    for line in text.splitlines():
        fields = parse_show_job(line)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            addrs[fields["NodeName"]] = fields["NodeAddr"]
    return addrs


def allocation_nodes(nodelist: str) -> Optional[List[str]]:
    """The allocation's node names in ``srun --relative`` order; None if scontrol failed."""
    out = run_command(["scontrol", "show", "hostnames", nodelist], timeout_s=5.0)
    return None if out is None else parse_hostnames(out)


def node_addrs(names: Sequence[str]) -> Dict[str, str]:
    """``NodeAddr`` of each of ``names`` from slurmctld (empty if it cannot be asked)."""
    if not names:
        return {}
    out = run_command(["scontrol", "show", "node", "-o", ",".join(names)], timeout_s=5.0)
    return parse_node_addrs(out or "")
