"""The batch script: thin bash rendered from validated values only (pure, no I/O).

The script checks the sha256 of the staged agent and the plan, picks node-local scratch
for the agent's extraction (``SHIV_ROOT``; steps in images get it mounted), sets ``USER``
when the job has none (Slurm does not set it; ``ch-run`` refuses to start without it),
and ``exec``s the agent so that Slurm's signals reach it.
``--export=`` is the job's environment allow-list (``Plan.job_env``): sbatch's default
exports the whole submitting shell, and slurmctld keeps what it exports in its state
directory. Directives beyond the base set (reservation, the profile's allow-listed
options, the multi-node shape) come from :func:`control.slurm.directives.apply_directives`. A
submission of one of several arrays (``plan.arrays``) passes ``--array-index K`` so the
agent maps its array task id to the shard ``arrays[K].first_shard + task``.

Every value is shell-quoted, and every string is checked first (:func:`check_values`):
quoting makes any text inert in bash, but an ``#SBATCH`` line ends at a newline, so a
value with a control character (or an option name that is not one) would start a line of
its own that bash runs. The config layer never lets such a value through; the renderer
refuses it by itself too (a plan read back from disk by ``retry`` is rendered again).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import JOB_ENV, MAX_REQUEUES_ENV, ResourceSpec
from synthbatch.control.config.rules import CONTROL
from synthbatch.control.errors import InvalidInput
from synthbatch.control.slurm.directives import apply_directives

PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class BatchScript:
    """Everything the batch script needs, already validated."""

    job_name: str
    run_dir: str
    agent_pyz: str  # file name inside run_dir
    agent_sha256: str
    plan_sha256: str
    submission: int
    python: str
    resources: ResourceSpec
    signal_lead_s: int
    slurm_bin: Optional[str] = None
    max_requeues: int = 1  # on SIGUSR1 the agent requeues the job while restarts are below
    array_index: Optional[int] = None  # ArraySpec.index of this submission's array, if any
    log_name: str = "slurm-%A_%a.out"  # the --output file in run_dir/logs
    export: Tuple[str, ...] = JOB_ENV  # RuntimeSpec.job_env(): what sbatch passes to the job


@dataclass(frozen=True)
class SharedMember:
    """One run's tasks ``[first_task, first_task + count)`` in an array shared by runs."""

    first_task: int
    count: int
    run_dir: str
    plan_sha256: str
    submission: int
    array_index: Optional[int]


OPTION = re.compile(r"[a-z][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _strings(spec: BatchScript) -> Iterator[Tuple[str, Optional[str]]]:
    for name in ("job_name", "run_dir", "agent_pyz", "agent_sha256", "plan_sha256", "python",
                 "slurm_bin", "log_name"):
        yield name, getattr(spec, name)
    res = spec.resources
    for name in ("partition", "account", "qos", "time_limit", "gpu_request", "reservation"):
        yield f"resources.{name}", getattr(res, name)
    for key, value in res.options.items():
        yield f"resources.options[{key!r}]", key + value


def check_values(spec: BatchScript) -> None:
    """InvalidInput naming the first value the script cannot hold: a control character
    anywhere, or an ``#SBATCH`` option name that is not lower-case letters, digits, ``-``."""
    for name, value in _strings(spec):
        if value is not None and CONTROL.search(value):
            raise InvalidInput(f"batch script: {name}: control characters are not allowed "
                               f"({value[:60]!r})")
    for name in spec.export:
        if not ENV_NAME.fullmatch(name):
            raise InvalidInput(f"batch script: export: {name[:60]!r} is not a variable name")
    for key in spec.resources.options:
        if not OPTION.fullmatch(key):
            raise InvalidInput(f"batch script: resources.options: {key[:60]!r} is not an "
                               "sbatch option name")


def sbatch_directives(spec: BatchScript) -> List[str]:
    """The ``#SBATCH`` lines, sorted by option name, values quoted."""
    check_values(spec)
    res = spec.resources
    options: Dict[str, Optional[str]] = {
        "job-name": spec.job_name,
        "output": f"{spec.run_dir}/logs/{spec.log_name}",
        "open-mode": "append",
        "time": res.time_limit,
        "nodes": str(res.nodes),
        "ntasks": "1",
        "cpus-per-task": str(res.cpus),
        "mem": f"{res.mem_mb}M",
        "requeue": None,
        "signal": f"B:USR1@{spec.signal_lead_s}",
        # an allow-list, never the whole submitting shell: what sbatch exports is what
        # slurmctld stores (StateSaveLocation/hash.N/job.ID/environment)
        "export": ",".join(spec.export),
    }
    for key, value in (("partition", res.partition), ("account", res.account),
                       ("qos", res.qos)):
        if value:
            options[key] = value
    if res.gpus:
        if res.gpu_request == "gpus":
            options["gpus"] = str(res.gpus)
        else:
            options["gres"] = f"gpu:{res.gpus}"
    options = apply_directives(options, res)
    lines = []
    for key in sorted(options):
        value = options[key]
        lines.append(f"#SBATCH --{key}" if value is None else
                     f"#SBATCH --{key}={shlex.quote(value)}")
    return lines


def render_batch_script(spec: BatchScript) -> str:
    """The whole batch script for one submission of a run."""
    q = shlex.quote
    index = "" if spec.array_index is None else f" \\\n  --array-index {int(spec.array_index)}"
    return _script(spec, [f"run_dir={q(spec.run_dir)}"], str(int(spec.submission)), index,
                   [f"plan_sha256={q(spec.plan_sha256)}"])


def render_shared_script(spec: BatchScript, members: Sequence[SharedMember]) -> str:
    """The batch script of an array whose task ranges belong to several runs.

    ``spec`` gives the directives (one shape: ``resources``), the job name, the agent and
    where Slurm's own output goes (``spec.run_dir/logs/spec.log_name``); the script picks
    the run of ``$SLURM_ARRAY_TASK_ID`` from ``members`` and appends the agent's output to
    that run's ``logs/slurm-<array job>_<task>.out``, where a run's own array logs too.
    """
    q = shlex.quote
    select = ["task=${SLURM_ARRAY_TASK_ID:?not an array task}"]
    for i, member in enumerate(members):
        check_values(replace(spec, run_dir=member.run_dir, plan_sha256=member.plan_sha256))
        first, end = int(member.first_task), int(member.first_task) + int(member.count)
        select += [
            f"{'if' if i == 0 else 'elif'} [ \"$task\" -ge {first} ] && [ \"$task\" -lt {end} ]; "
            "then",
            f"  run_dir={q(member.run_dir)}; plan_sha256={q(member.plan_sha256)}; "
            f"submission={int(member.submission)}; array_index="
            + ("" if member.array_index is None else str(int(member.array_index))),
        ]
    select += ["else",
               "  echo \"synthbatch: array task $task belongs to no run of this array\" >&2",
               "  exit 2",
               "fi",
               "exec >>\"$run_dir/logs/slurm-${SLURM_ARRAY_JOB_ID}_$task.out\" 2>&1"]
    index = " ${array_index:+--array-index \"$array_index\"}"
    return _script(spec, select, "\"$submission\"", index)


def _script(spec: BatchScript, select: List[str], submission: str, index: str,
            after: Sequence[str] = ()) -> str:
    """The script around ``select`` and ``after`` (lines setting ``run_dir`` and
    ``plan_sha256``, before and after the agent's path)."""
    path = ":".join(([spec.slurm_bin] if spec.slurm_bin else []) + list(PATH_DIRS))
    q = shlex.quote
    body = [
        "#!/bin/bash",
        *sbatch_directives(spec),
        "# generated by synthbatch; do not edit",
        "set -euo pipefail",
        f"export PATH={q(path)}",
        *select,
        f"agent=\"$run_dir\"/{q(spec.agent_pyz)}",
        *after,
        "verify() {",
        "  local got",
        "  got=$(sha256sum -- \"$1\" | cut -d' ' -f1)",
        "  if [ \"$got\" != \"$2\" ]; then",
        "    echo \"synthbatch: $1: sha256 $got does not match $2\" >&2",
        "    exit 2",
        "  fi",
        "}",
        f"verify \"$agent\" {q(spec.agent_sha256)}",
        "verify \"$run_dir/plan.json\" \"$plan_sha256\"",
        "export USER=\"${USER:-$(id -un)}\"  # Slurm does not set it; ch-run needs it",
        "scratch=${SLURM_TMPDIR:-${TMPDIR:-/tmp}}",
        "export SHIV_ROOT=\"$scratch/synthbatch-shiv-$(id -u)\"",
        "mkdir -p -m 700 \"$SHIV_ROOT\"",
        "unset SHIV_INTERPRETER SHIV_ENTRY_POINT SHIV_MODULE SHIV_PREPEND_PYTHONPATH "
        "SHIV_FORCE_EXTRACT",
        f"export {MAX_REQUEUES_ENV}={int(spec.max_requeues)}",
        f"exec {q(spec.python)} -I \"$agent\" allocation --run-dir \"$run_dir\" \\",
        f"  --plan-sha256 \"$plan_sha256\" --submission {submission} --agent-pyz \"$agent\""
        + index,
        "",
    ]
    return "\n".join(body)
