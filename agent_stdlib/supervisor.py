"""Child processes in their own sessions, stopped through their process groups.

Stop order is the reverse of start order: SIGTERM to the group, wait up to a grace,
SIGKILL, then confirm the child has been reaped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND


@dataclass
class Managed:
    """One supervised child."""

    name: str
    argv: List[str]
    process: subprocess.Popen[bytes]
    log_path: Path

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


def tail(path: Path, limit: int = 2000) -> str:
    """The last ``limit`` bytes of a log file, decoded leniently, on one line."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-5:])


@dataclass
class Supervisor:
    """Starts children and owns their termination."""

    children: List[Managed] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Dict[str, str], log_path: Path,
              cwd: Optional[Path] = None) -> Managed:
        """Start ``argv`` in a new session with stdout+stderr appended to ``log_path``."""
        fd = open_log(log_path)
        try:
            process = subprocess.Popen(
                list(argv),
                env=env,
                cwd=str(cwd) if cwd else None,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
        child = Managed(name=name, argv=list(argv), process=process, log_path=log_path)
        self.children.append(child)
        return child

    def exited(self) -> List[Managed]:
        """Children that have exited (not removed from supervision)."""
        return [c for c in self.children if c.exit_code() is not None]

    def stop(self, child: Managed, grace_s: float) -> int:
        """Stop one child: TERM its group, wait ``grace_s``, KILL; return its exit status."""
        deadline = time.monotonic() + grace_s
        if child.exit_code() is None or _group_alive(child.pid):
            _signal_group(child.pid, signal.SIGTERM)
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if not wait_group_gone(child.pid, max(0.0, deadline - time.monotonic())):
            _signal_group(child.pid, signal.SIGKILL)  # the leader or stragglers in its group
        child.process.wait()
        wait_group_gone(child.pid, 5.0)
        return int(child.process.returncode)

    def stop_all(self, grace_s: float) -> None:
        """Stop every child in reverse start order and confirm each is reaped."""
        for child in reversed(self.children):
            self.stop(child, grace_s)

    def all_gone(self) -> bool:
        """True when no supervised process group has a live member."""
        return all(not _group_alive(c.pid) for c in self.children)


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
        time.sleep(0.05)
    return True
