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
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from agent_stdlib.contracts import JOB_ENV, ResourceSpec
from control.config.rules import CONTROL
from control.errors import InvalidInput
from control.slurm.directives import apply_directives

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
    export: Tuple[str, ...] = JOB_ENV  # RuntimeSpec.job_env(): what sbatch passes to the job


OPTION = re.compile(r"[a-z][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _strings(spec: BatchScript) -> Iterator[Tuple[str, Optional[str]]]:
    for name in ("job_name", "run_dir", "agent_pyz", "agent_sha256", "plan_sha256", "python",
                 "slurm_bin"):
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
        "output": f"{spec.run_dir}/logs/slurm-%A_%a.out",
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
    path = ":".join(([spec.slurm_bin] if spec.slurm_bin else []) + list(PATH_DIRS))
    q = shlex.quote
    body = [
        "#!/bin/bash",
        *sbatch_directives(spec),
        "# generated by synthbatch; do not edit",
        "set -euo pipefail",
        f"export PATH={q(path)}",
        f"run_dir={q(spec.run_dir)}",
        f"agent=\"$run_dir\"/{q(spec.agent_pyz)}",
        f"plan_sha256={q(spec.plan_sha256)}",
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
        f"export SYNTHBATCH_MAX_REQUEUES={int(spec.max_requeues)}",
        f"exec {q(spec.python)} -I \"$agent\" allocation --run-dir \"$run_dir\" \\",
        f"  --plan-sha256 \"$plan_sha256\" --submission {spec.submission} --agent-pyz \"$agent\""
        + ("" if spec.array_index is None else f" \\\n  --array-index {int(spec.array_index)}"),
        "",
    ]
    return "\n".join(body)
