"""Resolving images and mounts for the plan: registry entries, host -> container paths."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Mapping, Optional, Tuple

from synthbatch.agent_stdlib.containers import RUN_DIR_MOUNT, translate
from synthbatch.agent_stdlib.contracts import ContainerSpec, MountSpec
from synthbatch.control.config.profile import Profile
from synthbatch.control.images.registry import (
    DIRECTORY,
    DIRECTORY_RUNTIMES,
    RUNTIME_SUFFIXES,
    ImageEntry,
    image_format,
)


class PlanError(ValueError):
    """A run that cannot be planned; ``where`` is the field path, ``source`` the file."""

    def __init__(self, where: str, message: str, source: str = "run") -> None:
        super().__init__(message)
        self.where = where
        self.message = message
        self.source = source  # "run" | "profile"


def mounts_for(profile: Profile, run_dir: str) -> Tuple[MountSpec, ...]:
    """The profile's mounts plus the run directory, in mount order (parents first)."""
    mounts = [MountSpec(host=m.host, container=m.container, read_only=m.read_only)
              for m in profile.container.mounts]
    mounts.append(MountSpec(host=run_dir, container=RUN_DIR_MOUNT, read_only=False))
    return tuple(sorted(mounts, key=lambda m: (len(PurePosixPath(m.container).parts),
                                               m.container)))


def container_for(profile: Profile, alias: Optional[str], where: str,
                  images: Mapping[str, ImageEntry],
                  mounts: Tuple[MountSpec, ...]) -> Optional[ContainerSpec]:
    """The container of a step using image ``alias`` (None: runs on the host)."""
    runtime = profile.container.runtime
    if alias is None:
        return None
    if runtime == "none":
        raise PlanError(where, f"image {alias!r} given but the profile's container runtime "
                               f"is 'none'")
    entry = images.get(alias)
    if entry is None:
        raise PlanError(where, f"no image {alias!r} is registered (see 'synthbatch image ls')")
    suffix = PurePosixPath(entry.path).suffix
    runs = ", ".join(RUNTIME_SUFFIXES[runtime]) + \
        (" or an image directory" if runtime in DIRECTORY_RUNTIMES else "")
    if image_format(entry) == DIRECTORY:
        if runtime not in DIRECTORY_RUNTIMES:
            raise PlanError(where, f"image {alias!r} is a directory, which {runtime} cannot "
                                   f"run (needs {runs})")
    elif suffix not in RUNTIME_SUFFIXES[runtime]:
        raise PlanError(where, f"image {alias!r} is a {suffix} file, which {runtime} cannot "
                               f"run (needs {runs})")
    return ContainerSpec(runtime=runtime, image=alias, path=entry.path, sha256=entry.sha256,
                         mounts=mounts, executable=profile.container.executable or "")


def inside(value: str, container: Optional[ContainerSpec]) -> str:
    """An argument as the container sees it: absolute host paths under a mount translated.

    ``--flag=/path`` is translated too; anything else is returned unchanged.
    """
    if container is None:
        return value
    prefix, path = "", value
    if value.startswith("-") and "=" in value:
        prefix, path = value.split("=", 1)
        prefix += "="
    if not path.startswith("/"):
        return value
    moved = translate(path, container.mounts)
    return value if moved is None else prefix + moved


def model_inside(model: str, container: Optional[ContainerSpec], where: str) -> str:
    """A deployment's model path inside its container; it must be under a mount."""
    if container is None or not model.startswith("/"):
        return model
    moved = translate(model, container.mounts)
    if moved is None:
        raise PlanError(where, f"{model} is not under any of the profile's container mounts "
                               f"(container.mounts)")
    return moved
