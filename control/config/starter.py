"""``synthbatch profile init``: a commented starter profile, written 0600, never over a file
(a Slurm cluster's, or with ``--local`` the local backend's)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from pydantic import ValidationError

from synthbatch.agent_stdlib.statefile import ensure_dir
from synthbatch.control.config.loader import first_error, tomllib
from synthbatch.control.config.profile import Profile
from synthbatch.control.errors import Conflict, InvalidInput

TEMPLATE = """\
# synthbatch profile: one cluster. Every commented line shows the default.
# Reference: docs/configuration.md. Check it with: synthbatch profile validate
schema_version = 1
backend = "slurm"

# Shared filesystem root for runs (visible from login and compute nodes).
workspace = {workspace}

# Scheduler defaults.
{account}
{partition}
{qos}
# reservation = "my-reservation"
# default_time_limit = "01:00:00"

# GPUs: how many each node has, and how to ask for them ("gres" -> --gres=gpu:N,
# "gpus" -> --gpus / --gpus-per-node).
gpus_per_node = {gpus_per_node}
gpu_request = {gpu_request}
# cpus_per_task = 4
# mem_mb = 4096
# cpus_per_gpu = 8          # if set: cpus = cpus_per_gpu x GPUs per node
# mem_per_gpu_mb = 65536    # if set: memory = mem_per_gpu_mb x GPUs per node

# The Python that runs the agent on compute nodes (3.9 or newer).
python = {python}
{slurm_bin}

# Environment variables passed to servers and clients (names only).
# env_allow = ["HF_HOME"]
# Secrets: names of environment variables that hold credentials; runs refer to them with
# env = {{ HF_TOKEN = {{ secret = "HF_TOKEN" }} }}. Values are never written anywhere.
# secrets = ["HF_TOKEN"]

# port_base = 20000         # servers listen on port_base, port_base + 1, ...
# array_throttle = 0        # at most this many shards at once (0: no limit)
# signal_lead_s = 120       # SIGUSR1 this long before the time limit
# grace_s = 10.0
# scheduler_timeout_s = 30.0

# Extra #SBATCH options (allowed: comment, constraint, exclude, exclusive, gres-flags,
# hint, licenses, mail-type, mail-user, nodelist).
# [sbatch_options]
# constraint = "a100"

[container]
runtime = {runtime}   # none | pyxis | apptainer | charliecloud
# executable = "/usr/bin/apptainer"
# [[container.mounts]]
# host = "/shared/models"
# container = "/models"
# read_only = true
"""


LOCAL_TEMPLATE = """\
# synthbatch profile: the local backend. No Slurm: every shard runs as a process tree on
# this machine (docs/local-backend.md). Every commented line shows the default.
# Check it with: synthbatch profile validate
schema_version = 1
backend = "local"

# Where runs live (any local directory).
workspace = {workspace}

# GPUs a shard may use: this machine's ({found}).
gpus_per_node = {gpus_per_node}
# default_time_limit = "01:00:00"

# The Python that runs the agent (3.9 or newer).
python = {python}

# Environment variables passed to servers and clients (names only).
# env_allow = ["HF_HOME"]
# secrets = ["HF_TOKEN"]

# port_base = 20000         # servers listen on port_base, port_base + 1, ...
# signal_lead_s = 120       # SIGUSR1 this long before the time limit
# grace_s = 10.0

[local]
# max_concurrent = 0        # shards at once (0: as many as the GPUs allow, 1 without GPUs)
# gpus = [0, 1]             # the GPU indices to use (default: all that nvidia-smi -L lists)
# kill_wait_s = 30.0        # SIGTERM -> SIGKILL at a time limit or cancel

[container]
runtime = {runtime}   # none | apptainer | charliecloud
"""


def _string(value: str) -> str:
    return json.dumps(value)  # a valid TOML basic string


def _optional(key: str, value: Optional[str], example: str) -> str:
    return f"{key} = {_string(value)}" if value else f"# {key} = {_string(example)}"


def starter_toml(workspace: str, account: Optional[str] = None,
                 partition: Optional[str] = None, qos: Optional[str] = None,
                 gpus_per_node: int = 0, gpu_request: str = "gres",
                 runtime: str = "none", python: str = "/usr/bin/python3",
                 slurm_bin: Optional[str] = None) -> str:
    """The starter profile text; InvalidInput naming the option if a value is invalid."""
    text = TEMPLATE.format(
        workspace=_string(workspace), account=_optional("account", account, "my-account"),
        partition=_optional("partition", partition, "gpu"),
        qos=_optional("qos", qos, "normal"), gpus_per_node=int(gpus_per_node),
        gpu_request=_string(gpu_request), python=_string(python),
        slurm_bin=_optional("slurm_bin", slurm_bin, "/opt/slurm/bin"),
        runtime=_string(runtime))
    return _validated(text)


def local_starter_toml(workspace: str, gpus: Optional[int], python: str,
                       runtime: str = "none") -> str:
    """The starter profile of the local backend; ``gpus``: what nvidia-smi found (None:
    no nvidia-smi). InvalidInput naming the option if a value is invalid."""
    found = "none found" if gpus is None else f"nvidia-smi -L lists {gpus}"
    text = LOCAL_TEMPLATE.format(workspace=_string(workspace), found=found,
                                 gpus_per_node=gpus or 0, python=_string(python),
                                 runtime=_string(runtime))
    return _validated(text)


def _validated(text: str) -> str:
    try:
        Profile.model_validate(tomllib.loads(text))
    except ValidationError as err:
        raise InvalidInput(f"profile init: {first_error(err)}") from err
    return text


def write_starter(path: Path, text: str) -> Path:
    """Create ``path`` (0600; every missing parent 0700) with ``text``; Conflict if it
    exists."""
    ensure_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError as err:
        raise Conflict(f"{path}: already exists; profile init never overwrites",
                       hint="edit it, or pass --path for a new file") from err
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
