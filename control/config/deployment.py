"""A deployment: one model alias served by ``replicas`` copies of one engine."""

from __future__ import annotations

import string
from pathlib import PurePosixPath
from typing import Annotated, Dict, List, Literal, Optional, Sequence, Union

from pydantic import Discriminator, Field, Tag, model_validator

from synthbatch.agent_stdlib.containers import RESERVED_MOUNT
from synthbatch.control.config.engines import PARALLEL, RENDERED, check_extra_args
from synthbatch.control.config.fields import (
    AbsPath,
    ConfigPath,
    EnvName,
    ModelRef,
    Name,
    ServedName,
    Strict,
    Text,
    UrlPath,
    under,
)
from synthbatch.control.config.rules import check_path_length
from synthbatch.control.secrets import check_args, literal_secret

COMMAND_PLACEHOLDERS = frozenset({"host", "port", "model", "served_name", "python", "config_dir",
                                  "agent"})
# Filled per rank on the node, in the command of a replica of several nodes only.
RANK_PLACEHOLDERS = frozenset({"node_rank", "leader_host", "dist_port"})
ARG_PLACEHOLDERS = frozenset({"model", "served_name", "config_dir"})


def placeholders(text: str) -> List[str]:
    """Field names used by a ``str.format`` template; ValueError if malformed."""
    names = []
    for _, field, spec, conversion in string.Formatter().parse(text):
        if field is None:
            continue
        if spec or conversion:
            raise ValueError(f"placeholder {{{field}}} must not carry a format spec")
        names.append(field)
    return names


def check_placeholders(name: str, args: Sequence[str], allowed: frozenset) -> List[str]:
    """The placeholders ``args`` use; ValueError naming ``name[i]`` for a bad one."""
    used: List[str] = []
    for index, arg in enumerate(args):
        try:
            found = placeholders(arg)
        except ValueError as err:
            raise ValueError(f"{name}[{index}]: {err}") from err
        unknown = sorted(set(found) - allowed)
        if unknown:
            raise ValueError(f"{name}[{index}]: unknown placeholder {{{unknown[0]}}} (allowed: "
                             + ", ".join(f"{{{n}}}" for n in sorted(allowed)) + ")")
        used += found
    return used


def check_path_value(name: str, arg: str) -> None:
    """Reject a relative path, ``..`` or the reserved mount in one path-like argument."""
    value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
    if value.startswith(("./", "../")) or value in (".", ".."):
        raise ValueError(f"{name}: relative path; use an absolute path or {{config_dir}}/...")
    if value.startswith(("/", "{config_dir}/")):
        try:
            check_path_length(value)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    if value.startswith("/"):
        if ".." in PurePosixPath(value).parts:
            raise ValueError(f"{name}: path must not contain '..'")
        if under(value, RESERVED_MOUNT):
            raise ValueError(f"{name}: {RESERVED_MOUNT} is reserved for the run directory")


def check_paths(name: str, args: Sequence[str]) -> None:
    """``check_path_value`` for every argument, named ``name[i]``."""
    for index, arg in enumerate(args):
        check_path_value(f"{name}[{index}]", arg)


class SecretRef(Strict):
    """An environment value read at run time from the job's environment variable ``secret``."""

    secret: EnvName


def _env_kind(value: object) -> str:
    return "<secret>" if isinstance(value, (dict, SecretRef)) else "<text>"


# Tags in angle brackets are dropped from error locations by the loader.
EnvValue = Annotated[Union[Annotated[Text, Tag("<text>")],
                           Annotated[SecretRef, Tag("<secret>")]], Discriminator(_env_kind)]


def check_env(env: Dict[str, EnvValue]) -> None:
    """No literal secret (``control.secrets.literal_secret``): secrets are references."""
    for key, value in env.items():
        if isinstance(value, SecretRef):
            continue
        rule = literal_secret(key, value)
        if rule:
            raise ValueError(f"env.{key}: looks like a literal secret: {rule} (value not "
                             f"shown); write {{ secret = \"NAME\" }} and list NAME in the "
                             f"profile's secrets")
        check_path_value(f"env.{key}", value)


class Deployment(Strict):
    """One model alias: an engine, a model and how many GPUs on how many nodes."""

    alias: Name
    engine: Literal["vllm", "sglang", "llamacpp", "openai"] = "openai"
    model: ModelRef
    served_name: Optional[ServedName] = None
    image: Optional[Name] = None
    executable: Optional[AbsPath] = None
    python: Optional[ConfigPath] = None
    command: Optional[List[Text]] = None
    extra_args: List[Text] = []
    env: Dict[EnvName, EnvValue] = {}
    # "auto": chosen by the automatic layout (control/planning/layout.py) before planning
    gpus: Optional[Union[Literal["auto"], Annotated[int, Field(ge=0, le=64)]]] = None
    tensor_parallel: Optional[int] = Field(default=None, ge=1, le=64)
    pipeline_parallel: Optional[int] = Field(default=None, ge=1, le=64)
    replicas: int = Field(default=1, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=64)
    nodes_per_replica: Optional[int] = Field(default=None, ge=1, le=64)
    shared_node: Optional[Name] = None
    startup_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    readiness_path: UrlPath = "/health"
    # the proxy sheds above this many waiting per replica; the generator keeps up to this
    # many in flight per replica (agent_stdlib/recipe/sizing.py: one rule for both)
    max_queued_requests: int = Field(default=256, ge=0, le=100000)

    @property
    def gpus_per_replica(self) -> int:
        """GPUs of one replica: ``gpus``, else TP x PP for parallel engines, else 0
        (``gpus = "auto"`` counts as TP x PP until the layout fills it in)."""
        if isinstance(self.gpus, int):
            return self.gpus
        if self.engine in PARALLEL:
            return (self.tensor_parallel or 1) * (self.pipeline_parallel or 1)
        return 0

    @model_validator(mode="after")
    def _valid(self) -> Deployment:
        self._check_engine_fields()
        self._check_shape()
        check_env(self.env)
        if self.engine == "llamacpp" and not self.model.startswith(("/", "{config_dir}/")):
            raise ValueError("model: llamacpp needs the absolute path of a GGUF file")
        return self

    def _check_engine_fields(self) -> None:
        if self.engine == "openai":
            if self.command is None:
                raise ValueError("command: engine 'openai' needs the command that serves "
                                 "the model")
            for field in ("extra_args", "executable", "python"):
                if getattr(self, field):
                    raise ValueError(f"{field}: only for engines "
                                     f"{', '.join(RENDERED)}; put it in command")
            self._check_command(self.command)
            return
        if self.engine == "llamacpp" and (self.nodes_per_replica or 1) > 1:
            raise ValueError("nodes_per_replica: a llamacpp replica runs on one node")
        if self.command is not None:
            raise ValueError(f"command: engine {self.engine!r} renders its own command; "
                             f"use extra_args")
        if self.executable and self.python:
            raise ValueError("python: give either executable (a server binary) or python "
                             "(a serving environment), not both")
        check_placeholders("extra_args", self.extra_args, ARG_PLACEHOLDERS)
        for check in (lambda a: check_extra_args(self.engine, a), check_args):
            try:
                check(self.extra_args)
            except ValueError as err:
                raise ValueError(f"extra_args{err}") from err
        check_paths("extra_args", self.extra_args)

    def _check_command(self, command: List[str]) -> None:
        if not command:
            raise ValueError("command: must not be empty")
        spanning = (self.nodes_per_replica or 1) > 1
        used = check_placeholders("command", command, COMMAND_PLACEHOLDERS | RANK_PLACEHOLDERS)
        rank = sorted(RANK_PLACEHOLDERS & set(used))
        if rank and not spanning:
            raise ValueError(f"command: {{{rank[0]}}} is only for a replica of several nodes "
                             "(nodes_per_replica > 1)")
        if "port" not in used:
            raise ValueError("command: must contain {port} so the agent can place the server")
        if spanning and "node_rank" not in used:
            raise ValueError("command: a replica of several nodes runs this command on each "
                             "of them; it must contain {node_rank} (and {leader_host}, "
                             "{dist_port} to find rank 0)")
        try:
            check_args(command)
        except ValueError as err:
            raise ValueError(f"command{err}") from err
        check_paths("command", command)

    def _check_shape(self) -> None:
        if self.engine not in PARALLEL:
            for field in ("tensor_parallel", "pipeline_parallel"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{field}: only for engines {', '.join(PARALLEL)}")
        else:
            tp, pp = self.tensor_parallel or 1, self.pipeline_parallel or 1
            if isinstance(self.gpus, int) and tp * pp != self.gpus:
                raise ValueError(f"tensor_parallel: tensor_parallel x pipeline_parallel = "
                                 f"{tp} x {pp} = {tp * pp} but gpus = {self.gpus}")
        if self.nodes > self.replicas:
            raise ValueError(f"nodes: {self.nodes} nodes for {self.replicas} replica(s); "
                             f"nodes spreads whole replicas (a replica spanning nodes is "
                             f"nodes_per_replica)")
        spanning = self.nodes_per_replica or 1
        if spanning > 1 and self.gpus != "auto":
            gpus = self.gpus_per_replica
            if gpus == 0 or gpus % spanning:
                raise ValueError(f"nodes_per_replica: {gpus} GPU(s) per replica do not split "
                                 f"evenly over {spanning} nodes")
