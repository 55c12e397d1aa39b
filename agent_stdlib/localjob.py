"""The local backend's contract with the agent: identity variables and one control folder.

Without Slurm (profile ``backend = "local"``) a supervisor process of the control plane
(``control/backends/local``) runs each array task's batch script itself. It tells the
agent who it is through these variables (never fake ``SLURM_*`` names, which engines and
libraries would take for a real Slurm job):

* ``SYNTHBATCH_LOCAL_JOB_ID``: the task's own numeric id (unique in the workspace, like
  Slurm's raw ``SLURM_JOB_ID``: it picks the allocation's port block);
* ``SYNTHBATCH_LOCAL_ARRAY_JOB_ID`` / ``SYNTHBATCH_LOCAL_ARRAY_TASK_ID``: the array job
  and the task (``<array>_<task>`` is the id status and the attempt record use);
* ``SYNTHBATCH_LOCAL_RESTART_COUNT``: requeues so far;
* ``SYNTHBATCH_LOCAL_TASK_DIR``: the task's control folder, where the supervisor writes
  ``cause.json`` (why it sends SIGTERM: ``cancelled``, ``time limit``) *before* it signals,
  and the agent writes ``requeue.json`` to ask for a requeue (what ``scontrol requeue``
  is on Slurm; refused once a cause is written); the supervisor runs the task again once
  it has exited.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping, Optional

from .statefile import StateError, read_json, write_json_atomic

JOB_ID = "SYNTHBATCH_LOCAL_JOB_ID"
ARRAY_JOB_ID = "SYNTHBATCH_LOCAL_ARRAY_JOB_ID"
ARRAY_TASK_ID = "SYNTHBATCH_LOCAL_ARRAY_TASK_ID"
RESTART_COUNT = "SYNTHBATCH_LOCAL_RESTART_COUNT"
TASK_DIR = "SYNTHBATCH_LOCAL_TASK_DIR"
VARIABLES = (JOB_ID, ARRAY_JOB_ID, ARRAY_TASK_ID, RESTART_COUNT, TASK_DIR)

CAUSE_FILE = "cause.json"
REQUEUE_FILE = "requeue.json"

# Why an allocation is ending (the same words for Slurm, see allocation/slurmjob.py).
REQUEUED = "requeued"
TIME_LIMIT = "time limit"
CANCELLED = "cancelled"
CAUSES = (REQUEUED, TIME_LIMIT, CANCELLED)


def task_dir(env: Mapping[str, str]) -> Optional[str]:
    """The control folder of this task, or None outside the local backend."""
    return env.get(TASK_DIR) or None


def write_cause(folder: Path, cause: str, signal_name: str) -> None:
    """Supervisor: record why the task gets ``signal_name`` (before sending it)."""
    if cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}")
    write_json_atomic(folder / CAUSE_FILE, {"schema_version": 1, "cause": cause,
                                            "signal": signal_name, "at": time.time()})


def read_cause(folder: str) -> str:
    """Agent: why the supervisor sent SIGTERM; ``cancelled`` when it did not say."""
    try:
        data = read_json(Path(folder) / CAUSE_FILE) or {}
    except StateError:
        return CANCELLED
    cause = data.get("cause")
    return cause if cause in CAUSES else CANCELLED


def request_requeue(folder: str, restart_count: int) -> bool:
    """Agent: ask the supervisor to run this task again once it exits; True if recorded.

    Refused (False) once the supervisor has sent SIGTERM (a cause is recorded): like
    ``scontrol requeue`` of a job that is being cancelled or hit its time limit.
    """
    if (Path(folder) / CAUSE_FILE).exists():
        return False
    try:
        write_json_atomic(Path(folder) / REQUEUE_FILE,
                          {"schema_version": 1, "restart_count": restart_count,
                           "pid": os.getpid(), "at": time.time()})
    except (OSError, StateError):
        return False
    return True


def requeue_requested(folder: Path) -> bool:
    """Supervisor: True when the task's agent asked for a requeue."""
    return (folder / REQUEUE_FILE).is_file()


def clear(folder: Path) -> None:
    """Supervisor: forget the last execution's cause and requeue request."""
    for name in (CAUSE_FILE, REQUEUE_FILE):
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
