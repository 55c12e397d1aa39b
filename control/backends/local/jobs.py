"""The local backend's job table: durable records under ``<workspace>/local/``.

```
<workspace>/local/
  lock                      flock: every change to a job record is made holding it
  counter.json              the next job id
  names/<sha256>.json       job name -> the job ids of that name (squeue -n)
  active/<job>              a marker per job whose supervisor may still run something
  jobs/<job>/job.json       one array job: its script, limits, GPUs, tasks (revisioned)
  jobs/<job>/supervisor.json the job's supervisor: pid, start ticks, host, boot, heartbeat
  jobs/<job>/supervisor.log its messages
  jobs/<job>/tasks/<task>/  the task's control folder (agent_stdlib/localjob.py)
```

Records are written with ``agent_stdlib.statefile`` (temp + fsync + rename, 0600, every
write one revision higher); readers never lock and tolerate damage (StateError names the
file). :func:`task_row` is the one rule from a task record to the ``JobRow`` status,
cancel and reconcile read, in Slurm's words (PENDING, RUNNING, COMPLETING, COMPLETED,
FAILED, CANCELLED, TIMEOUT, NODE_FAIL; ids ``<job>_<task>``). :func:`supervisor_alive`
is the one rule for "is its supervisor still there".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from synthbatch.agent_stdlib.arrays import is_job_id, task_job_id
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    locked,
    read_json,
    write_json_atomic,
)
from synthbatch.control.backends.local import proc
from synthbatch.control.slurm.parsers import JobRow

PENDING, RUNNING, COMPLETING = "PENDING", "RUNNING", "COMPLETING"
COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL = (
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
ENDED = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL})
HELD = "JobHeldUser"
HEARTBEAT_S = 2.0
STALE_S = 30.0  # a supervisor on another host is alive while its heartbeat is this fresh


def is_whole_job_id(text: str) -> bool:
    """True for a job's id (``12``), ASCII digits only (``'²'.isdigit()`` holds)."""
    return is_job_id(text) and "_" not in text


@dataclass(frozen=True)
class Task:
    """One array task: its state and, while it runs, its process and GPUs."""

    task: int
    raw_id: int  # unique in the workspace: the allocation's own id (port block)
    state: str = PENDING
    reason: Optional[str] = None  # why it is pending, or who cancelled it ("by 1000")
    restarts: int = 0
    pid: Optional[int] = None  # the batch script's process (then the agent, same pid)
    ticks: Optional[int] = None  # its start time (proc.start_ticks)
    gpus: Tuple[str, ...] = ()
    started_at: Optional[float] = None
    ended_at: Optional[float] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    usr1_at: Optional[float] = None  # when the time limit's lead signal was sent
    term_at: Optional[float] = None  # when SIGTERM was sent ...
    cause: Optional[str] = None  # ... and why (localjob.CANCELLED / TIME_LIMIT)
    kill_at: Optional[float] = None  # when SIGKILL was sent (KillWait after SIGTERM)
    cancel_requested_at: Optional[float] = None

    @property
    def ended(self) -> bool:
        """True for a state the task never leaves."""
        return self.state in ENDED


@dataclass(frozen=True)
class Job:
    """One submission: an array of tasks running one batch script."""

    job_id: str
    name: str
    script: str
    workdir: str
    output: str  # ``#SBATCH --output`` pattern (%A, %a, %j, %x)
    time_limit_s: Optional[int]
    signal_lead_s: Optional[int]  # ``--signal=B:USR1@lead``: USR1 this long before
    requeue: bool
    gpus: int  # per task
    pool: Tuple[str, ...]  # the machine's GPUs (CUDA_VISIBLE_DEVICES entries)
    max_concurrent: int  # tasks of the workspace running at once while this job starts one
    throttle: int  # ``--array=...%N``
    kill_wait_s: float
    submitted_at: float
    held: bool = True
    revision: int = 1
    tasks: Dict[int, Task] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """The record as JSON data."""
        data = asdict(self)
        data["tasks"] = {str(k): asdict(v) for k, v in sorted(self.tasks.items())}
        data["schema_version"] = 1
        return data

    def with_task(self, task: Task) -> Job:
        """This job with one task replaced."""
        return replace(self, tasks={**self.tasks, task.task: task})


def _task(data: Any, where: str) -> Task:
    if not isinstance(data, dict):
        raise StateError(f"{where}: a task is not an object")
    try:
        fields = dict(data)
        fields["gpus"] = tuple(str(g) for g in fields.get("gpus", ()))
        return Task(**fields)
    except TypeError as err:
        raise StateError(f"{where}: {err}") from err


def job_from_dict(data: Dict[str, Any], where: str) -> Job:
    """Parse a job record; StateError naming ``where`` when it is not one."""
    if data.get("schema_version") != 1:
        raise StateError(f"{where}: unknown schema_version {data.get('schema_version')!r}")
    fields = {k: v for k, v in data.items() if k != "schema_version"}
    tasks = fields.pop("tasks", None)
    if not isinstance(tasks, dict):
        raise StateError(f"{where}: tasks is not an object")
    try:
        job = Job(**fields, tasks={})
        parsed = {int(k): _task(v, where) for k, v in tasks.items()}
    except (TypeError, ValueError) as err:
        raise StateError(f"{where}: {err}") from err
    return replace(job, pool=tuple(str(g) for g in job.pool), tasks=parsed)


@dataclass(frozen=True)
class Supervisor:
    """``supervisor.json``: the detached process that runs one job's tasks."""

    job_id: str
    pid: int
    ticks: Optional[int]
    host: str
    boot_id: str
    started_at: float
    heartbeat_at: float
    log: str
    stopped_at: Optional[float] = None
    revision: int = 1

    def to_dict(self) -> Dict[str, Any]:
        """The record as JSON data."""
        return {**asdict(self), "schema_version": 1}


@dataclass(frozen=True)
class Table:
    """Paths of the job table of one workspace."""

    root: Path

    @property
    def lock_path(self) -> Path:
        """The flock every writer holds."""
        return self.root / "lock"

    def job_dir(self, job_id: str) -> Path:
        """``jobs/<job>``."""
        if not is_whole_job_id(job_id):
            raise ValueError(f"not a local job id: {job_id!r}")
        return self.root / "jobs" / job_id

    def job_json(self, job_id: str) -> Path:
        """The job record."""
        return self.job_dir(job_id) / "job.json"

    def supervisor_json(self, job_id: str) -> Path:
        """The supervisor record."""
        return self.job_dir(job_id) / "supervisor.json"

    def supervisor_log(self, job_id: str) -> Path:
        """The supervisor's own log."""
        return self.job_dir(job_id) / "supervisor.log"

    def task_dir(self, job_id: str, task: int) -> Path:
        """A task's control folder (``SYNTHBATCH_LOCAL_TASK_DIR``)."""
        return self.job_dir(job_id) / "tasks" / str(task)

    def names_json(self, name: str) -> Path:
        """The ids of the jobs called ``name``."""
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
        return self.root / "names" / f"{digest}.json"

    def active(self, job_id: str) -> Path:
        """The marker of a job whose tasks may still run."""
        return self.root / "active" / job_id

    # ------------------------------------------------------------------ reading

    def load_job(self, job_id: str) -> Optional[Job]:
        """The job record; None if there is no such job; StateError if it is damaged."""
        path = self.job_json(job_id)
        data = read_json(path)
        return None if data is None else job_from_dict(data, str(path))

    def load_supervisor(self, job_id: str) -> Optional[Supervisor]:
        """The supervisor record, None before one started; StateError if damaged."""
        path = self.supervisor_json(job_id)
        data = read_json(path)
        if data is None:
            return None
        try:
            return Supervisor(**{k: v for k, v in data.items() if k != "schema_version"})
        except TypeError as err:
            raise StateError(f"{path}: {err}") from err

    def jobs_named(self, name: str) -> List[str]:
        """Ids of the jobs called ``name``, ascending."""
        data = read_json(self.names_json(name)) or {}
        ids = data.get("jobs", [])
        return sorted({str(i) for i in ids if is_whole_job_id(str(i))}, key=int)

    def active_jobs(self) -> List[str]:
        """Ids of the jobs with an active marker, ascending."""
        try:
            names = os.listdir(self.root / "active")
        except FileNotFoundError:
            return []
        return sorted((n for n in names if is_whole_job_id(n)), key=int)

    # ------------------------------------------------------------------ writing

    def save_job(self, job: Job) -> Job:
        """Write the next revision of ``job`` (hold the lock); return what was written."""
        job = replace(job, revision=job.revision + 1)
        write_json_atomic(self.job_json(job.job_id), job.to_dict())
        return job

    def save_supervisor(self, record: Supervisor) -> Supervisor:
        """Write the next revision of a supervisor record (its own process only)."""
        record = replace(record, revision=record.revision + 1)
        write_json_atomic(self.supervisor_json(record.job_id), record.to_dict())
        return record

    def next_ids(self, count: int, first: int) -> int:
        """Reserve ``count`` consecutive ids (hold the lock); return the first."""
        path = self.root / "counter.json"
        data = read_json(path) or {}
        start = data.get("next_job_id")
        start = start if isinstance(start, int) and start > 0 else first
        write_json_atomic(path, {"schema_version": 1, "next_job_id": start + count})
        return start

    def add_name(self, name: str, job_id: str) -> None:
        """Record ``job_id`` under ``name`` (hold the lock)."""
        path = ensure_dir(self.root / "names") / self.names_json(name).name
        ids = self.jobs_named(name)
        write_json_atomic(path, {"schema_version": 1, "name": name,
                                 "jobs": sorted({*ids, job_id}, key=int)})

    def mark_active(self, job_id: str, active: bool) -> None:
        """Create or remove the active marker of ``job_id``."""
        marker = self.active(job_id)
        if active:
            ensure_dir(marker.parent)
            marker.touch(mode=0o600, exist_ok=True)
        else:
            marker.unlink(missing_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the table's flock."""
        ensure_dir(self.root)
        with locked(self.lock_path):
            yield


def supervisor_alive(record: Optional[Supervisor], now: Optional[float] = None) -> Optional[bool]:
    """Is the job's supervisor still there? None before one started.

    On its own host (same boot): its pid runs with the recorded start time. From another
    host only the heartbeat can tell: fresh within STALE_S.
    """
    if record is None:
        return None
    if record.stopped_at is not None:
        return False
    if record.host == socket.gethostname() and record.boot_id == proc.boot_id():
        return proc.alive(record.pid, record.ticks)
    now = time.time() if now is None else now
    return now - record.heartbeat_at < STALE_S


def gone_reason(record: Optional[Supervisor]) -> str:
    """Why the tasks of a job whose supervisor is gone ended."""
    if record is None:
        return "its local supervisor never started"
    return f"its local supervisor (pid {record.pid} on {record.host}) is gone"


def task_row(job: Job, task: Task, alive: Optional[bool], record: Optional[Supervisor],
             accounting: bool = False) -> Optional[JobRow]:
    """The squeue (or, with ``accounting``, sacct) row of one task.

    ``alive`` is :func:`supervisor_alive` of the job's supervisor. A task is only ever
    reported ended once no process of it is left: an end its supervisor recorded, or a
    supervisor that is gone and an agent that is not running. squeue then says NODE_FAIL
    (CANCELLED when a cancel asked for it) with the reason; sacct has no row for such an
    end (nothing recorded it), so status quotes squeue's reason.
    """
    job_id = task_job_id(job.job_id, task.task)
    if task.ended:
        reason = task.reason if task.state == CANCELLED else None
        if not accounting:
            return JobRow(job_id=job_id, state=task.state, reason=reason)
        return JobRow(job_id=job_id, state=task.state, reason=reason,
                      exit_code=task.exit_code or 0, signal=task.signal or 0)
    if task.state == RUNNING and proc.alive(task.pid, task.ticks):
        return JobRow(job_id=job_id, state=RUNNING)
    if task.state == PENDING and job.held and not alive:
        return JobRow(job_id=job_id, state=PENDING, reason=HELD)
    if alive:
        if task.state == RUNNING:  # exited; its supervisor records it at the next poll
            return JobRow(job_id=job_id, state=COMPLETING)
        return JobRow(job_id=job_id, state=PENDING, reason=task.reason or "Priority")
    if accounting:
        return None
    if task.cancel_requested_at is not None:
        return JobRow(job_id=job_id, state=CANCELLED, reason=task.reason)
    return JobRow(job_id=job_id, state=NODE_FAIL, reason=gone_reason(record))
