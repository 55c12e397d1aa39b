"""Failure reasons of an allocation: the cause first, then where to look.

A reason is one line read by a person in ``synthbatch status``; tools keep its front when
they must shorten it. So it opens with what failed and why — the step, how it ended
(:func:`ended`) and the last error line of its log (:func:`cause`: an engine's exception,
an HTTP status and message) — and ends with ``(log PATH: last lines)``, where to read on
(:func:`step_failure`). The control plane finds the log through ``(log PATH``.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import List, Optional

from ..text import visible
from .supervisor import log_text, tail

CAUSE_BYTES = 64 * 1024  # how far back a log is searched for its last error line
CAUSE_CHARS = 600  # at most this much of one error line goes into a reason
# a Python exception line ("torch.OutOfMemoryError: CUDA out of memory", "KeyError: 'x'"),
# at the start of a line (after srun's "N: " label) or after a prefix ("engine: ...Error: ")
_EXCEPTION = re.compile(r"^(?:\d+: ?)?[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b|"
                        r"\b[A-Za-z_][\w.]*(?:Error|Exception): ")
# any other line that says something went wrong (a log level, an HTTP status, a word)
_ERROR = re.compile(r"\b(?:error|errors|fatal|failed|failure|exception|killed|denied|refused|"
                    r"abort(?:ed)?|panic|out of memory|oom|HTTP [45]\d\d)\b", re.IGNORECASE)
_TRACEBACK = "Traceback (most recent call last)"
# srun's and slurmstepd's own words on how a step's tasks ended: the how, never the cause
# ("srun: error: node1: task 0: Exited with exit code 1", "srun: Job step aborted: ...",
# "slurmstepd-node1: error: *** STEP 329.1 ON node1 CANCELLED AT ... ***": slurmstepd
# names itself with the node's name on some builds)
_STEP_END = re.compile(r"^(?:\d+: ?)?(?:srun: error: \S+: tasks? [\d,-]+: |"
                       r"srun: (?:Job step aborted|Terminating|forcing job termination|"
                       r"launch/\w+: _step_signal)|"
                       r"slurmstepd(?:-\S+)?: error: \*\*\* (?:STEP|JOB) )")
_REFERS_BACK = re.compile(r"\babove\b", re.IGNORECASE)  # vLLM: "See root cause above."


def ended(status: int, srun: bool = False) -> str:
    """How a process ended, in words, from its Python return code: ``exited with status
    3``, ``was killed by signal 9 (SIGKILL)``. A negative code of an ``srun`` step is
    ``srun`` itself killed (its tasks' statuses are its exit status), so it says so:
    ``ended: srun was killed by signal 9 (SIGKILL)``. The one wording of all three."""
    if status >= 0:
        return f"exited with status {status}"
    return f"ended: {srun_status(status)}" if srun else _killed(status)


def srun_status(status: int) -> str:
    """An ``srun``'s return code in words: ``srun status 137``, ``srun was killed by
    signal 9 (SIGKILL)``."""
    return f"srun status {status}" if status >= 0 else f"srun {_killed(status)}"


def _killed(status: int) -> str:
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-status} ({name})"


def _is_error(line: str) -> bool:
    return bool(_EXCEPTION.search(line) or _ERROR.search(line)) and \
        _TRACEBACK not in line and not _STEP_END.match(line)


def cause(text: str) -> Optional[str]:
    """The last error line of a log (pure): the last Python exception line or line that
    says error/failed/killed/HTTP 4xx-5xx; when that line only points back ("see root
    cause above"), the error line before it comes first. ``srun``'s own lines on how the
    tasks ended are not causes. None when no line says so."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found: List[str] = []
    for line in reversed(lines):
        if not _is_error(line) or (found and line == found[0]):
            continue
        found.insert(0, line)
        if not _REFERS_BACK.search(line):
            break
    if not found:
        return None
    picked = found if len(found) <= 2 else [found[0], found[-1]]  # the root, the last
    return " | ".join(_short(visible(line)) for line in picked)


def _short(line: str) -> str:
    return line if len(line) <= CAUSE_CHARS else line[: CAUSE_CHARS - 1] + "…"


def log_cause(path: Path) -> Optional[str]:
    """:func:`cause` of the end of the log at ``path`` (None if unreadable or no error)."""
    return cause(log_text(path, CAUSE_BYTES))


def step_failure(what: str, log: Path) -> str:
    """``WHAT: CAUSE (log PATH: last lines)``, the cause being the log's last error line;
    without one, ``WHAT (log PATH: last lines)``."""
    found = log_cause(log)
    head = f"{what}: {found}" if found else what
    return f"{head} (log {log}: {tail(log) or 'no output'})"
