"""Child processes in their own sessions, stopped through their process groups.

Stopping is one idempotent operation with a shared deadline: every child gets a graceful
SIGTERM at once (newest first), the supervisor waits up to the grace, SIGKILLs what is
left, and then confirms that every managed process group is empty and every ``srun``
step is gone. Children that are ``srun`` steps are signalled through their step
(see :mod:`agent_stdlib.allocation.steps`), because ``srun`` itself answers SIGTERM with SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..text import visible
from .signals import SignalCoordinator
from .steps import StepControl

LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND
PR_SET_PDEATHSIG = 1
URGENT_GRACE_S = 2.0  # after a hard signal Slurm's KillWait is running (5 s on the testbed)
CONFIRM_S = 5.0
POLL_S = 0.05


@dataclass
class Managed:
    """One supervised child (``step`` is its srun step name, if it is a step)."""

    name: str
    argv: List[str]
    process: subprocess.Popen
    log_path: Path
    step: Optional[str] = None
    ranks: int = 1  # tasks of a step that runs one replica across nodes (srun --label)

    @property
    def pid(self) -> int:
        """The child's pid (also its process group id)."""
        return self.process.pid

    def exit_code(self) -> Optional[int]:
        """The exit status if the child has exited, else None."""
        return self.process.poll()


def open_log(path: Path) -> int:
    """Create a log file that must not exist yet (0600); return its fd."""
    return os.open(str(path), LOG_FLAGS, 0o600)


def log_text(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a log file, decoded leniently ("" if unreadable)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a log file, decoded leniently, on one line, control
    characters made visible (a failure reason quotes it; ``agent_stdlib.text``)."""
    text = log_text(path, limit)
    lines = [visible(line.strip()) for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-5:])


@dataclass
class Supervisor:
    """Starts children and owns their termination."""

    signals: SignalCoordinator
    steps: Optional[StepControl] = None
    children: List[Managed] = field(default_factory=list)
    stopped: bool = False
    urgent_at: Optional[float] = None
    unconfirmed: Optional[str] = None  # why the last stop_all could not confirm the end
    unanswered: bool = False  # squeue did not answer during this stop_all

    def start(self, name: str, argv: Sequence[str], env: Dict[str, str], log_path: Path,
              step: bool = False) -> Managed:
        """Start ``argv`` in a new session, output appended to ``log_path`` (O_EXCL 0600)."""
        if self.stopped:
            raise RuntimeError(f"cannot start {name}: the supervisor has stopped")
        fd = open_log(log_path)
        try:
            with self.signals.critical():  # a signal here is replayed once registered
                process = subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL,
                                           stdout=fd, stderr=fd, start_new_session=True,
                                           close_fds=True, preexec_fn=die_with_parent)
                child = Managed(name=name, argv=list(argv), process=process,
                                log_path=log_path, step=name if step else None)
                self.children.append(child)
        finally:
            os.close(fd)
        return child

    def interrupt(self, child: Managed, signum: int) -> None:
        """Send ``signum`` to a child's group (``srun`` forwards SIGUSR1 to its tasks)."""
        if child.exit_code() is None:
            _signal_group(child.pid, signum)

    def stop_all(self, grace_s: float) -> bool:
        """Stop every child (idempotent); True when every process and step is confirmed gone.

        When it is not, ``unconfirmed`` says what could not be confirmed.
        """
        self.stopped = True
        self.unanswered = False
        live = [c for c in reversed(self.children) if _alive(c)]
        if live:
            self._terminate(live)
            deadline = time.monotonic() + grace_s
            while any(_alive(c) for c in live) and time.monotonic() < self._cut(deadline):
                time.sleep(POLL_S)
            self._kill([c for c in live if _alive(c)])
        return self._confirm()

    def stop_one(self, child: Managed, grace_s: float) -> bool:
        """Stop one child (its step and process group: SIGTERM, then SIGKILL after the
        grace) before it is started again; True when its group is confirmed empty."""
        if _alive(child):
            self._terminate([child])
            deadline = time.monotonic() + grace_s
            while _alive(child) and time.monotonic() < self._cut(deadline):
                time.sleep(POLL_S)
            if _alive(child):
                self._kill([child])
        try:
            child.process.wait(timeout=CONFIRM_S)
        except subprocess.TimeoutExpired:
            return False
        return wait_group_gone(child.pid, CONFIRM_S)

    def _cut(self, deadline: float) -> float:
        if self.signals.urgent:
            return min(deadline, self._urgent_deadline())
        return deadline

    def _urgent_deadline(self) -> float:
        if self.urgent_at is None:
            self.urgent_at = time.monotonic() + URGENT_GRACE_S
        return self.urgent_at

    def _terminate(self, live: List[Managed]) -> None:
        signalled = self._signal_steps(live, "TERM")
        for child in live:
            if child.step not in signalled:  # local child, or a step squeue does not show
                _signal_group(child.pid, signal.SIGTERM)

    def _kill(self, live: List[Managed]) -> None:
        self._signal_steps(live, "KILL")
        for child in live:
            _signal_group(child.pid, signal.SIGKILL)

    def _signal_steps(self, live: List[Managed], signame: str) -> List[str]:
        names = [c.step for c in live if c.step]
        if not names or self.steps is None or self.unanswered:
            return []
        done = self.steps.try_signal(names, signame)
        if done is None:
            # slurmctld does not answer (each try costs the client's ~10 s of connect
            # retries): the process groups get the signals, Slurm is not asked again
            self.unanswered = True
            return []
        return done

    def _confirm(self) -> bool:
        deadline = time.monotonic() + CONFIRM_S
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child.pid, signal.SIGKILL)
        survivors = [c.name for c in self.children
                     if not wait_group_gone(c.pid, max(0.0, deadline - time.monotonic()))]
        if survivors:
            self.unconfirmed = f"{', '.join(survivors)} survived SIGKILL"
            return False
        return self._steps_gone(deadline)

    def _steps_gone(self, deadline: float) -> bool:
        names = [c.step for c in self.children if c.step]
        if not names or self.steps is None:
            self.unconfirmed = None
            return True
        while True:
            left = None if self.unanswered else self.steps.alive(names)
            if left == []:
                self.unconfirmed = None
                return True
            if self.unanswered or time.monotonic() > deadline:
                # squeue failing (slurmctld down) is not a survivor: every process is gone
                self.unconfirmed = (
                    "every process is gone, but squeue could not be asked whether their "
                    "steps are (is slurmctld up?)" if left is None else
                    f"step {', '.join(left)} survived SIGKILL")
                return False
            if left:
                self.steps.signal(left, "KILL")
            time.sleep(0.2)


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it if its parent (the agent, or a rank's ``serve``
    role) dies (``kill -9``, OOM).

    Slurm reaps what is left of the batch step when the job ends, but a child that was
    re-parented to init escapes process tracking without cgroups; this closes that gap.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _alive(child: Managed) -> bool:
    return child.exit_code() is None or _group_alive(child.pid)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process is left in group ``pgid``; True if it emptied in time."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True
