"""The one way a Slurm command is run: argv list, ``LC_ALL=C``, timeout, captured output."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from control.errors import SchedulerUnavailable


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    argv: Sequence[str]
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        """The command as one printable line."""
        return shlex.join(self.argv)

    def error_line(self) -> str:
        """The first non-empty stderr line (or the exit status)."""
        for line in self.stderr.splitlines():
            if line.strip():
                return line.strip()[:300]
        return f"exit status {self.returncode}"


class CommandTimeout(SchedulerUnavailable):
    """The command did not finish in time: its effect is unknown (it may have happened)."""


Runner = Callable[[Sequence[str], float], CommandResult]


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """Run ``argv`` with ``LC_ALL=C``; raise SchedulerUnavailable if it cannot run."""
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
        raise CommandTimeout(f"{shlex.join(argv)}: no answer within {timeout_s:g}s "
                             f"(it may have taken effect)") from err
    return CommandResult(argv=list(argv), returncode=proc.returncode, stdout=proc.stdout,
                         stderr=proc.stderr)


def binary(name: str, slurm_bin: Optional[str]) -> str:
    """The path of a Slurm binary: inside ``slurm_bin`` if set, else found on PATH."""
    return os.path.join(slurm_bin, name) if slurm_bin else name
