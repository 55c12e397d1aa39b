"""The local backend's scheduler client: the methods of ``control.slurm.scheduler.Scheduler``
(submit a held array, release, queue, accounting, cancel, jobs by name), answered from the
job table (``jobs.py``) instead of slurmctld.

``submit_held_array`` reads the batch script's ``#SBATCH`` lines (time, signal lead,
output, GPUs, requeue), as sbatch does, and records a held job; ``release`` starts the
job's detached supervisor (``supervisor.py``), which inherits this process's environment
as a Slurm job inherits its submitter's, and returns once it runs. ``cancel`` asks the
supervisor (SIGTERM, then SIGKILL after ``kill_wait_s``); ``queue``/``accounting`` rows
come from :func:`jobs.task_row`. Nothing here imports pydantic or the contracts, so
``status`` stays as quick as with Slurm.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Set, Tuple

from synthbatch.agent_stdlib.arrays import (
    array_job_id,
    is_job_id,
    job_and_task,
    task_job_id,
)
from synthbatch.agent_stdlib.layout import local_backend_root
from synthbatch.agent_stdlib.statefile import StateError, ensure_dir, write_json_atomic
from synthbatch.control.backends.local import gpus as gpu_detection
from synthbatch.control.backends.local import proc
from synthbatch.control.backends.local.jobs import (
    CANCELLED,
    PENDING,
    RUNNING,
    Job,
    Supervisor,
    Table,
    Task,
    supervisor_alive,
    task_row,
)
from synthbatch.control.errors import SchedulerRejected, SchedulerUnavailable
from synthbatch.control.slurm.parsers import JobRow, JobUsage, Partition

FIRST_IDS = 900_000  # first job ids of a new workspace: random below this (port blocks)
START_TIMEOUT_S = 30.0
SOURCE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding ``control/``
# The supervisor's entry point; a constant, its arguments come as argv (never code).
# It runs with this interpreter, which has synthbatch installed (-I keeps site-packages).
BOOT = ("import sys; "
        "from synthbatch.control.backends.local.supervisor import main; "
        "sys.exit(main(sys.argv[1:]))")


@dataclass(frozen=True)
class Settings:
    """The profile's local backend settings (what ``submit`` and ``retry`` need)."""

    gpus_per_node: int = 0
    gpus: Optional[Tuple[int, ...]] = None
    max_concurrent: int = 0
    kill_wait_s: float = 30.0


def _gpus_asked(options: Dict[str, Optional[str]]) -> int:
    gres = options.get("gres") or ""
    if gres.startswith("gpu:"):
        return int(gres.rsplit(":", 1)[1])
    return int(options.get("gpus") or options.get("gpus-per-node") or 0)


def _lead(value: Optional[str]) -> Optional[int]:
    """``B:USR1@30`` -> 30 (the only signal the renderer asks for)."""
    if not value or "@" not in value:
        return None
    what, _, seconds = value.partition("@")
    if what.split(":")[-1] != "USR1" or not (seconds.isascii() and seconds.isdigit()):
        raise ValueError(f"--signal={value}: the local backend sends USR1 only")
    return int(seconds)


@dataclass
class LocalScheduler:
    """``Scheduler``'s methods for the job table of one workspace."""

    workspace: str
    settings: Optional[Settings] = None
    USAGE_FROM: ClassVar[str] = "the local backend's job table"  # where ``usage`` comes from
    # automatic rounds run in the supervisor of the job they follow (``local.rounds``)
    ROUNDS_IN_SUPERVISOR: ClassVar[bool] = True
    python: str = sys.executable  # runs the supervisors
    start_timeout_s: float = START_TIMEOUT_S

    @property
    def table(self) -> Table:
        """The workspace's job table."""
        return Table(local_backend_root(self.workspace))

    # ------------------------------------------------------------------ submitting

    def submit_held_array(self, script: str, indices: Sequence[int], throttle: int,
                          job_name: str) -> Tuple[str, List[str]]:
        """Record a held job running ``script`` for each of ``indices``; its id and argv."""
        from synthbatch.control.slurm.directives import read_directives, time_limit_seconds
        from synthbatch.control.slurm.scheduler import array_spec

        settings = self.settings or Settings()
        try:
            options = read_directives(Path(script).read_text(encoding="utf-8"))
            nodes = int(options.get("nodes") or 1)
            limit = time_limit_seconds(options["time"]) if options.get("time") else None
            lead = _lead(options.get("signal"))
            gpus = _gpus_asked(options)
            pool = gpu_detection.gpu_pool(settings.gpus, settings.gpus_per_node,
                                          gpu_detection.detect())
        except (OSError, ValueError) as err:
            raise SchedulerRejected(f"local backend: {script}: {err}") from err
        if nodes != 1:
            raise SchedulerRejected(f"local backend: the job asks for {nodes} nodes; it runs "
                                    "on this machine only")
        if gpus > len(pool):
            raise SchedulerRejected(f"local backend: each task needs {gpus} GPU(s), this "
                                    f"machine has {len(pool)} ({','.join(pool) or 'none'})")
        table = self.table
        with table.locked():
            first = table.next_ids(len(indices), first=1 + secrets.randbelow(FIRST_IDS))
            job_id = str(first)
            job = Job(job_id=job_id, name=job_name, script=str(Path(script).resolve()),
                      workdir=str(Path(script).resolve().parents[1]),
                      output=options.get("output") or f"{Path(script).parent}/slurm-%A_%a.out",
                      time_limit_s=limit, signal_lead_s=lead, requeue="requeue" in options,
                      gpus=gpus, pool=tuple(pool),
                      max_concurrent=settings.max_concurrent or
                      gpu_detection.default_concurrency(pool, gpus),
                      throttle=max(0, throttle), kill_wait_s=settings.kill_wait_s,
                      submitted_at=time.time(),
                      tasks={t: Task(task=t, raw_id=first + i)
                             for i, t in enumerate(sorted(set(indices)))})
            ensure_dir(table.job_dir(job_id))
            write_json_atomic(table.job_json(job_id), job.to_dict())
            table.add_name(job_name, job_id)
            table.mark_active(job_id, True)
        argv = ["synthbatch-local", "--hold", f"--array={array_spec(indices, throttle)}",
                f"--job-name={job_name}", str(script)]
        return job_id, argv

    def release(self, job_id: str) -> None:
        """Start the job's supervisor (it releases the job); idempotent."""
        job = self._job(job_id)
        if job is None:
            raise SchedulerRejected(f"local backend: release {job_id}: Invalid job id specified")
        record = self._supervisor(job_id)
        if record is not None and (supervisor_alive(record) or not job.held):
            return  # running, or it ran (its tasks ended with it)
        self._spawn(job_id)

    def _spawn(self, job_id: str) -> None:
        """Start the detached supervisor of ``job_id`` and wait for its "ready" line."""
        table = self.table
        log = os.open(table.supervisor_log(job_id),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        read_fd, write_fd = os.pipe()
        argv = [self.python, "-I", "-c", BOOT, "--root", str(table.root),
                "--job", job_id, "--ready-fd", str(write_fd)]
        try:
            first = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     cwd="/", start_new_session=True, pass_fds=(write_fd,),
                                     close_fds=True)
        except OSError as err:
            os.close(read_fd)
            raise SchedulerUnavailable(f"local backend: cannot start a supervisor "
                                       f"({err.strerror})") from err
        finally:
            os.close(write_fd)
            os.close(log)
        try:
            answer = _read_line(read_fd, self.start_timeout_s)
            first.wait(timeout=self.start_timeout_s)  # it forks the supervisor and exits
        except subprocess.TimeoutExpired:
            answer = ""
        finally:
            os.close(read_fd)
        if not answer.startswith("ready "):
            raise SchedulerUnavailable(
                f"local backend: the supervisor of job {job_id} did not start",
                hint=f"see {table.supervisor_log(job_id)}")

    # ------------------------------------------------------------------ cancelling

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Cancel jobs or tasks (``12``, ``12_3``); unknown or ended ones are fine.

        Pending tasks end at once; running ones get SIGTERM from their supervisor (the cause
        ``cancelled`` written first), SIGKILL after ``kill_wait_s``. A task whose supervisor
        is gone but whose process is not is killed from here.
        """
        wanted: Dict[str, Optional[Set[int]]] = {}  # job -> its tasks (None: all of them)
        for text in job_ids:
            if not is_job_id(text):  # ('²'.isdigit() holds; int() refuses it)
                continue
            job, task = job_and_task(text)
            if task is None:
                wanted[job] = None
            elif wanted.get(job, set()) is not None:
                wanted.setdefault(job, set()).add(task)  # type: ignore[union-attr]
        orphans: List[Task] = []
        table = self.table
        by = f"by {os.getuid()}"
        with table.locked():
            for job_id, tasks in sorted(wanted.items()):
                job = self._job(job_id)
                if job is None:
                    continue
                alive = supervisor_alive(self._supervisor(job_id))
                now, changed = time.time(), job
                for task in job.tasks.values():
                    if task.ended or (tasks is not None and task.task not in tasks):
                        continue
                    if task.state == PENDING:
                        task = replace(task, state=CANCELLED, reason=by, ended_at=now,
                                       exit_code=0, signal=0)
                    elif task.cancel_requested_at is None:
                        task = replace(task, cancel_requested_at=now, reason=by)
                    if task.state == RUNNING and not alive:
                        orphans.append(task)
                    changed = changed.with_task(task)
                if changed != job:
                    table.save_job(changed)
        for task in orphans:  # no supervisor to do it: nothing may outlive the cancel
            if proc.alive(task.pid, task.ticks) and task.pid:
                proc.signal_group(task.pid, signal.SIGKILL)

    # ------------------------------------------------------------------ asking

    def _job(self, job_id: str) -> Optional[Job]:
        try:
            return self.table.load_job(job_id)
        except StateError as err:
            raise SchedulerUnavailable(f"local backend: {err}") from err
        except ValueError:
            return None

    def _supervisor(self, job_id: str) -> Optional[Supervisor]:
        try:
            return self.table.load_supervisor(job_id)
        except StateError as err:
            raise SchedulerUnavailable(f"local backend: {err}") from err

    def supervising(self, job_id: str) -> bool:
        """Whether the job's supervisor still runs: its tasks, or the run's automatic round
        after them (issue 34)."""
        return bool(supervisor_alive(self._supervisor(array_job_id(job_id))))

    def _rows(self, ids: Sequence[str], accounting: bool) -> List[JobRow]:
        rows: List[JobRow] = []
        for job_id in ids:
            job = self._job(job_id)
            if job is None:
                continue
            record = self._supervisor(job_id)
            alive = supervisor_alive(record)
            for task in sorted(job.tasks.values(), key=lambda t: t.task):
                row = task_row(job, task, alive, record, accounting)
                if row is not None:
                    rows.append(row)
        return rows

    def _named(self, name: str) -> List[str]:
        try:
            return self.table.jobs_named(name)
        except StateError as err:
            raise SchedulerUnavailable(f"local backend: {err}") from err

    def queue(self, job_ids: Sequence[str] = (), name: Optional[str] = None) -> List[JobRow]:
        """What ``squeue -t all`` would show for ``job_ids`` and/or jobs called ``name``."""
        wanted = {j for j in job_ids if is_job_id(j)}  # anything else is simply absent
        ids = set(self._named(name)) if name else set()
        ids |= {array_job_id(j) for j in wanted}
        rows = self._rows(sorted(ids, key=int), accounting=False)
        if not name:
            rows = [r for r in rows if r.job_id in wanted or array_job_id(r.job_id) in wanted]
        return rows

    def accounting(self, job_ids: Sequence[str]) -> Optional[List[JobRow]]:
        """What ``sacct`` would show for ``job_ids`` (array job ids or tasks)."""
        ids = sorted({array_job_id(j) for j in job_ids if is_job_id(array_job_id(j))}, key=int)
        return self._rows(ids, accounting=True)

    def jobs_named(self, job_name: str) -> List[JobRow]:
        """Queued or running tasks of the jobs called ``job_name``."""
        return [r for r in self.queue(name=job_name) if not r.terminal]

    def max_array_size(self) -> Optional[int]:
        """No limit: a run is one array."""
        return None

    def usage(self, job_ids: Sequence[str]) -> Optional[List[JobUsage]]:
        """What ``sacct -D`` would say each task of ``job_ids`` used: its elapsed seconds
        (start to end, or to now while it runs) and the GPUs it held. A requeued task's
        earlier executions are not kept apart (the table holds one start per task)."""
        now = time.time()
        found: List[JobUsage] = []
        for job_id in sorted({array_job_id(j) for j in job_ids if is_job_id(array_job_id(j))},
                             key=int):
            job = self._job(job_id)
            for task in sorted(job.tasks.values(), key=lambda t: t.task) if job else []:
                if task.started_at is None:
                    continue
                end = task.ended_at if task.ended_at is not None else now
                found.append(JobUsage(job_id=task_job_id(job_id, task.task),
                                      elapsed_s=int(max(0.0, end - task.started_at)),
                                      gpus=len(task.gpus)))
        return found

    def partitions(self) -> List[Partition]:
        """This machine, as one partition."""
        return [Partition(name="local", default=True, available=True, nodes=1, state="idle")]

    def describe(self, job_name: str) -> Dict[str, Any]:
        """``status``'s ``backend``: where the table is and each job's supervisor."""
        table = self.table
        found = []
        for job_id in self._named(job_name):
            try:
                record = table.load_supervisor(job_id)
            except StateError as err:
                found.append({"job_id": job_id, "problem": str(err)})
                continue
            alive = supervisor_alive(record)
            item: Dict[str, Any] = {"job_id": job_id, "alive": alive,
                                    "log": str(table.supervisor_log(job_id))}
            if record is not None:
                item.update(pid=record.pid, host=record.host, started_at=record.started_at,
                            heartbeat_age_s=round(max(0.0, time.time() - record.heartbeat_at),
                                                  1),
                            stopped=record.stopped_at is not None)
            found.append(item)
        return {"name": "local", "table": str(table.root), "supervisors": found}


def _read_line(fd: int, timeout_s: float) -> str:
    """The first line written to ``fd`` within ``timeout_s`` ("" on EOF or timeout)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").partition("\n")[0]
