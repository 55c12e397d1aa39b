"""The run config: what to generate, how many records, which models on how many GPUs."""

from __future__ import annotations

import string
from typing import Dict, List, Literal, Optional

from pydantic import Field, model_validator

from control.config.fields import EnvName, Name, Strict, Text, TimeLimit

COMMAND_PLACEHOLDERS = frozenset({"host", "port", "model", "served_name", "python", "config_dir"})
PROMPT_FIELDS = frozenset({"index"})


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


class Shards(Strict):
    """How records are split: a shard count or records per shard (exactly one)."""

    count: Optional[int] = Field(default=None, ge=1, le=100000)
    records_per_shard: Optional[int] = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> Shards:
        if (self.count is None) == (self.records_per_shard is None):
            raise ValueError("give exactly one of count or records_per_shard")
        return self


class GenerateClient(Strict):
    """The built-in client: one chat completion per record index."""

    model: Name
    prompt_template: Text
    system_prompt: Optional[Text] = None
    max_tokens: int = Field(default=256, ge=1, le=131072)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    concurrency: int = Field(default=8, ge=1, le=4096)
    max_retries: int = Field(default=5, ge=0, le=100)
    request_timeout_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _template(self) -> GenerateClient:
        try:
            used = placeholders(self.prompt_template)
        except ValueError as err:
            raise ValueError(f"prompt_template: {err}") from err
        unknown = sorted(set(used) - PROMPT_FIELDS)
        if unknown:
            raise ValueError(f"prompt_template: unknown placeholder {{{unknown[0]}}} "
                             f"(allowed: {{index}})")
        return self


class Deployment(Strict):
    """One model alias: a server command run as ``replicas`` srun steps."""

    alias: Name
    engine: Literal["openai"] = "openai"
    model: Text
    served_name: Optional[Text] = None
    command: List[Text] = Field(min_length=1)
    env: Dict[EnvName, Text] = {}
    gpus: int = Field(default=0, ge=0, le=64)
    replicas: int = Field(default=1, ge=1, le=64)
    startup_timeout_s: float = Field(default=600.0, gt=0)
    readiness_path: Text = "/health"
    max_queued_requests: int = Field(default=64, ge=0)

    @model_validator(mode="after")
    def _command(self) -> Deployment:
        used = set()
        for index, arg in enumerate(self.command):
            try:
                used.update(placeholders(arg))
            except ValueError as err:
                raise ValueError(f"command[{index}]: {err}") from err
        unknown = sorted(used - COMMAND_PLACEHOLDERS)
        if unknown:
            raise ValueError(f"command: unknown placeholder {{{unknown[0]}}} (allowed: "
                             + ", ".join(f"{{{n}}}" for n in sorted(COMMAND_PLACEHOLDERS)) + ")")
        if "port" not in used:
            raise ValueError("command: must contain {port} so the agent can place the server")
        if not self.readiness_path.startswith("/"):
            raise ValueError("readiness_path: must start with '/'")
        return self


class Resources(Strict):
    """Per-allocation overrides of the profile's defaults."""

    time_limit: Optional[TimeLimit] = None
    cpus: Optional[int] = Field(default=None, ge=1, le=1024)
    mem_mb: Optional[int] = Field(default=None, ge=64)


class RunConfig(Strict):
    """A whole run as the user wrote it."""

    schema_version: Literal[1]
    name: Name
    records: int = Field(ge=1, le=10**10)
    shards: Shards
    client: GenerateClient
    deployments: List[Deployment] = Field(min_length=1)
    resources: Resources = Resources()
    max_attempts: int = Field(default=3, ge=1, le=100)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        aliases = [d.alias for d in self.deployments]
        dupes = sorted({a for a in aliases if aliases.count(a) > 1})
        if dupes:
            raise ValueError(f"deployments: alias {dupes[0]!r} is defined twice")
        if self.client.model not in aliases:
            raise ValueError(f"client.model: {self.client.model!r} is not a deployment alias "
                             f"(have: {', '.join(aliases)})")
        if self.shards.count is not None and self.shards.count > self.records:
            raise ValueError(f"shards.count: {self.shards.count} shards for "
                             f"{self.records} records")
        return self
