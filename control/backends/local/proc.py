"""Which process is which, from ``/proc`` (Linux): a pid alone can be reused.

A process is named by its pid and its start time in clock ticks since boot (field 22 of
``/proc/<pid>/stat``); together with the boot id that is unique on a machine. A zombie
(state ``Z``, or ``X``) counts as gone: it can no longer do anything, and where nothing
reaps orphans (some container inits do not) it would otherwise look alive forever.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple

PROC = Path("/proc")


def _stat(pid: int) -> Optional[Tuple[str, int, int]]:
    """(state, parent pid, start ticks) of ``pid``; None if there is no such process."""
    try:
        text = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
    try:
        return fields[0], int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> Optional[int]:
    """When ``pid`` started (clock ticks since boot), or None if it does not exist."""
    found = _stat(pid)
    return found[2] if found else None


def alive(pid: Optional[int], ticks: Optional[int]) -> bool:
    """True while the process ``pid`` that started at ``ticks`` runs (not a zombie)."""
    if not pid:
        return False
    found = _stat(pid)
    return found is not None and found[0] not in ("Z", "X") and \
        (ticks is None or found[2] == ticks)


def boot_id() -> str:
    """This boot of this machine (pids and start ticks are unique within it)."""
    try:
        return (PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def children(parent: int) -> Iterator[Tuple[int, str]]:
    """``(pid, state)`` of every process whose parent is ``parent``."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[1] == parent:
                yield int(entry.name), found[0]


def _send(send: Callable[[int, int], None], target: int, signum: int) -> bool:
    try:
        send(target, signum)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if it has no process left."""
    return _send(os.killpg, pgid, signum)


def signal_process(pid: int, signum: int) -> bool:
    """Send ``signum`` to ``pid``; False if it does not exist."""
    return _send(os.kill, pid, signum)
