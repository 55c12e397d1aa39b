"""Authored inputs -> the immutable Plan (pure functions, no I/O)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import List, Optional, Tuple

from agent_stdlib.contracts import (
    DeploymentSpec,
    GenerateSpec,
    Plan,
    ResourceSpec,
    RuntimeSpec,
    ShardSpec,
)
from control.config.profile import Profile
from control.config.run import Deployment, RunConfig
from control.errors import InvalidInput

# Placeholders the agent fills in on the node; the planner leaves them as they are.
NODE_PLACEHOLDERS = {"host": "{host}", "port": "{port}"}


def new_run_id(name: str, now: Optional[float] = None) -> str:
    """A sortable, unique run id: ``<name>-<UTC time>-<random>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
    return f"{name}-{stamp}-{secrets.token_hex(3)}"


def split_records(records: int, count: Optional[int], per_shard: Optional[int]) -> List[ShardSpec]:
    """Contiguous record ranges, as even as possible (earlier shards take the remainder)."""
    if count is None:
        assert per_shard is not None
        count = -(-records // per_shard)
    base, extra = divmod(records, count)
    shards, offset = [], 0
    for index in range(count):
        size = base + (1 if index < extra else 0)
        shards.append(ShardSpec(index=index, record_offset=offset, num_records=size))
        offset += size
    return shards


def resolve_command(dep: Deployment, python: str, config_dir: Path) -> Tuple[str, ...]:
    """Fill the plan-time placeholders of a server command; keep {host} and {port}."""
    values = dict(NODE_PLACEHOLDERS, model=dep.model, served_name=dep.served_name or dep.model,
                  python=python, config_dir=str(config_dir))
    out = []
    for arg in dep.command:
        filled = arg.format_map(values)
        if arg.startswith("{config_dir}"):
            filled = os.path.normpath(filled)
        out.append(filled)
    return tuple(out)


def _deployment(dep: Deployment, python: str, config_dir: Path) -> DeploymentSpec:
    return DeploymentSpec(
        alias=dep.alias,
        engine=dep.engine,
        model=dep.model,
        served_name=dep.served_name or dep.model,
        command=resolve_command(dep, python, config_dir),
        env=dict(dep.env),
        gpus_per_replica=dep.gpus,
        replicas=dep.replicas,
        startup_timeout_s=dep.startup_timeout_s,
        readiness_path=dep.readiness_path,
        max_queued_requests=dep.max_queued_requests,
    )


def _resources(run: RunConfig, profile: Profile) -> ResourceSpec:
    gpus = sum(d.gpus * d.replicas for d in run.deployments)
    if gpus > profile.gpus_per_node:
        raise InvalidInput(
            f"deployments: {gpus} GPUs requested but the profile's nodes have "
            f"{profile.gpus_per_node} (gpus_per_node)")
    return ResourceSpec(
        partition=profile.partition,
        account=profile.account,
        qos=profile.qos,
        time_limit=run.resources.time_limit or profile.default_time_limit,
        nodes=1,
        gpus=gpus,
        gpu_request=profile.gpu_request,
        cpus=run.resources.cpus or profile.cpus_per_task,
        mem_mb=run.resources.mem_mb or profile.mem_mb,
    )


def _runtime(run: RunConfig, profile: Profile, resources: ResourceSpec) -> RuntimeSpec:
    steps = sum(d.replicas for d in run.deployments) + 1  # servers + client
    step_mem = resources.mem_mb // steps
    if step_mem < 32:
        raise InvalidInput(f"resources.mem_mb: {resources.mem_mb} MB is too little for "
                           f"{steps} concurrent steps")
    return RuntimeSpec(
        launcher="srun",
        python=profile.python,
        port_base=profile.port_base,
        env_allow=tuple(profile.env_allow),
        step_mem_mb=step_mem,
        grace_s=profile.grace_s,
    )


def make_plan(run: RunConfig, profile: Profile, run_id: str, config_dir: Path) -> Plan:
    """Resolve a validated run config against a profile into a Plan."""
    resources = _resources(run, profile)
    client = run.client
    return Plan(
        run_id=run_id,
        name=run.name,
        total_records=run.records,
        shards=tuple(split_records(run.records, run.shards.count, run.shards.records_per_shard)),
        deployments=tuple(_deployment(d, profile.python, config_dir) for d in run.deployments),
        client=GenerateSpec(
            model=client.model,
            prompt_template=client.prompt_template,
            system_prompt=client.system_prompt,
            max_tokens=client.max_tokens,
            temperature=client.temperature,
            concurrency=client.concurrency,
            max_retries=client.max_retries,
            request_timeout_s=client.request_timeout_s,
        ),
        resources=resources,
        runtime=_runtime(run, profile, resources),
        max_attempts=run.max_attempts,
    )
