"""Container-wrapped step argv: the one builder for every container runtime (pure).

A step is ``srun [flags] -- argv``. Pyxis is an srun plugin, so it contributes srun
flags; apptainer and charliecloud wrap the argv instead:

- pyxis:        ``--container-image=IMG --container-mounts=H:C[:ro],...
                  --no-container-mount-home --container-env=NAMES`` + argv
- apptainer:    ``apptainer exec [--nv] --cleanenv --no-home --bind H:C[:ro],... IMG`` + argv
- charliecloud: ``ch-run -b H:C ... IMG --`` + argv
- none:         argv unchanged

A ``task_prefix`` (the GPU binder, ``agent.pyz serve ... --``) is the first command of the
step's task: for pyxis the task already runs inside the image (:func:`task_in_image`), so
it goes in front of the argv there; apptainer and charliecloud are commands the task runs,
so it goes in front of the runtime's command, on the host.

Standard library only (runs inside the agent on Python 3.9).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

from agent_stdlib.contracts import ContainerSpec, MountSpec

# The container path synthbatch binds the run directory at; users may not mount under it.
RESERVED_MOUNT = "/synthbatch"
RUN_DIR_MOUNT = RESERVED_MOUNT + "/run"
RUNTIMES = ("none", "pyxis", "apptainer", "charliecloud")
DEFAULT_EXECUTABLE = {"apptainer": "apptainer", "charliecloud": "ch-run"}
# A runtime that passes on only variables with this prefix (apptainer --cleanenv).
ENV_PREFIX = {"apptainer": "APPTAINERENV_"}
IMAGE_PYTHON = "python3"  # the agent's interpreter inside an image (pyxis task prefix)


@dataclass(frozen=True)
class Wrapped:
    """A step's srun flags (before ``--``) and argv (after ``--``)."""

    srun_flags: Tuple[str, ...]
    argv: Tuple[str, ...]


def _bind(mount: MountSpec, read_only_suffix: str) -> str:
    return f"{mount.host}:{mount.container}" + (read_only_suffix if mount.read_only else "")


def task_in_image(container: Optional[ContainerSpec]) -> bool:
    """True when the step's task itself runs inside the image (pyxis, an srun plugin)."""
    return container is not None and container.runtime == "pyxis"


def env_prefix(container: Optional[ContainerSpec]) -> str:
    """The prefix that carries a variable into ``container`` ("" if it inherits them)."""
    return ENV_PREFIX.get(container.runtime, "") if container is not None else ""


def wrap(container: Optional[ContainerSpec], argv: Sequence[str],
         env_names: Sequence[str] = (), gpus: int = 0,
         task_prefix: Sequence[str] = ()) -> Wrapped:
    """Wrap ``argv`` for ``container`` (None: run on the host as it is).

    ``env_names`` are the variables the step sets itself; pyxis lets them override the
    image's own values. ``gpus`` > 0 asks apptainer for the NVIDIA libraries (``--nv``).
    ``task_prefix`` is the task's first command (see the module docstring).
    """
    prefix = list(task_prefix)
    if container is None or container.runtime == "none":
        return Wrapped((), tuple(prefix + list(argv)))
    mounts = container.mounts
    if container.runtime == "pyxis":
        flags = [f"--container-image={container.path}"]
        if mounts:
            flags.append("--container-mounts=" + ",".join(_bind(m, ":ro") for m in mounts))
        flags.append("--no-container-mount-home")
        if env_names:
            flags.append("--container-env=" + ",".join(sorted(set(env_names))))
        return Wrapped(tuple(flags), tuple(prefix + list(argv)))
    exe = container.executable or DEFAULT_EXECUTABLE.get(container.runtime, "")
    if container.runtime == "apptainer":
        cmd = prefix + [exe, "exec"] + (["--nv"] if gpus > 0 else [])
        cmd += ["--cleanenv", "--no-home"]
        if mounts:
            cmd += ["--bind", ",".join(_bind(m, ":ro") for m in mounts)]
        return Wrapped((), tuple(cmd + [container.path, *argv]))
    if container.runtime == "charliecloud":
        cmd = prefix + [exe]
        for mount in mounts:
            cmd += ["-b", _bind(mount, "")]
        return Wrapped((), tuple(cmd + [container.path, "--", *argv]))
    raise ValueError(f"unknown container runtime {container.runtime!r}")


def container_env(container: Optional[ContainerSpec], env: Mapping[str, str],
                  names: Sequence[str]) -> Dict[str, str]:
    """The step environment for ``container``: apptainer's ``--cleanenv`` only lets
    ``APPTAINERENV_<NAME>`` through, so ``names`` are copied under that prefix."""
    out = dict(env)
    prefix = env_prefix(container)
    if prefix:
        out.update({prefix + name: env[name] for name in names if name in env})
    return out


def translate(path: str, mounts: Sequence[MountSpec]) -> Optional[str]:
    """``path`` (absolute, on the host) as the container sees it; None if not mounted.

    The most specific mount (longest host path) wins, whatever the mount order.
    """
    path = posixpath.normpath(path)
    best: Optional[MountSpec] = None
    for mount in mounts:
        host = posixpath.normpath(mount.host)
        if path == host or path.startswith(host.rstrip("/") + "/"):
            if best is None or len(host) > len(posixpath.normpath(best.host)):
                best = mount
    if best is None:
        return None
    rest = posixpath.relpath(path, posixpath.normpath(best.host))
    return best.container if rest == "." else posixpath.join(best.container, rest)
