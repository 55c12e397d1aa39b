"""The one way a Slurm command is run: argv list, ``LC_ALL=C``, timeout, captured output.

Also the one classification of what a failed Slurm client said (measured on 22.05):

* no configuration (``NO_CONFIG``): ``SLURM_CONF`` unset and no DNS SRV record prints
  ``fatal: Could not establish a configuration source``; a ``SLURM_CONF`` naming a missing
  file makes every client retry for 60 s, then ``fatal: Unable to process configuration
  file``. Nothing reached slurmctld. ``run_command`` refuses such a ``SLURM_CONF`` at once
  instead of waiting out the 60 s.
* unreachable (``UNREACHABLE``): ``Unable to contact slurm controller (connect failure)``
  after ~9 s of connect retries when slurmctld is down.
* busy (``TRANSIENT``): the fragments above plus timeouts and rate limits: retry later;
  for a command that changes state, it may have taken effect.
* accounting unreachable (``NO_DATABASE``): with slurmdbd stopped and slurmctld up, sacct
  exits 1 at once with ``sacct: error: Problem talking to the database: Connection
  refused`` (after two lines naming the persistent connection to slurmdbd's port); squeue,
  sbatch and scancel still work.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Sequence

from synthbatch.control.errors import SchedulerUnavailable, SchedulerUncertain, one_line

NO_CONFIG = ("Could not establish a configuration source", "Unable to process configuration file",
             "cannot stat file")
UNREACHABLE = ("Unable to contact slurm controller", "Connection refused")
NO_DATABASE = ("Problem talking to the database",)
# stderr fragments that mean "slurmctld/slurmdbd is busy or away", not "your request is wrong"
TRANSIENT = UNREACHABLE + ("Socket timed out", "Resource temporarily unavailable",
                           "rate limit", "Too many", "slurmdbd", "Zero Bytes were transmitted"
                           ) + NO_DATABASE
SLURM_CLIENTS = frozenset({"sbatch", "squeue", "sacct", "sacctmgr", "scancel", "scontrol",
                           "sinfo", "srun"})


def config_hint(environ: Optional[Mapping[str, str]] = None) -> str:
    """The hint for a Slurm client that found no cluster configuration."""
    conf = (os.environ if environ is None else environ).get("SLURM_CONF")
    if not conf:
        return "is SLURM_CONF set? (it is not set, and Slurm found no configuration)"
    if not os.path.isfile(conf):
        return f"is SLURM_CONF set? (it names {conf}, which does not exist)"
    return f"is SLURM_CONF set? (Slurm could not use {conf})"


def controller_hint(environ: Optional[Mapping[str, str]] = None) -> str:
    """The hint for a Slurm client that could not reach slurmctld."""
    conf = (os.environ if environ is None else environ).get("SLURM_CONF")
    return "is slurmctld up?" + ("" if conf else " (SLURM_CONF is not set: Slurm used its "
                                                 "default configuration)")


def database_hint() -> str:
    """The hint for sacct that could not reach the accounting database."""
    return "is slurmdbd up? (sacct could not reach Slurm's accounting database)"


def config_problem(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why no Slurm client can work with this environment's ``SLURM_CONF``, or None."""
    conf = (os.environ if environ is None else environ).get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf}: no such file"
    return None


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
        """The stderr line that says most (a ``fatal:`` line, else one naming a known
        failure, else the first non-empty one) or the exit status; redacted and capped."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        best = [line for line in lines if "fatal:" in line] or \
            [line for line in lines if any(f in line for f in NO_DATABASE)] or \
            [line for line in lines if any(f in line for f in NO_CONFIG + TRANSIENT)] or lines
        return one_line(best[0], 300) if best else f"exit status {self.returncode}"

    @property
    def transient(self) -> bool:
        """True when stderr says the scheduler is busy or unreachable (retry later)."""
        return any(fragment in self.stderr for fragment in TRANSIENT)

    @property
    def no_config(self) -> bool:
        """True when the client found no cluster configuration (nothing was sent)."""
        return any(fragment in self.stderr for fragment in NO_CONFIG)

    @property
    def hint(self) -> Optional[str]:
        """What to check when stderr says the cluster could not be reached, else None."""
        if self.no_config:
            return config_hint()
        if any(fragment in self.stderr for fragment in NO_DATABASE):
            return database_hint()
        if any(fragment in self.stderr for fragment in UNREACHABLE):
            return controller_hint()
        return None


class CommandTimeout(SchedulerUncertain):
    """The command did not finish in time: its effect is unknown (it may have happened)."""


Runner = Callable[[Sequence[str], float], CommandResult]


def describe(argv: Sequence[str]) -> str:
    """``argv`` as one shell-quoted, redacted line."""
    return one_line(shlex.join(list(argv)), 300)


# Input variables that would override the script's ``#SBATCH --export`` allow-list
# (sbatch: command line > environment > script).
EXPORT_OVERRIDES = ("SBATCH_EXPORT",)


def client_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """The environment of a Slurm client command: ``environ`` with ``LC_ALL=C`` and
    without ``EXPORT_OVERRIDES``."""
    env = {k: v for k, v in environ.items() if k not in EXPORT_OVERRIDES}
    env["LC_ALL"] = "C"
    return env


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """Run ``argv`` with ``LC_ALL=C`` and no stdin; raise SchedulerUnavailable if it cannot.

    A Slurm client is not started when ``SLURM_CONF`` names a missing file (it would retry
    for 60 s and fail). A timeout raises CommandTimeout (the command may still have taken
    effect).
    """
    problem = config_problem() if os.path.basename(argv[0]) in SLURM_CLIENTS else None
    if problem:
        raise SchedulerUnavailable(f"{argv[0]}: {problem}", hint=config_hint())
    env = client_env(os.environ)
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
