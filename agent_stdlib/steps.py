"""Step argv construction and step signalling: the one place that knows ``srun`` flags.

Every step is an argv list; nothing is a shell string. Measured on Slurm 22.05:

* ``srun`` turns a SIGTERM into "forcing job termination" and SIGKILLs its step, so a
  graceful stop goes to the step's tasks instead: ``scancel --signal=TERM <job>.<step>``.
* SIGKILL to ``srun`` leaves the step (and its tasks) running until the job ends, so the
  hard stop is ``scancel --signal=KILL <job>.<step>`` as well.
* SIGUSR1 sent to ``srun`` is forwarded to the tasks unchanged.
* ``--overlap`` shares CPUs but not memory: each step asks for an explicit ``--mem``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from agent_stdlib.contracts import ResourceSpec, RuntimeSpec

# Variables every step needs to find its tools; the rest only by allow-list.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "SHIV_ROOT", "TZ")
COMMAND_TIMEOUT_S = 10.0


def gpu_flag(resources: ResourceSpec, gpus: int) -> str:
    """The explicit GPU request of one step (``0`` asks for none, never "all")."""
    if resources.gpu_request == "gpus":
        return f"--gpus={gpus}"
    return f"--gres=gpu:{gpus}" if gpus else "--gres=none"


def step_argv(runtime: RuntimeSpec, resources: ResourceSpec, name: str,
              argv: Sequence[str], gpus: int) -> List[str]:
    """Wrap ``argv`` so it runs as one step of the current allocation."""
    if runtime.launcher == "local":
        return list(argv)
    cmd = [
        "srun",
        "--overlap",
        "--exact",
        "--nodes=1",
        "--ntasks=1",
        f"--mem={runtime.step_mem_mb}",
        f"--job-name={name}",
        "--kill-on-bad-exit=1",
    ]
    if gpus > 0 or resources.gpus > 0:
        cmd.append(gpu_flag(resources, gpus))
    return cmd + ["--", *argv]


def step_env(runtime: RuntimeSpec, ambient: Mapping[str, str],
             extra: Mapping[str, str]) -> Dict[str, str]:
    """The environment of a step: Slurm's own variables, the allow-list, then ``extra``."""
    allowed = set(BASE_ENV) | set(runtime.env_allow)
    env = {k: v for k, v in ambient.items() if k in allowed or k.startswith("SLURM_")}
    env.update(extra)
    return env


def current_env() -> Dict[str, str]:
    """A copy of this process's environment (the one input of ``step_env``)."""
    return dict(os.environ)


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> Optional[str]:
    """Run a Slurm client command (argv, ``LC_ALL=C``); its stdout, or None on any failure."""
    env = dict(os.environ, LC_ALL="C")
    try:
        done = subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_steps(text: str) -> Dict[str, str]:
    """``squeue -h -s -o %i|%j`` output -> step name -> step id (``12.3``)."""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        step, _, name = line.strip().partition("|")
        if step and name and "." in step:
            found.setdefault(name, step)
    return found


@dataclass(frozen=True)
class StepControl:
    """Signals the tasks of this job's named steps through slurmctld."""

    job_id: str  # the raw SLURM_JOB_ID (array tasks have their own)

    def steps(self) -> Optional[Dict[str, str]]:
        """Live steps of the job by name; None if squeue could not be asked."""
        out = run_command(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i|%j"])
        return None if out is None else parse_steps(out)

    def signal(self, names: Sequence[str], signame: str) -> List[str]:
        """Send ``signame`` to the tasks of the live steps called ``names``.

        Returns the names whose step was signalled (empty when squeue or scancel failed).
        """
        live = self.steps() or {}
        found = [n for n in names if n in live]
        if not found:
            return []
        done = run_command(["scancel", f"--signal={signame}", *(live[n] for n in found)])
        return found if done is not None else []

    def alive(self, names: Sequence[str]) -> Optional[List[str]]:
        """Which of ``names`` still exist as steps; None if squeue could not be asked."""
        live = self.steps()
        return None if live is None else [n for n in names if n in live]


def step_control(runtime: RuntimeSpec) -> Optional[StepControl]:
    """The step controller of this allocation, or None for local launches."""
    job = os.environ.get("SLURM_JOB_ID")
    return StepControl(job) if runtime.launcher == "srun" and job else None
