"""The human summary of a plan: what an admin reads before signing off (pure)."""

from __future__ import annotations

import shlex
from typing import Dict, List, Optional

from synthbatch.agent_stdlib.contracts import (
    ContainerSpec,
    DeploymentSpec,
    GenerateSpec,
    Plan,
    ResourceSpec,
)
from synthbatch.agent_stdlib.recipe.kinds import LLM
from synthbatch.agent_stdlib.recipe.sizing import bounds


def _or_dash(value: Optional[str]) -> str:
    return value if value else "-"


def _span(first: int, count: int) -> str:
    return f"{first}" if count == 1 else f"{first}-{first + count - 1}"


def _gpu_request(res: ResourceSpec) -> str:
    if not res.gpus:
        return "no GPUs"
    flag = f"--gres=gpu:{res.gpus}" if res.gpu_request == "gres" else (
        f"--gpus={res.gpus}" if res.nodes == 1 else f"--gpus-per-node={res.gpus}")
    return f"{res.gpus} GPU(s) per node ({flag})"


def _resources(res: ResourceSpec) -> List[str]:
    extra = ", ".join(f"--{k}" + (f"={v}" if v else "") for k, v in sorted(res.options.items()))
    return [
        f"per shard: {res.nodes} node(s), {_gpu_request(res)}, {res.cpus} cpus, "
        f"{res.mem_mb} MB, time {res.time_limit}",
        f"  partition {_or_dash(res.partition)}, account {_or_dash(res.account)}, "
        f"qos {_or_dash(res.qos)}, reservation {_or_dash(res.reservation)}, "
        f"extra #SBATCH: {extra or '-'}",
    ]


def _layout(plan: Plan, gpus_per_node: Optional[int]) -> List[str]:
    nodes: Dict[int, List[str]] = {}
    for dep in plan.deployments:
        for rep in dep.placement:
            gpus = ",".join(map(str, rep.gpus)) or "none"
            for rank, node in enumerate(rep.span):
                if len(rep.span) == 1:
                    text = f"{dep.alias}#{rep.index} GPUs {gpus} port {rep.port}"
                elif rank == 0:
                    text = (f"{dep.alias}#{rep.index} rank 0/{len(rep.span)} GPUs {gpus} port "
                            f"{rep.port}, ranks meet at port {rep.dist_port}")
                else:
                    text = f"{dep.alias}#{rep.index} rank {rank}/{len(rep.span)} GPUs {gpus}"
                nodes.setdefault(node, []).append(text)
    lines = ["GPU layout:"]
    for node in range(plan.resources.nodes):
        used = sum(len(r.gpus) for d in plan.deployments for r in d.placement
                   if node in r.span)
        total = f"/{gpus_per_node}" if gpus_per_node else ""
        client = "; client" if node == 0 else ""
        lines.append(f"  node {node} ({used}{total} GPUs): "
                     + "; ".join(nodes.get(node, [])) + client)
    return lines


def _image(container: Optional[ContainerSpec]) -> str:
    if container is None:
        return "host (no container)"
    return f"{container.runtime} image {container.image} ({container.path})"


def _env_names(env: Dict[str, str], secret_env: Dict[str, str]) -> str:
    names = sorted(env) + [f"{k}<-secret {v}" for k, v in sorted(secret_env.items())]
    return ", ".join(names) or "-"


def _deployment(dep: DeploymentSpec) -> List[str]:
    shape = f"{dep.replicas} replica(s) x {dep.gpus_per_replica} GPU(s)"
    if dep.engine in ("vllm", "sglang"):
        shape += f" (TP {dep.tensor_parallel} x PP {dep.pipeline_parallel})"
    if dep.nodes_per_replica > 1:
        shape += (f", each across {dep.nodes_per_replica} nodes ({dep.gpus_per_rank} GPU(s) "
                  f"per node, one rank each)")
    else:
        shape += f" on {dep.nodes} node(s)"
    followers = [f"    ranks > 0 add: {shlex.join(dep.follower_args)}"] \
        if dep.follower_args else []
    return [
        f"  {dep.alias}: {dep.engine}, model {dep.model} served as {dep.served_name}, "
        f"{shape}, {_image(dep.container)}",
        f"    argv: {shlex.join(dep.command)}",
        *followers,
        f"    env: {_env_names(dep.env, dep.secret_env)}; ready at {dep.readiness_path} within "
        f"{dep.startup_timeout_s:g}s; max queued {dep.max_queued_requests}",
    ]


def _concurrency(plan: Plan, aliases: List[str]) -> str:
    assert plan.client is not None
    if plan.client.concurrency is not None:
        return f"concurrency {plan.client.concurrency} per alias"
    shown = []
    for alias in aliases:
        dep = plan.deployment(alias)
        start, ceiling = bounds(dep.replicas, dep.max_queued_requests)
        shown.append(f"{alias} {start}->{ceiling}")
    return "adaptive concurrency " + ", ".join(shown)


def _recipe(c: GenerateSpec) -> List[str]:
    lines = []
    if c.seed_data is not None:
        rows = f"{c.seed_data.rows} rows" if c.seed_data.rows else \
            "not visible here: preflight checks it"
        lines.append(f"    seed data: {c.seed_data.path} ({c.seed_data.order}, {rows})")
    for col in c.columns:
        model = f" -> {col.params['model']}" if col.type in LLM else ""
        lines.append(f"    column {col.name}: {col.type}{model}"
                     + (" (dropped from records)" if col.drop else ""))
    return lines


def _client(plan: Plan) -> List[str]:
    if plan.client is not None:
        c = plan.client
        if not c.columns:
            return [f"client: generate -> {c.model} ({_concurrency(plan, [c.model])}, "
                    f"max_tokens {c.max_tokens}, temperature {c.temperature:g})"]
        aliases = sorted({str(col.params["model"]) for col in c.columns if col.type in LLM})
        return [f"client: generate {len(c.columns)} columns, seed {c.seed}, on_error "
                f"{c.on_error}" + (f", {_concurrency(plan, aliases)}" if aliases else "")
                ] + _recipe(c)
    dd = plan.client_data_designer
    if dd is not None:
        models = ", ".join(f"{k} -> {v}" for k, v in sorted(dd.models.items())) or "same names"
        return [f"client: Data Designer {dd.config} in {_image(dd.container)}",
                f"    python: {dd.python}; model aliases: {models}",
                f"    env: {_env_names(dd.env, dd.secret_env)}"]
    cmd = plan.client_command
    assert cmd is not None
    return [f"client: command in {_image(cmd.container)}",
            f"    argv: {shlex.join(cmd.argv)}",
            f"    env: {_env_names(cmd.env, cmd.secret_env)}"]


def _images(plan: Plan) -> List[str]:
    seen: Dict[str, ContainerSpec] = {}
    containers = [d.container for d in plan.deployments]
    containers.append(plan.client_container)
    for container in containers:
        if container is not None:
            seen.setdefault(container.image, container)
    lines = [f"  {c.image}: {c.path} sha256 {c.sha256}" for c in seen.values()]
    if seen:
        mounts = next(iter(seen.values())).mounts
        lines.append("  mounts: " + ", ".join(
            f"{m.host}->{m.container}{' (ro)' if m.read_only else ''}" for m in mounts))
    return ["images:"] + (lines or ["  none (every step runs on the host)"])


def plan_summary(plan: Plan, plan_sha256: str, gpus_per_node: Optional[int] = None) -> str:
    """Shards, records per shard, per-shard resources, GPU layout, ports, images, digests."""
    sizes = [s.num_records for s in plan.shards]
    arrays = ", ".join(f"array {a.index}: shards {_span(a.first_shard, a.count)}"
                       for a in plan.arrays) or "one array"
    lines = [
        f"run {plan.name}: {plan.total_records} records in {len(plan.shards)} shards "
        f"({max(sizes)} per shard at most)",
        f"run id: submit makes one, like {plan.run_id}; records per shard "
        f"{min(sizes)}-{max(sizes)} (contiguous ranges); {arrays}; throttle "
        f"{plan.array_throttle or 'none'}",
        f"retries: {plan.max_attempts} attempts per shard, resume {plan.resume}; output "
        f"{plan.output_format}",
        *_resources(plan.resources),
        *(["backend local: no Slurm; each shard runs on this machine (the batch script below "
           "as it is; partition, account, cpus and memory are not enforced)"]
          if plan.runtime.launcher == "local" else []),
        f"total: up to {len(plan.shards)} allocations x {plan.resources.nodes} node(s) x "
        f"{plan.resources.gpus} GPU(s)",
        *_layout(plan, gpus_per_node),
        "deployments:",
        *[line for dep in plan.deployments for line in _deployment(dep)],
        *_client(plan),
        *_images(plan),
        f"plan sha256 {plan_sha256}; agent {plan.agent_sha256 or '(pinned at submit)'}",
    ]
    return "\n".join(lines)
