"""Automatic next attempts: one small CPU-only Slurm job per round, no login-node process.

A *round* is what ``retry --auto`` does, run by a job Slurm starts after the run's jobs end
(``--dependency=afterany:<jobs>``): it refreshes status, submits attempt N+1 of the failed
shards below ``max_attempts`` (through ``retry_run``, so under the run's retry lock: a manual
retry and the round converge on one submission), then submits its own successor after the
jobs it just submitted, while anything can still change. When the run is over it submits
nothing (or, when asked, the merge job; docs/retry.md "Automatic retries").

Pure rules first (``decide``, ``story``, ``render_script``, ``sbatch_argv``), then the I/O
edges (``load_pending``, ``record_pending``, ``submit_round``; the round itself:
``autoround.run_round``). The record of the pending round job is ``<run>/auto/round.json``
(temp + fsync + rename); it is written under the retry lock (``RetryLock``), which keeps
at most one round job per run: a round that finds a recorded job still queued or running
submits no second one.

Where the round's Python comes from: the control plane's own interpreter
(``sys.executable`` at submit time), which must be visible on the compute nodes (a shared
filesystem); ``python_visible`` is the plan-time check of that.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    locked,
    read_bytes,
    read_json,
    read_json_or_none,
    write_bytes_atomic,
    write_json_atomic,
)
from synthbatch.agent_stdlib.text import visible
from synthbatch.control.errors import Conflict
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.rows import ShardRow

if TYPE_CHECKING:
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.slurm.scheduler import Scheduler

ROUND_SCRIPT = "round.sbatch"
ROUND_TIME = "00:05:00"  # a round is one status refresh and at most two sbatch calls
ROUND_MEM = "512M"
IDLE_BEGIN = "now+60"  # a successor with no shard job to wait for starts no sooner
MERGE_TIME = "02:00:00"  # the merge job: a copy of the run's winners (docs/retry.md)
RETRY, MERGE = "retry", "merge"  # what the pending automatic job will do
RETRYABLE = norm.FAILING  # cancelled shards were a person's decision
LOCK_WAIT_S = 60.0


@dataclass(frozen=True)
class Decision:
    """What one round does, from the shards alone (no I/O)."""

    retry: Tuple[int, ...]  # failed shards below max_attempts: attempt N+1 now
    waiting: Tuple[int, ...]  # shards that have not ended: a later round judges them
    exhausted: Tuple[int, ...]  # failed with every attempt used
    over: bool  # nothing can change any more: no successor
    merge: bool  # the run is over and its merge should be submitted now
    halted: Optional[str] = None  # the run was cancelled: this round submitted nothing

    @property
    def successor(self) -> bool:
        """A round job follows this one while anything can still change."""
        return not self.over


def decide(shards: Sequence[ShardRow], max_attempts: int, merge_wanted: bool = False,
           allow_partial: bool = False) -> Decision:
    """The round's decision: which shards get attempt N+1, whether the run is over.

    A shard that has not ended keeps the run going (its outcome is judged by a later round);
    a failed (or lost) shard whose latest attempt is below ``max_attempts`` is retried;
    cancelled shards are never retried automatically. The merge is due once the run is over
    and every shard succeeded, or with ``allow_partial`` once it is over at all.
    """
    retry, waiting, exhausted = [], [], []
    for shard in shards:
        if shard.state not in norm.FINAL:
            waiting.append(shard.index)
        elif shard.state in RETRYABLE:
            (retry if (shard.attempt or 0) < max_attempts else exhausted).append(shard.index)
    over = not retry and not waiting
    complete = all(s.state == norm.SUCCEEDED for s in shards)
    # a cancelled shard was a person's decision: no automatic merge then (merge by hand)
    cancelled = any(s.state == norm.CANCELLED for s in shards)
    merge = over and merge_wanted and not cancelled and (complete or allow_partial)
    return Decision(tuple(retry), tuple(waiting), tuple(exhausted), over, merge)


def story(shards: Sequence[ShardRow], max_attempts: int, round_pending: bool) -> Optional[str]:
    """What ``runs`` shows while an automatic retry is under way, else None.

    ``retrying (attempt 2 of 3)``: the highest attempt a failed-then-retried shard is on.
    """
    if not round_pending:
        return None
    attempts = [s.attempt or 1 for s in shards if s.state not in norm.FINAL or
                (s.state in RETRYABLE and (s.attempt or 0) < max_attempts)]
    retried = [a for a in attempts if a > 1]
    if not retried:
        return "automatic retry pending" if any(
            s.state in RETRYABLE for s in shards) else None
    return f"retrying (attempt {max(retried)} of {max_attempts})"


def render_script(python: str, run_id: str, workspace: str, action: str = RETRY) -> str:
    """The automatic job's batch script: ``exec`` of the control plane's Python (quoted);
    ``action`` merge: the merge job (``--merge``)."""
    argv = [python, "-m", "synthbatch.control.cli.autoround", "--workspace", workspace, run_id,
            *(["--merge"] if action == MERGE else [])]
    return "#!/bin/bash\nset -eu\nexec " + " ".join(shlex.quote(a) for a in argv) + "\n"


def round_job_name(run_id: str) -> str:
    """The round job's name (not the array's: status never mistakes it for a shard)."""
    return f"synthbatch-auto-{run_id}"


def sbatch_argv(script: Path, run_id: str, after: Sequence[str], log: Path,
                partition: Optional[str] = None, account: Optional[str] = None,
                time_limit: str = ROUND_TIME, begin: Optional[str] = None) -> List[str]:
    """``sbatch`` arguments of one round: one CPU, no GPU, a few minutes, after ``after``
    (``begin``: not before then)."""
    argv = ["--parsable", f"--job-name={round_job_name(run_id)}", "--cpus-per-task=1",
            f"--mem={ROUND_MEM}", f"--time={time_limit}", "--kill-on-invalid-dep=yes",
            f"--output={log}"]
    if after:
        argv.append("--dependency=afterany:" + ":".join(after))
    if begin:
        argv.append(f"--begin={begin}")
    if partition:
        argv.append(f"--partition={partition}")
    if account:
        argv.append(f"--account={account}")
    return argv + [str(script)]


def python_visible(python: str, shared: Callable[[Path], bool]) -> Optional[str]:
    """Why ``python`` may not run a round on a compute node, or None (the plan-time check;
    ``shared``: whether a path is on a filesystem the nodes see, ``checks.Sight.shared``)."""
    path = Path(python)
    if not path.is_absolute() or not os.access(path, os.X_OK):
        return f"the control plane's Python {python!r} is not an executable absolute path"
    if not shared(path):
        return (f"the control plane's Python {python} is not on a shared filesystem (the "
                f"workspace's or a network one): the automatic round job may not find it")
    return None


# ----------------------------------------------------------------------------- I/O edges


@contextlib.contextmanager
def RetryLock(layout: RunLayout, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """The run's retry lock: ``flock`` on ``<run>/retry.lock`` (``statefile.locked``), held
    by everything that selects shards to run again (retry, the automatic rounds) and by
    cancel while it reads the shards, so that they converge on one outcome. Waited for at
    most ``wait_s`` (0: try once); Conflict naming its holder when not had."""
    path = layout.retry_lock
    with locked(path, wait_s) as fd:
        if fd is None:
            holder = (read_bytes(path) or b"").decode("utf-8", "replace").strip()
            raise Conflict(f"{path}: another retry of this run is in progress "
                           f"({holder or 'holder unknown'})",
                           hint="wait for it, then run status")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
        yield  # closing the descriptor at the end releases the flock


def load_pending(layout: RunLayout) -> Optional[Dict[str, object]]:
    """The recorded round job (``job_id``, ``round``, ``after``), or None (damage: None)."""
    data = read_json_or_none(layout.round_json)
    if data is None or not isinstance(data.get("job_id"), str):
        return None
    return data


def halt(layout: RunLayout, why: str) -> None:
    """Stop the automatic rounds for good (``cancel`` of the whole run): a round that runs
    now, or later, submits no attempt, no successor and no merge once it reads this."""
    ensure_dir(layout.auto)
    write_json_atomic(layout.auto_halted, {"at": time.time(), "why": why})


def halted(layout: RunLayout) -> Optional[str]:
    """Why the automatic rounds are stopped, or None. A damaged record still stops them
    (its presence is the stop) and says so."""
    path = layout.auto_halted
    if not os.path.lexists(path):
        return None
    try:
        data = read_json(path)
    except (StateError, OSError) as err:
        return f"{err}; the automatic rounds stay stopped"
    why = data.get("why") if isinstance(data, dict) else None
    return visible(why) if isinstance(why, str) and why else \
        f"{path}: the automatic rounds are stopped"


def pending_job_ids(layout: RunLayout) -> List[str]:
    """The round job ``cancel`` must scancel too (nothing further is submitted after it)."""
    pending = load_pending(layout)
    return [str(pending["job_id"])] if pending and pending.get("job_id") else []


def record_pending(layout: RunLayout, job_id: Optional[str], number: int,
                   after: Sequence[str], action: str = RETRY, attempt: int = 1) -> None:
    """Write the round record (``job_id`` None: no round is pending any more); ``action``
    is what the job will do, ``attempt`` the highest attempt the rounds have submitted."""
    ensure_dir(layout.round_json.parent)
    write_json_atomic(layout.round_json, {"job_id": job_id, "round": number,
                                            "after": list(after), "at": time.time(),
                                            "action": action, "attempt": attempt})


def clear_pending(layout: RunLayout) -> None:
    """No automatic job is pending any more (the merge job's end, a cancel): the record
    keeps its round number and attempt, and names no job. The caller holds the lock."""
    pending = load_pending(layout)
    if pending is not None:
        record_pending(layout, None, int(pending.get("round") or 0), (),
                       attempt=int(pending.get("attempt") or 1))


def _queued(scheduler: Scheduler, job_id: str) -> bool:
    supervising = getattr(scheduler, "supervising", None)  # the local backend's rounds
    if supervising is not None:
        return bool(supervising(job_id))
    return any(row.state in norm.RUNNING_ROWS or row.state == "PENDING"
               for row in scheduler.queue([job_id]))


def round_now(layout: RunLayout, scheduler: Scheduler,
              rows: Callable[[], Sequence[ShardRow]],
              max_attempts: Callable[[], int]) -> Optional[Dict[str, object]]:
    """The pending round job as ``status`` shows it (None: none queued or running).

    ``rows`` (the status refresh's rows) and ``max_attempts`` (from
    the plan, whose contracts a plain ``status`` never imports) are read only when a round is
    pending, for the story ``runs`` tells ("retrying (attempt 2 of 3)").
    """
    pending = load_pending(layout)
    if not pending or not _queued(scheduler, str(pending["job_id"])):
        return None
    shards = rows()
    merge = pending.get("action") == MERGE
    return {"job_id": pending["job_id"], "round": pending.get("round"),
            "action": MERGE if merge else RETRY,
            "story": "merging" if merge else story(shards, max_attempts(), True)}


def job_log(layout: RunLayout, number: int, action: str) -> Path:
    """``<run>/auto/round-NNNN.out`` (``merge-NNNN.out`` for the merge job): Slurm's log of
    automatic job ``number``."""
    return layout.auto / f"{'merge' if action == MERGE else 'round'}-{number:04d}.out"


def lost_note(layout: RunLayout, scheduler: Scheduler) -> Optional[str]:
    """``status``'s note when the recorded automatic job left the queue without finishing
    its round (killed, out of time, its Python not found on the node): a round that
    finishes always records its successor or none, so nothing more will be submitted
    automatically. None otherwise (and after a cancel, which says why itself)."""
    pending = load_pending(layout)
    if not pending or halted(layout) or _queued(scheduler, str(pending["job_id"])):
        return None
    merge = pending.get("action") == MERGE
    log = job_log(layout, int(pending.get("round") or 0), MERGE if merge else RETRY)
    return (f"the automatic {'merge' if merge else 'round'} job {visible(pending['job_id'])} "
            f"ended without finishing (its log: {log}): nothing more is submitted "
            f"automatically; `synthbatch {'merge' if merge else 'retry --auto'} "
            f"{layout.root.name}` does it by hand")


def due_locally(layout: RunLayout, job_id: str) -> bool:
    """Local backend: whether the run's recorded round is ``job_id``'s supervisor's to run
    (the record names that job, or waits for it)."""
    pending = load_pending(layout)
    if not pending or pending.get("action") == MERGE:
        return False
    return pending["job_id"] == job_id or job_id in (pending.get("after") or [])


def listed_story(layout: RunLayout, state: str, max_attempts: Optional[int]) -> Optional[str]:
    """What ``runs`` (records only, no Slurm) says of a run whose automatic job is recorded
    pending: "merging", or "retrying (attempt 2 of 3)" once the rounds have submitted a
    second attempt (a run that looks over waits for its round: the next attempt); None
    for a cancelled run or when no automatic job is recorded."""
    pending = load_pending(layout)
    if not pending or state == norm.CANCELLED:
        return None
    if pending.get("action") == MERGE:
        return "merging"
    attempt = int(pending.get("attempt") or 1) + (1 if state in norm.FINAL else 0)
    if attempt < 2 or state == norm.SUCCEEDED or not max_attempts or attempt > max_attempts:
        return None
    return f"retrying (attempt {attempt} of {max_attempts})"


def submit_round(layout: RunLayout, profile: Profile, scheduler: Scheduler, run_id: str,
                 after: Sequence[str], number: int, python: Optional[str] = None,
                 own_job: Optional[str] = None, action: str = RETRY,
                 attempt: int = 1, begin: Optional[str] = None) -> Optional[str]:
    """Submit round ``number`` after ``after`` (``action`` merge: the merge job, at once);
    None when another automatic job is pending.

    The caller holds the run's retry lock: a recorded round job that is still queued (and
    is not the caller itself) means there is one already, and none is added.
    """
    pending = load_pending(layout)
    if pending and pending.get("job_id") and pending["job_id"] != own_job \
            and _queued(scheduler, str(pending["job_id"])):
        return None
    folder = ensure_dir(layout.auto)
    script = folder / ("merge.sbatch" if action == MERGE else ROUND_SCRIPT)
    write_bytes_atomic(script, render_script(python or sys.executable, run_id,
                                             str(profile.workspace), action).encode(),
                       mode=0o700)
    log = job_log(layout, number, action)
    argv = sbatch_argv(script, run_id, after, log, profile.partition, profile.account,
                       MERGE_TIME if action == MERGE else ROUND_TIME, begin)
    job_id = scheduler.submit_job(argv)
    record_pending(layout, job_id, number, after, action, attempt)
    return job_id
