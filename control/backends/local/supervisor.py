"""The local backend's supervisor: one detached process per job runs its array tasks.

Started by ``LocalScheduler.release`` as ``python -I -c BOOT <src> --root R --job J
--ready-fd N`` in a new session; it forks once more (the session leader exits at once, so
the supervisor can never get a controlling terminal and is re-parented away from the
submitter), records itself in ``jobs/J/supervisor.json`` (pid, start ticks, host, boot
id, heartbeat every 2 s), releases the job and writes ``ready <pid>`` to the pipe. It
survives the terminal and the login session: no tty, SIGHUP ignored, stdout and stderr
in ``jobs/J/supervisor.log``.

Every poll (0.2 s), holding the table's lock, it:

1. records the tasks whose process exited: ``COMPLETED`` (status 0), ``FAILED``,
   ``CANCELLED`` (a cancel asked), ``TIMEOUT`` (the time limit's SIGTERM), or ``PENDING``
   again with one more restart when the agent asked for a requeue (``requeue.json``) and
   the script says ``--requeue``;
2. signals as Slurm does: SIGUSR1 to the batch process at ``time_limit - lead``
   (``--signal=B:USR1@lead``), SIGCONT + SIGTERM to its process group at the time limit
   or on cancel (the cause is written to ``cause.json`` first, so the agent can tell
   ``time limit`` from ``cancelled``), SIGKILL ``kill_wait_s`` later;
3. starts pending tasks as ``schedule.plan_starts`` says: ``/bin/bash <script>`` (the
   batch script sbatch would run) in its own session, output appended to the script's
   ``--output`` file, the environment it was started with minus ``SLURM_*`` plus the
   ``SYNTHBATCH_LOCAL_*`` identity and ``CUDA_VISIBLE_DEVICES`` of its GPUs, and
   ``PR_SET_PDEATHSIG=SIGKILL``: if the supervisor dies (``kill -9``), its tasks die with
   it and status reports them ``NODE_FAIL``.

It is a child subreaper: processes a task leaves behind are re-parented to it; it reaps
them and, once no task of its job runs, kills what is left. It exits when every task has
ended. SIGTERM (or SIGINT) stops it gracefully: its tasks are cancelled first.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional

from synthbatch.agent_stdlib import localjob
from synthbatch.agent_stdlib.arrays import task_job_id
from synthbatch.agent_stdlib.statefile import ensure_dir, locked
from synthbatch.control.backends.local import proc, rounds
from synthbatch.control.backends.local.jobs import (
    CANCELLED,
    COMPLETED,
    FAILED,
    HEARTBEAT_S,
    PENDING,
    RUNNING,
    TIMEOUT,
    Job,
    Supervisor,
    Table,
    Task,
    supervisor_alive,
)
from synthbatch.control.backends.local.schedule import plan_starts

POLL_S = 0.2
SWEEP_S = 1.0
MAX_REQUEUES = 5  # Slurm's MaxBatchRequeue default
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _die_with_supervisor() -> None:
    """In a task before exec: SIGKILL it when the supervisor dies (its tasks end with it,
    as an allocation ends with its node; status then reports them NODE_FAIL)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def say(message: str) -> None:
    """One line of the supervisor's log."""
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor {os.getpid()}: {message}",
          file=sys.stderr, flush=True)


def output_path(job: Job, task: Task) -> Path:
    """The ``--output`` pattern filled in (``%A`` job, ``%a`` task, ``%j`` id, ``%x``
    name, ``%%``)."""
    values = {"A": job.job_id, "a": str(task.task), "j": str(task.raw_id), "x": job.name,
              "%": "%"}
    out, pattern, i = [], job.output, 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
            continue
        out.append(pattern[i])
        i += 1
    return Path("".join(out))


def task_env(base: Mapping[str, str], job: Job, task: Task, folder: Path,
             gpus: List[str]) -> Dict[str, str]:
    """A task's environment: ``base`` without Slurm's or a previous task's identity, plus
    its own (``agent_stdlib/localjob.py``) and its GPUs."""
    env = {k: v for k, v in base.items()
           if not k.startswith("SLURM") and k not in localjob.VARIABLES}
    env.update({localjob.JOB_ID: str(task.raw_id), localjob.ARRAY_JOB_ID: job.job_id,
                localjob.ARRAY_TASK_ID: str(task.task),
                localjob.RESTART_COUNT: str(task.restarts), localjob.TASK_DIR: str(folder),
                "CUDA_VISIBLE_DEVICES": ",".join(gpus)})
    return env


def note(job: Job, task: Task, text: str) -> None:
    """Append a line to the task's output, as slurmstepd does (``*** JOB ... ***``)."""
    try:
        with open(output_path(job, task), "a", encoding="utf-8") as handle:
            handle.write(f"synthbatch-local: *** JOB {task_job_id(job.job_id, task.task)} "
                         f"{text} AT {time.strftime('%Y-%m-%dT%H:%M:%S')} ***\n")
    except OSError:
        pass


class JobSupervisor:
    """Runs the tasks of one job until every one has ended."""

    def __init__(self, table: Table, job_id: str, env: Mapping[str, str]) -> None:
        self.table, self.job_id, self.env = table, job_id, dict(env)
        self.procs: Dict[int, subprocess.Popen] = {}
        self.stopping = False
        self.record: Optional[Supervisor] = None
        self.swept = 0.0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Record this process as the job's supervisor and release the job."""
        pid = os.getpid()
        now = time.time()
        self.record = self.table.save_supervisor(Supervisor(
            job_id=self.job_id, pid=pid, ticks=proc.start_ticks(pid),
            host=socket.gethostname(), boot_id=proc.boot_id(), started_at=now,
            heartbeat_at=now, log=str(self.table.supervisor_log(self.job_id)), revision=0))
        with self.table.locked():
            job = self._load()
            self.table.save_job(replace(job, held=False))
        say(f"job {self.job_id}: {len(job.tasks)} task(s), {job.gpus} GPU(s) each of "
            f"{','.join(job.pool) or 'none'}, at most {job.max_concurrent} at once")

    def run(self) -> int:
        """Poll until every task has ended; return the exit status."""
        while True:
            with self.table.locked():
                job = self._step(self._load(), time.time())
            if all(t.ended for t in job.tasks.values()):
                self._round(job)
                self._finish()
                return 0
            self._chores(job)
            time.sleep(POLL_S)

    def _round(self, job: Job) -> None:
        """The run's automatic round, when its record names this job (``rounds``): after
        the tasks, before ``stopped_at``, so status sees it pending while it runs; a
        supervisor asked to stop runs none. Not a subreaper any more first: the supervisor
        a retry starts must outlive this one."""
        if self.stopping:
            return
        self._sweep(force=True)
        _prctl(PR_SET_CHILD_SUBREAPER, 0)
        try:
            code = rounds.run_round(sys.executable, Path(job.workdir), self.job_id, self.env)
        except (OSError, subprocess.SubprocessError) as err:
            say(f"job {self.job_id}: the automatic round did not run: {err}")
            return
        if code is not None:
            say(f"job {self.job_id}: automatic round ended (exit {code})")

    def _finish(self) -> None:
        self._sweep(force=True)
        with self.table.locked():
            self.table.mark_active(self.job_id, False)
        if self.record is not None:
            self.record = self.table.save_supervisor(replace(self.record,
                                                             stopped_at=time.time()))
        say(f"job {self.job_id}: every task ended")

    def _load(self) -> Job:
        job = self.table.load_job(self.job_id)
        if job is None:
            raise RuntimeError(f"{self.table.job_json(self.job_id)} is missing")
        return job

    def _step(self, job: Job, now: float) -> Job:
        """One poll under the lock: record exits, send signals, start tasks."""
        before = job
        for task in list(job.tasks.values()):
            if task.state == RUNNING:
                job = job.with_task(self._running(job, task, now))
            elif task.state == PENDING and self.stopping:
                job = job.with_task(replace(task, state=CANCELLED, ended_at=now, exit_code=0,
                                            signal=0, reason=f"by {os.getuid()}"))
        if not self.stopping:
            job = self._start_pending(job, now)
        return self.table.save_job(job) if job != before else job

    def _chores(self, job: Job) -> None:
        now = time.time()
        if self.record is not None and now - self.record.heartbeat_at >= HEARTBEAT_S:
            try:
                self.record = self.table.save_supervisor(replace(self.record,
                                                                 heartbeat_at=now))
            except OSError as err:  # a full disk: keep running the tasks; say so
                say(f"cannot write the heartbeat: {err}")
                self.record = replace(self.record, heartbeat_at=now)  # next try in 2 s
        if now - self.swept >= SWEEP_S:
            self.swept = now
            self._sweep(force=not any(t.state == RUNNING for t in job.tasks.values()))

    # ------------------------------------------------------------------ running tasks

    def _running(self, job: Job, task: Task, now: float) -> Task:
        popen = self.procs.get(task.task)
        status = popen.poll() if popen is not None else -signal.SIGKILL
        if status is not None:
            return self._ended(job, task, status, now)
        if (task.cancel_requested_at is not None or self.stopping) and task.term_at is None:
            return self._terminate(job, task, localjob.CANCELLED, now,
                                   reason=task.reason or f"by {os.getuid()}")
        limit, lead = job.time_limit_s, job.signal_lead_s
        started = task.started_at or now
        if limit is not None and lead is not None and task.usr1_at is None \
                and now >= started + limit - lead:
            proc.signal_process(int(task.pid or 0), signal.SIGUSR1)  # B: the batch process
            say(f"task {task.task}: SIGUSR1 ({lead} s before its time limit)")
            task = replace(task, usr1_at=now)
        if limit is not None and task.term_at is None and now >= started + limit:
            note(job, task, "CANCELLED DUE TO TIME LIMIT")
            return self._terminate(job, task, localjob.TIME_LIMIT, now)
        if task.term_at is not None and task.kill_at is None \
                and now >= task.term_at + job.kill_wait_s:
            proc.signal_group(int(task.pid or 0), signal.SIGKILL)
            say(f"task {task.task}: SIGKILL ({job.kill_wait_s:g} s after SIGTERM)")
            task = replace(task, kill_at=now)
        return task

    def _terminate(self, job: Job, task: Task, cause: str, now: float,
                   reason: Optional[str] = None) -> Task:
        """SIGCONT + SIGTERM to the task's process group, the cause recorded first."""
        localjob.write_cause(self.table.task_dir(job.job_id, task.task), cause, "TERM")
        pgid = int(task.pid or 0)
        proc.signal_group(pgid, signal.SIGCONT)
        proc.signal_group(pgid, signal.SIGTERM)
        say(f"task {task.task}: SIGTERM ({cause})")
        return replace(task, term_at=now, cause=cause, reason=reason or task.reason)

    def _ended(self, job: Job, task: Task, status: int, now: float) -> Task:
        """The record of a task whose process exited with ``status`` (-N: signal N)."""
        self.procs.pop(task.task, None)
        code, signum = (status, 0) if status >= 0 else (0, -status)
        folder = self.table.task_dir(job.job_id, task.task)
        ended = replace(task, ended_at=now, exit_code=code, signal=signum)
        if task.cause == localjob.CANCELLED or task.cancel_requested_at is not None:
            ended = replace(ended, state=CANCELLED)
        elif localjob.requeue_requested(folder) and job.requeue \
                and task.restarts < MAX_REQUEUES:  # asked before any SIGTERM (localjob)
            localjob.clear(folder)
            note(job, task, "REQUEUED")
            say(f"task {task.task}: requeued (restart {task.restarts + 1})")
            return Task(task=task.task, raw_id=task.raw_id, restarts=task.restarts + 1,
                        reason="Requeued")
        elif task.cause == localjob.TIME_LIMIT:
            ended = replace(ended, state=TIMEOUT)
        else:
            ended = replace(ended, state=COMPLETED if status == 0 else FAILED)
        say(f"task {task.task}: {ended.state} (exit {code}:{signum})")
        return ended

    # ------------------------------------------------------------------ starting tasks

    def _start_pending(self, job: Job, now: float) -> Job:
        others = [j for j in (self._other(i) for i in self.table.active_jobs()
                              if i != job.job_id) if j is not None]
        everyone = [job] + [j for j, _ in others]
        eligible = {job.job_id} | {j.job_id for j, alive in others if alive and not j.held}
        live = {(j.job_id, t.task) for j in everyone for t in j.tasks.values()
                if t.state == RUNNING and proc.alive(t.pid, t.ticks)}
        live |= {(job.job_id, t) for t, p in self.procs.items() if p.poll() is None}
        starts, waits = plan_starts(everyone, eligible, live)
        for task in sorted(job.tasks.values(), key=lambda t: t.task):
            key = (job.job_id, task.task)
            if key in starts:
                job = job.with_task(self._spawn(job, task, list(starts[key]), now))
            elif key in waits and task.reason != waits[key] and task.state == PENDING:
                job = job.with_task(replace(task, reason=waits[key]))
        return job

    def _other(self, job_id: str) -> Optional[tuple]:
        """Another active job and whether its supervisor runs (None if unreadable)."""
        try:
            job = self.table.load_job(job_id)
            alive = supervisor_alive(self.table.load_supervisor(job_id))
        except Exception:  # noqa: BLE001 - a damaged record must not stop this job
            return None
        return (job, bool(alive)) if job is not None else None

    def _spawn(self, job: Job, task: Task, gpus: List[str], now: float) -> Task:
        folder = ensure_dir(self.table.task_dir(job.job_id, task.task))
        localjob.clear(folder)
        try:
            out = os.open(output_path(job, task),
                          os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            say(f"task {task.task}: cannot open {output_path(job, task)}: {err.strerror}")
            return replace(task, state=FAILED, ended_at=now, exit_code=1, signal=0)
        try:
            popen = subprocess.Popen(
                ["/bin/bash", job.script], cwd=job.workdir,
                env=task_env(self.env, job, task, folder, gpus), stdin=subprocess.DEVNULL,
                stdout=out, stderr=out, start_new_session=True, close_fds=True,
                preexec_fn=_die_with_supervisor)
        except OSError as err:
            say(f"task {task.task}: cannot start {job.script}: {err.strerror}")
            return replace(task, state=FAILED, ended_at=now, exit_code=1, signal=0)
        finally:
            os.close(out)
        self.procs[task.task] = popen
        say(f"task {task.task}: started pid {popen.pid} on GPUs {','.join(gpus) or 'none'} "
            f"(restart {task.restarts})")
        return replace(task, state=RUNNING, reason=None, pid=popen.pid,
                       ticks=proc.start_ticks(popen.pid), gpus=tuple(gpus), started_at=now,
                       ended_at=None, usr1_at=None, term_at=None, cause=None, kill_at=None)

    # ------------------------------------------------------------------ leftovers

    def _sweep(self, force: bool) -> None:
        """Reap adopted zombies; with ``force`` (no task runs) kill adopted leftovers."""
        mine = {p.pid for p in self.procs.values()}
        for pid, state in proc.children(os.getpid()):
            if pid in mine:
                continue
            if state not in ("Z", "X") and force:
                say(f"killing leftover process {pid}")
                proc.signal_group(pid, signal.SIGKILL)
                proc.signal_process(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def stop(self, signum: int, _frame: object) -> None:
        """SIGTERM/SIGINT handler: only records; the loop cancels the tasks."""
        self.stopping = True


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[bool]:
    """Hold ``path``'s flock while inside; yields False if another process holds it."""
    with locked(path, wait_s=0) as fd:
        yield fd is not None


def main(argv: List[str]) -> int:
    """Entry point: detach, start, tell the releaser, run the job to its end."""
    parser = argparse.ArgumentParser(prog="synthbatch-local-supervisor")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--job", required=True)
    parser.add_argument("--ready-fd", type=int, default=-1)
    args = parser.parse_args(argv)
    if os.fork():  # the session leader exits; the supervisor can never get a tty
        os._exit(0)
    os.umask(0o077)
    table = Table(args.root)
    supervisor = JobSupervisor(table, args.job, os.environ)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    with exclusive(table.job_dir(args.job) / "supervisor.lock") as mine:
        if not mine:
            say(f"job {args.job} already has a supervisor")
            return 3
        try:
            supervisor.start()
        except Exception:  # noqa: BLE001 - said in the log; the releaser sees no "ready"
            say("cannot start:\n" + traceback.format_exc())
            return 1
        if args.ready_fd >= 0:
            os.write(args.ready_fd, f"ready {os.getpid()}\n".encode())
            os.close(args.ready_fd)
        try:
            return supervisor.run()
        except Exception:  # noqa: BLE001 - a bug: stop the tasks rather than orphan them
            say("failed:\n" + traceback.format_exc())
            for popen in supervisor.procs.values():
                proc.signal_group(popen.pid, signal.SIGKILL)
            if supervisor.record is not None:
                table.save_supervisor(replace(supervisor.record, stopped_at=time.time()))
            return 1
