"""The cluster profile: where runs live and how this cluster is asked for resources."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Literal, Optional, Tuple

from pydantic import Field

from control.config.fields import EnvName, Name, SafePath, Strict, TimeLimit
from control.config.loader import load_model
from control.errors import NotFound


class Profile(Strict):
    """One cluster: backend, workspace, scheduler defaults and runtime settings."""

    schema_version: Literal[1]
    backend: Literal["slurm"] = "slurm"
    workspace: SafePath
    partition: Optional[Name] = None
    account: Optional[Name] = None
    qos: Optional[Name] = None
    default_time_limit: TimeLimit = "01:00:00"
    gpus_per_node: int = Field(default=0, ge=0, le=64)
    gpu_request: Literal["gres", "gpus"] = "gres"
    cpus_per_task: int = Field(default=4, ge=1, le=1024)
    mem_mb: int = Field(default=4096, ge=64)
    python: SafePath = "/usr/bin/python3"
    slurm_bin: Optional[SafePath] = None
    env_allow: List[EnvName] = []
    port_base: int = Field(default=20000, ge=1024, le=65000)
    array_throttle: int = Field(default=0, ge=0)
    signal_lead_s: int = Field(default=120, ge=0, le=3600)
    grace_s: float = Field(default=10.0, gt=0, le=600)
    scheduler_timeout_s: float = Field(default=30.0, gt=0, le=600)


PROFILE_DIR = Path("~/.config/synthbatch/profiles")


def resolve_profile_path(name_or_path: Optional[str]) -> Path:
    """``--profile`` (name or path) -> ``SYNTHBATCH_PROFILE`` -> ``default.toml``."""
    choice = name_or_path or os.environ.get("SYNTHBATCH_PROFILE") or "default"
    if "/" in choice or choice.endswith((".toml", ".json")):
        path = Path(choice).expanduser()
    else:
        path = PROFILE_DIR.expanduser() / f"{choice}.toml"
    if not path.is_file():
        raise NotFound(f"profile {path}: no such file",
                       hint="pass --profile PATH or set SYNTHBATCH_PROFILE")
    return path


def load_profile(name_or_path: Optional[str]) -> Tuple[Profile, Path]:
    """Find and validate the profile; return it with its path."""
    path = resolve_profile_path(name_or_path)
    return load_model(path, Profile), path
