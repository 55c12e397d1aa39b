"""The one way a Slurm command is run: argv list, ``LC_ALL=C``, timeout, captured output."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from control.errors import SchedulerUnavailable, SchedulerUncertain, one_line

# stderr fragments that mean "slurmctld/slurmdbd is busy or away", not "your request is wrong"
TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Connection refused",
             "Resource temporarily unavailable", "rate limit", "Too many",
             "Problem talking to the database", "slurmdbd", "Zero Bytes were transmitted")


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        """The command as one printable, redacted line."""
        return describe(self.argv)

    def error_line(self) -> str:
        """The first non-empty stderr line (or the exit status), redacted and capped."""
        for line in self.stderr.splitlines():
            if line.strip():
                return one_line(line, 300)
        return f"exit status {self.returncode}"

    @property
    def transient(self) -> bool:
        """True when stderr says the scheduler is busy or unreachable (retry later)."""
        return any(fragment in self.stderr for fragment in TRANSIENT)


class CommandTimeout(SchedulerUncertain):
    """The command did not finish in time: its effect is unknown (it may have happened)."""


Runner = Callable[[Sequence[str], float], CommandResult]


def describe(argv: Sequence[str]) -> str:
    """``argv`` as one shell-quoted, redacted line."""
    return one_line(shlex.join(list(argv)), 300)


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """Run ``argv`` with ``LC_ALL=C`` and no stdin; raise SchedulerUnavailable if it cannot.

    A timeout raises CommandTimeout (the command may still have taken effect).
    """
    env = dict(os.environ, LC_ALL="C")
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout_s, env=env, check=False)
    except FileNotFoundError as err:
        raise SchedulerUnavailable(f"{argv[0]}: command not found",
                                   hint="install the Slurm client or set slurm_bin") from err
    except OSError as err:
        raise SchedulerUnavailable(f"{argv[0]}: cannot run ({err.strerror})") from err
    except subprocess.TimeoutExpired as err:
        raise CommandTimeout(f"{describe(argv)}: no answer within {timeout_s:g}s "
                             f"(it may have taken effect)") from err
    return CommandResult(argv=list(argv), returncode=proc.returncode, stdout=proc.stdout,
                         stderr=proc.stderr)


def binary(name: str, slurm_bin: Optional[str]) -> str:
    """The path of a Slurm binary: inside ``slurm_bin`` if set, else found on PATH."""
    return os.path.join(slurm_bin, name) if slurm_bin else name
