"""Pure parsers of Slurm's text output (tested on captured strings)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional

JOB_ID = re.compile(r"([0-9]{1,10})(;[A-Za-z0-9_.-]+)?")
MAX_JOB_ID = 2**32 - 1


class ParseError(ValueError):
    """Slurm printed something this parser does not understand."""


@dataclass(frozen=True)
class JobRow:
    """One job (or array task) as squeue or sacct reports it."""

    job_id: str  # "12" or "12_3"; pending array ranges stay "12_[4-9%2]"
    state: str  # upper-case base state, e.g. RUNNING, CANCELLED
    reason: Optional[str] = None  # squeue reason or sacct "by UID"
    exit_code: Optional[int] = None
    signal: Optional[int] = None


def parse_sbatch_id(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` (``12345`` or ``12345;cluster``)."""
    text = stdout.strip()
    match = JOB_ID.fullmatch(text)
    if not match or int(match.group(1)) > MAX_JOB_ID:
        raise ParseError(f"sbatch printed {text[:80]!r}, not a job id")
    return match.group(1)


def _exit(field: str) -> tuple[Optional[int], Optional[int]]:
    if not field:
        return None, None
    parts = field.split(":")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise ParseError(f"malformed exit code {field!r}")
    return int(parts[0]), int(parts[1])


def parse_squeue(text: str) -> Dict[str, JobRow]:
    """Rows of ``squeue -h -r -o '%i|%T|%r'``, keyed by job id."""
    rows: Dict[str, JobRow] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3 or not parts[0] or not parts[1].isupper():
            raise ParseError(f"malformed squeue line {line[:120]!r}")
        reason = parts[2] if parts[2] not in ("", "None") else None
        rows[parts[0]] = JobRow(job_id=parts[0], state=parts[1], reason=reason)
    return rows


def parse_sacct(text: str) -> Dict[str, JobRow]:
    """Rows of ``sacct -n -P -X --format=JobID,State,ExitCode``; the last row of an id wins."""
    rows: Dict[str, JobRow] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise ParseError(f"malformed sacct line {line[:120]!r}")
        state_words = parts[1].split(" ", 1)
        code, sig = _exit(parts[2])
        rows[parts[0]] = JobRow(job_id=parts[0], state=state_words[0],
                                reason=state_words[1] if len(state_words) > 1 else None,
                                exit_code=code, signal=sig)
    return rows
