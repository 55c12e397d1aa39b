"""The run config: what to generate, how many records, which models on how many GPUs."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, List, Literal, Optional

from pydantic import Field, StringConstraints, model_validator

from synthbatch.agent_stdlib.text import quoted
from synthbatch.control.config.client import Client, DataDesignerClient, GenerateClient
from synthbatch.control.config.deployment import Deployment
from synthbatch.control.config.fields import Name, SchemaVersion, Strict, TimeLimit
from synthbatch.control.config.rules import key_text


class Shards(Strict):
    """How records are split: a shard count or records per shard (exactly one)."""

    count: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    records_per_shard: Optional[int] = Field(default=None, ge=1)
    throttle: Optional[int] = Field(default=None, ge=0, le=100_000)

    @model_validator(mode="after")
    def _exactly_one(self) -> Shards:
        if (self.count is None) == (self.records_per_shard is None):
            raise ValueError("give exactly one of count or records_per_shard")
        return self


BenchmarkId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]


class Resources(Strict):
    """Per-allocation overrides of the profile's defaults."""

    time_limit: Optional[TimeLimit] = None
    cpus: Optional[int] = Field(default=None, ge=1, le=1024)
    mem_mb: Optional[int] = Field(default=None, ge=64)
    # a GPU budget per allocation: the automatic layout (docs/configuration.md) chooses
    # TP/PP/replicas of the deployments that leave them out
    gpus: Optional[int] = Field(default=None, ge=1, le=4096)
    # the hours the whole run may take: turned into shards with a pilot's throughput
    deadline_hours: Optional[float] = Field(default=None, gt=0, le=8760)
    # a finished `synthbatch benchmark` of the same models: the measured work per record
    # (the split between deployments, the deadline's throughput) instead of the estimate
    pilot: Optional[BenchmarkId] = None


class Output(Strict):
    """``[output]``: the merge the cluster runs by itself once the run is over (issue 34)."""

    # where the merged dataset goes (relative: to the run file's folder); None: no merge job
    merge_to: Optional[str] = Field(default=None, min_length=1, max_length=4096)
    format: Literal["jsonl", "parquet"] = "jsonl"
    # merge the shards that won once attempts are exhausted (the manifest names the rest)
    allow_partial: bool = False


class Retries(Strict):
    """``[retries]``: what the agent retries by itself."""

    # restarts of a failed client step or of a server that crashed after it was ready,
    # inside the same allocation, before the attempt is given up (docs/retry.md
    # "Restarts inside the allocation"); 0 turns them off
    in_allocation: int = Field(default=2, ge=0, le=20)


class RunConfig(Strict):
    """A whole run as the user wrote it."""

    schema_version: SchemaVersion
    name: Name
    records: int = Field(ge=1, le=10**10)
    shards: Shards
    client: Client
    deployments: List[Deployment] = Field(min_length=1, max_length=32)
    resources: Resources = Resources()
    max_attempts: int = Field(default=3, ge=1, le=100)
    # attempts 2..max_attempts by a small CPU-only round job (docs/retry.md "Automatic
    # retries"); false: only `retry` run by hand
    auto_retry: bool = True
    retries: Retries = Retries()
    resume: Literal["auto", "always", "never"] = "auto"
    output_format: Literal["jsonl"] = "jsonl"
    reuse: List[str] = Field(default_factory=list, max_length=32)  # run ids (issue 31)
    output: Output = Output()

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        aliases = [d.alias for d in self.deployments]
        dupes = sorted(a for a, n in Counter(aliases).items() if n > 1)
        if dupes:
            raise ValueError(f"deployments: alias {quoted(dupes[0])} is defined twice")
        for index, dep in enumerate(self.deployments):
            if dep.shared_node is not None and dep.shared_node not in aliases[:index]:
                raise ValueError(f"deployments[{index}].shared_node: {quoted(dep.shared_node)} is "
                                 f"not an earlier deployment (have before it: "
                                 f"{', '.join(aliases[:index]) or 'none'})")
        for where, alias in (self.client.aliases() if isinstance(self.client, GenerateClient)
                             else ()):
            if alias not in aliases:
                raise ValueError(f"client.{where}: {quoted(alias)} is not a deployment alias "
                                 f"(have: {', '.join(aliases)})")
        if isinstance(self.client, DataDesignerClient):
            for dd_alias, alias in sorted(self.client.models.items()):
                if alias not in aliases:
                    raise ValueError(f"client.models.{key_text(dd_alias)}: {quoted(alias)} "
                                     f"is not a deployment alias (have: {', '.join(aliases)})")
        if self.shards.count is not None and self.shards.count > self.records:
            raise ValueError(f"shards.count: {self.shards.count} shards for "
                             f"{self.records} records")
        return self
