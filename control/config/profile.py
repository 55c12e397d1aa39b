"""The cluster profile: where runs live and how this cluster is asked for resources."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Dict, List, Literal, Optional, Tuple, Union

from pydantic import AfterValidator, Field, ValidationError, model_validator

from synthbatch.agent_stdlib.containers import RESERVED_MOUNT
from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.document import read_document
from synthbatch.control.config.fields import (
    EnvName,
    Name,
    SafePath,
    SchemaVersion,
    Strict,
    TimeLimit,
    _text,
    under,
)
from synthbatch.control.config.loader import first_error, load_model
from synthbatch.control.config.workspace import (
    BACKENDS,
    MAX_SCHEDULER_TIMEOUT_S,
    SCHEDULER_TIMEOUT_S,
    check_workspace_root,
    resolve_profile_path,
)
from synthbatch.control.config.workspace import (
    default_profile_path as default_profile_path,  # re-exported
)
from synthbatch.control.errors import InvalidInput

# Extra #SBATCH options a profile may set; everything else is synthbatch's to decide.
SBATCH_ALLOWED = ("comment", "constraint", "exclude", "exclusive", "gres-flags", "hint",
                  "licenses", "mail-type", "mail-user", "nodelist")
SBATCH_VALUE = re.compile(r"^[A-Za-z0-9._,:=@+/&|\[\]*-]{0,200}$")
FLAG_OPTIONS = ("exclusive",)  # may be given as "" (a bare flag)


def _sbatch_key(value: str) -> str:
    _text(value)
    if value not in SBATCH_ALLOWED:
        raise ValueError(f"{quoted(value)} is not an allowed #SBATCH option (allowed: "
                         + ", ".join(SBATCH_ALLOWED) + ")")
    return value


def _sbatch_value(value: str) -> str:
    _text(value)
    if not SBATCH_VALUE.fullmatch(value):
        raise ValueError("may only contain letters, digits and ._,:=@+/&|[]*- (max 200)")
    return value


SbatchKey = Annotated[str, AfterValidator(_sbatch_key)]
SbatchValue = Annotated[str, AfterValidator(_sbatch_value)]


class Mount(Strict):
    """A host directory made visible inside containers."""

    host: SafePath
    container: SafePath
    read_only: bool = False

    @model_validator(mode="after")
    def _no_commas(self) -> Mount:
        for field in ("host", "container"):
            if "," in getattr(self, field):
                raise ValueError(f"{field}: ',' separates mounts; it cannot be in a path")
        return self


class Container(Strict):
    """The container runtime of the cluster and the mounts every container gets."""

    runtime: Literal["none", "pyxis", "apptainer", "charliecloud"] = "none"
    mounts: List[Mount] = []
    executable: Optional[SafePath] = None  # apptainer / ch-run binary (default: on PATH)

    @model_validator(mode="after")
    def _mounts(self) -> Container:
        if self.runtime == "none" and (self.mounts or self.executable):
            raise ValueError("mounts and executable need a container runtime (runtime is "
                             "'none')")
        seen: Dict[str, int] = {}
        for index, mount in enumerate(self.mounts):
            if under(mount.container, RESERVED_MOUNT):
                raise ValueError(f"mounts[{index}].container: {mount.container} is under "
                                 f"{RESERVED_MOUNT}, which synthbatch reserves for the run "
                                 f"directory")
            if mount.container in seen:
                raise ValueError(f"mounts[{index}].container: {mount.container} is already "
                                 f"mounted by mounts[{seen[mount.container]}]")
            seen[mount.container] = index
            if self.runtime == "charliecloud" and mount.read_only:
                raise ValueError(f"mounts[{index}].read_only: charliecloud (ch-run -b) "
                                 f"cannot bind read-only")
        return self


class Local(Strict):
    """The local backend (``backend = "local"``): runs without Slurm, on this machine."""

    max_concurrent: int = Field(default=0, ge=0, le=1024)  # 0: as many as the GPUs allow
    gpus: Optional[List[Annotated[int, Field(ge=0, le=1023)]]] = None  # default: detected
    kill_wait_s: float = Field(default=30.0, gt=0, le=600)  # TERM -> KILL, as KillWait

    @model_validator(mode="after")
    def _distinct(self) -> Local:
        if self.gpus is not None and len(set(self.gpus)) != len(self.gpus):
            raise ValueError("gpus: a GPU index is listed twice")
        return self


Price = Annotated[float, Field(gt=0, le=100000, allow_inf_nan=False)]


class PartitionPrice(Strict):
    """What one GPU-hour of one partition costs (``gpu_types``: by the GPU's type)."""

    per_gpu_hour: Optional[Price] = None
    gpu_types: Dict[Name, Price] = {}


class Pricing(Strict):
    """``[pricing]``: what a GPU-hour costs, for ``status``'s cost figures (issue 32).

    The price of a run: its partition's ``gpu_types[gpu_type]``, else its partition's
    ``per_gpu_hour``, else ``per_gpu_hour``; none of them: GPU-hours only, cost unknown.
    """

    currency: Annotated[str, Field(min_length=1, max_length=8, pattern=r"^[A-Za-z$€£¥]+$")] = "$"
    per_gpu_hour: Optional[Price] = None  # any partition not listed under partitions
    gpu_type: Optional[Name] = None  # this cluster's GPUs, a key of a partition's gpu_types
    partitions: Dict[Name, PartitionPrice] = {}

    @model_validator(mode="after")
    def _typed(self) -> Pricing:
        for name, part in sorted(self.partitions.items()):
            if part.gpu_types and self.gpu_type is None and part.per_gpu_hour is None:
                raise ValueError(f"partitions.{name}.gpu_types: set pricing.gpu_type (which "
                                 f"of them this cluster's GPUs are) or "
                                 f"partitions.{name}.per_gpu_hour")
            if self.gpu_type is not None and part.gpu_types and \
                    self.gpu_type not in part.gpu_types and part.per_gpu_hour is None:
                raise ValueError(f"gpu_type: {quoted(self.gpu_type)} has no price in "
                                 f"partitions.{name}.gpu_types (priced: "
                                 + ", ".join(sorted(part.gpu_types)) + ")")
        return self

    def price(self, partition: Optional[str]) -> Optional[float]:
        """The price of one GPU-hour on ``partition`` (None: not priced)."""
        part = self.partitions.get(partition or "")
        if part is not None:
            if self.gpu_type is not None and self.gpu_type in part.gpu_types:
                return part.gpu_types[self.gpu_type]
            if part.per_gpu_hour is not None:
                return part.per_gpu_hour
        return self.per_gpu_hour


class Profile(Strict):
    """One cluster: backend, workspace, scheduler defaults and runtime settings.

    The one definition of the profile. The read-only commands read four of its fields
    with ``control.config.workspace.WorkspaceProfile`` instead (no pydantic: ~250 ms less
    start-up); its names, shared defaults, bounds and backends are the constants used
    here, and tests/unit/control/config/test_workspace.py fails when the two disagree.
    """

    schema_version: SchemaVersion
    backend: Literal[BACKENDS] = BACKENDS[0]  # type: ignore[valid-type]
    workspace: SafePath
    partition: Optional[Name] = None
    account: Optional[Name] = None
    qos: Optional[Name] = None
    reservation: Optional[Name] = None
    default_time_limit: TimeLimit = "01:00:00"
    gpus_per_node: int = Field(default=0, ge=0, le=64)
    # memory of one GPU of the partition, in GB as the vendor states it (80, 141): what
    # the automatic layout fits models into (docs/configuration.md "Automatic layout")
    gpu_memory_gb: Optional[float] = Field(default=None, gt=0, le=4096)
    gpu_request: Literal["gres", "gpus"] = "gres"
    cpus_per_task: int = Field(default=4, ge=1, le=1024)
    mem_mb: int = Field(default=4096, ge=64)
    cpus_per_gpu: Optional[int] = Field(default=None, ge=1, le=256)
    mem_per_gpu_mb: Optional[int] = Field(default=None, ge=64)
    container: Container = Container()
    python: SafePath = "/usr/bin/python3"
    slurm_bin: Optional[SafePath] = None
    env_allow: List[EnvName] = []
    secrets: List[EnvName] = []
    port_base: int = Field(default=20000, ge=1024, le=65000)
    array_throttle: int = Field(default=0, ge=0)
    signal_lead_s: int = Field(default=120, ge=0, le=3600)
    grace_s: float = Field(default=10.0, gt=0, le=600)
    scheduler_timeout_s: float = Field(default=SCHEDULER_TIMEOUT_S, gt=0,
                                       le=MAX_SCHEDULER_TIMEOUT_S)
    sbatch_options: Dict[SbatchKey, SbatchValue] = {}
    local: Local = Local()
    pricing: Pricing = Pricing()

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.backend == "local" and self.container.runtime == "pyxis":
            raise ValueError("container.runtime: pyxis starts containers through srun; the "
                             "local backend runs none, apptainer or charliecloud")
        gpus = self.local.gpus
        if self.backend == "local" and gpus is not None and self.gpus_per_node > len(gpus):
            raise ValueError(f"gpus_per_node: {self.gpus_per_node} is more than the "
                             f"{len(gpus)} GPU(s) in local.gpus")
        for key, value in self.sbatch_options.items():
            if value == "" and key not in FLAG_OPTIONS:
                raise ValueError(f"sbatch_options.{key}: needs a value")
        dupes = sorted(set(self.secrets) & set(self.env_allow))
        if dupes:
            raise ValueError(f"secrets: {dupes[0]} is also in env_allow; list it once, "
                             f"under secrets")
        return self


def load_pricing(path: Union[str, Path]) -> Pricing:
    """The ``[pricing]`` table of the profile at ``path``, validated (the run-reading
    commands read the rest with the standard library: ``WorkspaceProfile``)."""
    path = Path(path)
    table = read_document(path).get("pricing", {})
    if not isinstance(table, dict):
        raise InvalidInput(f"{path}: pricing: expected a table ([pricing])")
    try:
        return Pricing.model_validate(table)
    except ValidationError as err:
        raise InvalidInput(f"{path}: pricing.{first_error(err, Pricing)}") from err


def load_profile(name_or_path: Optional[str]) -> Tuple[Profile, Path]:
    """Find and validate the profile; return it with its path."""
    path = resolve_profile_path(name_or_path)
    profile = load_model(path, Profile)
    check_workspace_root(profile.workspace, path)
    return profile, path
