"""Step argv construction and step signalling: the one place that knows ``srun`` flags.

Every step is an argv list; nothing is a shell string. Measured on Slurm 22.05:

* ``srun`` turns a SIGTERM into "forcing job termination" and SIGKILLs its step, so a
  graceful stop goes to the step's tasks instead: ``scancel --signal=TERM <job>.<step>``.
* SIGKILL to ``srun`` leaves the step (and its tasks) running until the job ends, so the
  hard stop is ``scancel --signal=KILL <job>.<step>`` as well.
* SIGUSR1 sent to ``srun`` is forwarded to the tasks unchanged.
* ``--overlap`` shares CPUs but not memory: each step asks for an explicit ``--mem``.
* ``sbatch --export=NAMES`` (the job's allow-list) sets ``SLURM_EXPORT_ENV=NAMES`` in the
  job, and an ``srun`` that inherits it passes only those names (and ``SLURM_*``) to its
  tasks; so every step says ``--export=ALL`` of the environment the agent gives srun
  (already the step's allow-listed one, :func:`step_env`).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from ..arrays import task_job_id
from ..containers import DEVICE_VARS
from ..contracts import (
    BASE_ENV,
    LOOPBACK_NO_PROXY,
    PROXY_VARS,
    ResourceSpec,
    RuntimeSpec,
)

COMMAND_TIMEOUT_S = 10.0


def gpu_flag(resources: ResourceSpec, gpus: int) -> str:
    """The explicit GPU request of one step (``0`` asks for none, never "all").

    In a multi-node ``--gpus-per-node`` job a step's ``--gpus=N`` is overridden by the
    inherited per-node count and ``--gres=none`` is refused (measured on 22.05), so such
    steps ask with ``--gpus-per-node=N``.
    """
    if resources.gpu_request == "gpus":
        if resources.nodes > 1:
            return f"--gpus-per-node={gpus}"
        return f"--gpus={gpus}"
    return f"--gres=gpu:{gpus}" if gpus else "--gres=none"


def step_argv(runtime: RuntimeSpec, resources: ResourceSpec, name: str,
              argv: Sequence[str], gpus: int, relative: Optional[int] = None,
              flags: Sequence[str] = (), nodes: int = 1) -> List[str]:
    """Wrap ``argv`` so it runs as one single-task step of the current allocation.

    ``relative`` pins the step to that node of the allocation (``srun --relative``, node 0
    is the batch node); ``flags`` are extra srun flags (a container plugin's), placed
    before ``--``. ``nodes`` > 1 makes it one task on each of that many consecutive nodes
    from ``relative`` on, each line of its output labelled with the task (the rank), and
    the whole step ended when any task exits non-zero (measured on 22.05: a task exiting 0
    leaves the others running, one exiting 3 or killed ends them, srun exits 143). The
    local launcher runs ``argv`` as it is.
    """
    if runtime.launcher == "local":
        return list(argv)
    cmd = [
        "srun",
        "--overlap",
        "--exact",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        f"--mem={runtime.step_mem_mb}",
        f"--job-name={name}",
        "--kill-on-bad-exit=1",
        "--export=ALL",
    ]
    if nodes > 1:
        cmd[5:5] = ["--ntasks-per-node=1"]
        cmd.append("--label")
    if relative is not None:
        cmd.append(f"--relative={relative}")
    if gpus > 0 or resources.gpus > 0:
        cmd.append(gpu_flag(resources, gpus))
    return cmd + list(flags) + ["--", *argv]


def step_env(runtime: RuntimeSpec, ambient: Mapping[str, str],
             extra: Mapping[str, str]) -> Dict[str, str]:
    """The environment of a step: Slurm's own variables, the allow-list
    (``contracts.BASE_ENV`` and ``env_allow``), then ``extra``.

    When a proxy variable (``contracts.PROXY_VARS``) is allowed through, ``NO_PROXY`` and
    ``no_proxy`` get the loopback names, so the step's loopback requests (to the run's
    proxy and servers) never go to that proxy.
    """
    allowed = set(BASE_ENV) | set(runtime.env_allow)
    env = {k: v for k, v in ambient.items() if k in allowed or k.startswith("SLURM_")}
    env.update(extra)
    if any(env.get(name) for name in PROXY_VARS):
        for name in ("NO_PROXY", "no_proxy"):
            given = [p for p in env.get(name, "").split(",") if p.strip()]
            env[name] = ",".join(given + [h for h in LOOPBACK_NO_PROXY if h not in given])
    return env


def local_devices(runtime: RuntimeSpec, ambient: Mapping[str, str], gpus: int) -> Dict[str, str]:
    """The device lists of a step of the ``local`` launcher ({} for ``srun``).

    Without Slurm nobody sets a step's GPUs: a step with GPUs gets the allocation's own
    lists (the local backend set ``CUDA_VISIBLE_DEVICES`` for the allocation; the ``serve``
    binder narrows them to the replica's plan GPUs), a step without gets them empty, so it
    sees none rather than all (as ``gpu_flag`` asks Slurm for ``0``, never "all").
    """
    if runtime.launcher != "local":
        return {}
    present = {name: ambient[name] for name in DEVICE_VARS if name in ambient}
    if gpus > 0:
        return present
    return {name: "" for name in {**present, "CUDA_VISIBLE_DEVICES": ""}}


def current_env() -> Dict[str, str]:
    """A copy of this process's environment (the one input of ``step_env``)."""
    return dict(os.environ)


def run_process(argv: Sequence[str],
                timeout_s: float = COMMAND_TIMEOUT_S) -> Optional[subprocess.CompletedProcess]:
    """Run a Slurm client command (argv, ``LC_ALL=C``, output captured); None if it could
    not run or timed out."""
    env = dict(os.environ, LC_ALL="C")
    try:
        return subprocess.run(list(argv), env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> Optional[str]:
    """Run a Slurm client command (argv, ``LC_ALL=C``); its stdout, or None on any failure."""
    done = run_process(argv, timeout_s)
    return done.stdout if done is not None and done.returncode == 0 else None


def signalled(step_ids: Mapping[str, str], done: subprocess.CompletedProcess) -> List[str]:
    """The names whose step ``scancel --signal`` reached (pure).

    Measured on 22.05: in an allocation of several nodes, ``scancel --signal=SIG
    <job>.<step>`` signals every task of the step but exits 225 with ``Kill job error on
    job step id <job>: Invalid job id specified`` (the job, no step); the same on one node
    exits 0. So a step counts as signalled unless an error line names it.
    """
    if done.returncode == 0:
        return list(step_ids)
    return [name for name, step in step_ids.items() if f" {step}:" not in done.stderr]


def parse_steps(text: str, job_id: str = "") -> Dict[str, str]:
    """``squeue -h -s -o %i|%j`` output -> step name -> step id (``12.3``, ``12_4.0``).

    Only steps of ``job_id`` count: for the last task of an array, whose raw id equals the
    array's id, squeue also lists the steps of every sibling task.
    """
    found: Dict[str, str] = {}
    for line in text.splitlines():
        step, _, name = line.strip().partition("|")
        if step and name and "." in step and (not job_id or step.startswith(f"{job_id}.")):
            found.setdefault(name, step)
    return found


@dataclass(frozen=True)
class StepControl:
    """Signals the tasks of this job's named steps through slurmctld."""

    job_id: str  # "12" or, for an array task, "12_4" (never the raw id of a task)

    def steps(self) -> Optional[Dict[str, str]]:
        """Live steps of this job (or array task) by name; None if squeue failed."""
        out = run_command(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i|%j"])
        return None if out is None else parse_steps(out, self.job_id)

    def signal(self, names: Sequence[str], signame: str) -> List[str]:
        """Send ``signame`` to the tasks of the live steps called ``names``.

        Returns the names whose step was signalled (empty when squeue or scancel failed).
        """
        return self.try_signal(names, signame) or []

    def try_signal(self, names: Sequence[str], signame: str) -> Optional[List[str]]:
        """``signal``, but None when squeue did not answer (slurmctld down)."""
        live = self.steps()
        if live is None:
            return None
        found = {n: live[n] for n in names if n in live}
        if not found:
            return []
        done = run_process(["scancel", f"--signal={signame}", *found.values()])
        return signalled(found, done) if done is not None else []

    def alive(self, names: Sequence[str]) -> Optional[List[str]]:
        """Which of ``names`` still exist as steps; None if squeue could not be asked."""
        live = self.steps()
        return None if live is None else [n for n in names if n in live]


def step_control(runtime: RuntimeSpec) -> Optional[StepControl]:
    """The step controller of this allocation, or None for local launches."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = task_job_id(array, int(task)) if array and task and task.isdigit() else \
        os.environ.get("SLURM_JOB_ID")
    return StepControl(job) if runtime.launcher == "srun" and job else None
