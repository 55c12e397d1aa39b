"""Container-wrapped step argv: the one builder for every container runtime (pure).

A step is ``srun [flags] -- argv``. Pyxis is an srun plugin, so it contributes srun
flags; apptainer and charliecloud wrap the argv instead (``docs/containers.md`` says why
each flag is there):

- pyxis:        ``--container-image=IMG --container-mounts=H:C[:ro],...
                  --no-container-mount-home --container-env=NAMES`` + argv
- apptainer:    ``apptainer exec [--nv] --cleanenv --no-home --bind H:C[:ro],... IMG`` + argv
- charliecloud: ``ch-run --private-tmp --unset-env='!(NAMES)' [--set-env=PATH=...]
                  [--set-env=SHIV_ROOT=/synthbatch/scratch] -b H:C ... IMG --`` + argv
- none:         argv unchanged

The environment crosses by name only: no value is ever put into an argv except the fixed,
non-secret container paths and the image's default ``PATH``. Pyxis passes the step's
environment and lets ``--container-env`` names override the image's values; apptainer's
``--cleanenv`` passes only ``APPTAINERENV_<NAME>`` copies (:func:`container_env`);
charliecloud passes its whole environment, so ``--unset-env`` with an extended glob
removes every variable but the step's own names, the profile's allow-list and
:data:`TASK_VARS`.

The agent's node-local scratch (``SHIV_ROOT``, where shiv extracts ``agent.pyz``) is
mounted at :data:`SCRATCH_MOUNT` (:func:`with_scratch`) and ``SHIV_ROOT`` points there
inside the image, so nothing is ever extracted into a home directory.

A ``task_prefix`` (the GPU binder, ``agent.pyz serve ... --``) is the first command of the
step's task: for pyxis the task already runs inside the image (:func:`task_in_image`), so
it goes in front of the argv there; apptainer and charliecloud are commands the task runs,
so it goes in front of the runtime's command, on the host.

Standard library only (runs inside the agent on Python 3.9).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .contracts import ContainerSpec, MountSpec

# The container path synthbatch binds the run directory at; users may not mount under it.
RESERVED_MOUNT = "/synthbatch"
RUN_DIR_MOUNT = RESERVED_MOUNT + "/run"
# Where a step's node-local scratch (the host's SHIV_ROOT) is mounted in its image.
SCRATCH_MOUNT = RESERVED_MOUNT + "/scratch"
RUNTIMES = ("none", "pyxis", "apptainer", "charliecloud")
DEFAULT_EXECUTABLE = {"apptainer": "apptainer", "charliecloud": "ch-run"}
# A runtime that passes on only variables with this prefix (apptainer --cleanenv).
ENV_PREFIX = {"apptainer": "APPTAINERENV_"}
IMAGE_PYTHON = "python3"  # the agent's interpreter inside an image
# Device lists Slurm sets in a step with GPUs (CUDA, ROCm, OpenCL).
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
               "GPU_DEVICE_ORDINAL")
# What a charliecloud step keeps of its task's environment besides its own names and the
# allow-list: Slurm's variables (its device lists narrowed by the GPU binder) and locale.
TASK_VARS = ("SLURM_*", "SLURMD_NODENAME") + DEVICE_VARS + ("USER", "LOGNAME", "LANG",
                                                            "LC_ALL", "TZ")
# PATH inside a charliecloud image unless the step sets its own (the host's means nothing
# there): the FHS default, as Debian's and most images' login PATH.
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def with_scratch(container: Optional[ContainerSpec], scratch: str) -> Optional[ContainerSpec]:
    """``container`` with the node-local scratch directory ``scratch`` (a host path, the
    agent's ``SHIV_ROOT``) mounted at :data:`SCRATCH_MOUNT` (None and "none" unchanged)."""
    if container is None or container.runtime == "none" or not scratch:
        return container
    mounts = tuple(m for m in container.mounts if m.container != SCRATCH_MOUNT)
    return replace(container, mounts=mounts + (MountSpec(scratch, SCRATCH_MOUNT, False),))


def has_scratch(container: Optional[ContainerSpec]) -> bool:
    """True when ``container`` mounts the node-local scratch (:func:`with_scratch`)."""
    return container is not None and any(m.container == SCRATCH_MOUNT
                                         for m in container.mounts)


def kept_names(env_names: Sequence[str], inherit: Sequence[str] = ()) -> Tuple[str, ...]:
    """The variables a charliecloud step keeps (names or ``SLURM_*``-style globs)."""
    return tuple(sorted(set(env_names) | set(inherit) | set(TASK_VARS)))


def _charliecloud(container: ContainerSpec, env_names: Sequence[str],
                  inherit: Sequence[str]) -> List[str]:
    """ch-run's options before the image (see ``docs/containers.md``)."""
    names = kept_names(env_names, inherit)
    cmd = ["--private-tmp", "--unset-env=!(" + "|".join(names) + ")"]
    if "PATH" not in names:
        cmd.append(f"--set-env=PATH={IMAGE_PATH}")
    if has_scratch(container):
        cmd.append(f"--set-env=SHIV_ROOT={SCRATCH_MOUNT}")
    for mount in container.mounts:
        cmd += ["-b", _bind(mount, "")]
    return cmd


def wrap(container: Optional[ContainerSpec], argv: Sequence[str],
         env_names: Sequence[str] = (), gpus: int = 0,
         task_prefix: Sequence[str] = (), inherit: Sequence[str] = ()) -> Wrapped:
    """Wrap ``argv`` for ``container`` (None: run on the host as it is).

    ``env_names`` are the variables the step sets itself; pyxis lets them override the
    image's own values. ``inherit`` are the names (the profile's allow-list) a charliecloud
    step also keeps from its task's environment. ``gpus`` > 0 asks apptainer for the
    NVIDIA libraries (``--nv``). ``task_prefix`` is the task's first command (see the
    module docstring).
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
        names = set(env_names) | ({"SHIV_ROOT"} if has_scratch(container) else set())
        if names:
            flags.append("--container-env=" + ",".join(sorted(names)))
        return Wrapped(tuple(flags), tuple(prefix + list(argv)))
    exe = container.executable or DEFAULT_EXECUTABLE.get(container.runtime, "")
    if container.runtime == "apptainer":
        cmd = prefix + [exe, "exec"] + (["--nv"] if gpus > 0 else [])
        cmd += ["--cleanenv", "--no-home"]
        if mounts:
            cmd += ["--bind", ",".join(_bind(m, ":ro") for m in mounts)]
        return Wrapped((), tuple(cmd + [container.path, *argv]))
    if container.runtime == "charliecloud":
        cmd = prefix + [exe] + _charliecloud(container, env_names, inherit)
        return Wrapped((), tuple(cmd + [container.path, "--", *argv]))
    raise ValueError(f"unknown container runtime {container.runtime!r}")


def container_env(container: Optional[ContainerSpec], env: Mapping[str, str],
                  names: Sequence[str]) -> Dict[str, str]:
    """The step environment for ``container``.

    Apptainer's ``--cleanenv`` only lets ``APPTAINERENV_<NAME>`` through, so ``names`` are
    copied under that prefix. With a scratch mount, ``SHIV_ROOT`` inside the image is
    :data:`SCRATCH_MOUNT`: as the step's own value for pyxis (whose task starts inside the
    image), as ``APPTAINERENV_SHIV_ROOT`` for apptainer; the host value stays for a GPU
    binder that runs on the host first (charliecloud sets it with ``--set-env``).
    """
    out = dict(env)
    prefix = env_prefix(container)
    if prefix:
        out.update({prefix + name: env[name] for name in names if name in env})
    if has_scratch(container):
        if task_in_image(container):
            out["SHIV_ROOT"] = SCRATCH_MOUNT
        elif prefix:
            out[prefix + "SHIV_ROOT"] = SCRATCH_MOUNT
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
