"""Step argv construction: how a server or client process is launched in an allocation.

The one place that knows ``srun`` flags. Every step is an argv list; nothing is a shell
string.
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Sequence

from agent_stdlib.contracts import ResourceSpec, RuntimeSpec

# Variables every step needs to find its tools; the rest only by allow-list.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "SHIV_ROOT", "TZ")


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
    if gpus > 0:
        cmd.append(f"--gpus={gpus}" if resources.gpu_request == "gpus" else f"--gres=gpu:{gpus}")
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
