"""Authored inputs -> the immutable Plan (pure functions, no I/O)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from synthbatch.agent_stdlib.containers import IMAGE_PYTHON
from synthbatch.agent_stdlib.contracts import (
    ColumnSpec,
    CommandClientSpec,
    ContainerSpec,
    DataDesignerSpec,
    DeploymentSpec,
    GenerateSpec,
    MountSpec,
    Plan,
    ReplicaSpec,
    ResourceSpec,
    RuntimeSpec,
    SeedDataSpec,
    ShardSpec,
    split_dd_config,
)
from synthbatch.agent_stdlib.layout import run_dir
from synthbatch.control.config.client import CommandClient, DataDesignerClient, GenerateClient
from synthbatch.control.config.deployment import Deployment, SecretRef
from synthbatch.control.config.engines import PARALLEL
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import InvalidInput
from synthbatch.control.images.registry import ImageEntry
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.planning.containers import (
    PlanError,
    container_for,
    inside,
    model_inside,
    mounts_for,
)
from synthbatch.control.planning.engines import engine_argv, follower_args
from synthbatch.control.planning.placement import Placement, PlacementError, Shape, place

# Placeholders the agent fills in on the node; the planner leaves them as they are.
NODE_PLACEHOLDERS = {name: f"{{{name}}}" for name in ("host", "port", "agent", "node_rank",
                                                      "leader_host", "dist_port")}
EnvMap = Mapping[str, Union[str, SecretRef]]


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


def _fill(args: Sequence[str], values: Mapping[str, str]) -> Tuple[str, ...]:
    out = []
    for arg in args:
        filled = arg.format_map(values)
        if arg.startswith("{config_dir}"):
            filled = os.path.normpath(filled)
        out.append(filled)
    return tuple(out)


def resolve_command(dep: Deployment, python: str, config_dir: Path,
                    model: Optional[str] = None) -> Tuple[str, ...]:
    """Fill the plan-time placeholders of a server command; keep {host} and {port}."""
    assert dep.command is not None
    model = model or dep.model
    values = dict(NODE_PLACEHOLDERS, model=model, served_name=dep.served_name or dep.model,
                  python=python, config_dir=str(config_dir))
    return _fill(dep.command, values)


def config_path(value: str, config_dir: Path) -> str:
    """Resolve a ``{config_dir}/...`` path against the run file's directory."""
    if value.startswith("{config_dir}/"):
        return os.path.normpath(str(config_dir) + value[len("{config_dir}"):])
    return value


def replica_nodes(dep: Deployment, gpus_per_node: int) -> int:
    """Nodes one replica spans: ``nodes_per_replica``, else, for the engines that render
    their multi-node ranks (vLLM, SGLang), the fewest nodes that split its GPUs evenly
    into at most ``gpus_per_node`` each (TP 8 x PP 2 on 8-GPU nodes: 2), else 1."""
    if dep.nodes_per_replica:
        return dep.nodes_per_replica
    gpus = dep.gpus_per_replica
    if dep.engine not in PARALLEL or gpus_per_node == 0 or gpus <= gpus_per_node:
        return 1
    return next(n for n in range(2, gpus + 1) if gpus % n == 0 and gpus // n <= gpus_per_node)


def _server_argv(dep: Deployment, model: str, python: str, config_dir: Path,
                 container: Optional[ContainerSpec], nodes: int) -> Tuple[str, ...]:
    served = dep.served_name or model
    if dep.engine not in PARALLEL + ("llamacpp",):
        argv = resolve_command(dep, python, config_dir, model)
        return tuple(inside(a, container) for a in argv)
    extra = _fill(dep.extra_args, {"model": model, "served_name": served,
                                   "config_dir": str(config_dir)})
    exe = inside(dep.executable, container) if dep.executable else None
    serving_python = config_path(dep.python, config_dir) if dep.python else None
    return engine_argv(dep.engine, model=model, served_name=served,
                       tensor_parallel=dep.tensor_parallel or 1,
                       pipeline_parallel=dep.pipeline_parallel or 1,
                       extra_args=[inside(a, container) for a in extra], executable=exe,
                       python=serving_python, nodes=nodes,
                       dist_timeout_s=dep.startup_timeout_s)


def _env(env: EnvMap, where: str, profile: Profile,
         container: Optional[ContainerSpec]) -> Tuple[Dict[str, str], Dict[str, str]]:
    """Literal env (paths translated) and secret references (checked against the profile)."""
    literal: Dict[str, str] = {}
    secret_env: Dict[str, str] = {}
    for key, value in env.items():
        if isinstance(value, SecretRef):
            if value.secret not in profile.secrets:
                raise PlanError(f"{where}.{key}", f"secret {value.secret} is not listed in the "
                                                  f"profile's secrets")
            secret_env[key] = value.secret
        else:
            literal[key] = inside(value, container)
    return literal, secret_env


def _deployment(index: int, dep: Deployment, profile: Profile, config_dir: Path,
                images: Mapping[str, ImageEntry], mounts: Tuple[MountSpec, ...],
                replicas: Tuple[ReplicaSpec, ...]) -> DeploymentSpec:
    where = f"deployments[{index}]"
    container = container_for(profile, dep.image, f"{where}.image", images, mounts)
    resolved = config_path(dep.model, config_dir)
    model = model_inside(resolved, container, f"{where}.model")
    env, secret_env = _env(dep.env, f"{where}.env", profile, container)
    nodes = replica_nodes(dep, profile.gpus_per_node)
    return DeploymentSpec(
        alias=dep.alias,
        engine=dep.engine,
        model=resolved,
        served_name=dep.served_name or resolved,
        command=_server_argv(dep, model, profile.python, config_dir, container, nodes),
        env=env,
        gpus_per_replica=dep.gpus_per_replica,
        replicas=dep.replicas,
        startup_timeout_s=dep.startup_timeout_s,
        readiness_path=dep.readiness_path,
        max_queued_requests=dep.max_queued_requests,
        tensor_parallel=dep.tensor_parallel or 1,
        pipeline_parallel=dep.pipeline_parallel or 1,
        nodes=dep.nodes,
        placement=replicas,
        secret_env=secret_env,
        container=container,
        nodes_per_replica=nodes,
        follower_args=follower_args(dep.engine, nodes),
    )


def _gpu_field(dep: Deployment) -> str:
    if dep.nodes_per_replica:
        return "nodes_per_replica"
    return "gpus" if dep.gpus is not None or dep.engine not in PARALLEL else "tensor_parallel"


def _placement(run: RunConfig, profile: Profile) -> Placement:
    aliases = [d.alias for d in run.deployments]
    shapes = [Shape(gpus=d.gpus_per_replica, replicas=d.replicas, nodes=d.nodes,
                    gpu_field=_gpu_field(d),
                    nodes_per_replica=replica_nodes(d, profile.gpus_per_node),
                    shared_with=aliases.index(d.shared_node) if d.shared_node else None)
              for d in run.deployments]
    if profile.backend == "local":
        for index, dep in enumerate(run.deployments):
            if dep.nodes > 1:
                raise PlanError(f"deployments[{index}].nodes", f"{dep.nodes} nodes: the local "
                                                               "backend runs on one machine")
    try:
        placement = place(shapes, profile.gpus_per_node, profile.port_base)
    except PlacementError as err:
        if err.index < 0:
            raise PlanError(err.field, str(err), source="profile") from err
        raise PlanError(f"deployments[{err.index}].{err.field}",
                        f"{err} (gpus_per_node)") from err
    if profile.backend == "local":
        _one_machine(placement, shapes, profile.gpus_per_node)
    return placement


def _one_machine(placement: Placement, shapes: List[Shape], gpus_per_node: int) -> None:
    """A local plan's replicas all fit on node 0; else name the first that does not."""
    for index, (shape, replicas) in enumerate(zip(shapes, placement.replicas)):
        for replica in replicas:
            if len(replica.span) > 1:
                raise PlanError(f"deployments[{index}].{shape.gpu_field}",
                                f"{shape.gpus} GPU(s) per replica span {len(replica.span)} "
                                f"nodes of {gpus_per_node} GPUs (gpus_per_node): the local "
                                "backend runs on one machine")
            if replica.node > 0:
                raise PlanError(f"deployments[{index}].{shape.gpu_field}",
                                f"replica {replica.index} ({shape.gpus} GPU(s)) does not fit "
                                f"on this machine's {gpus_per_node} GPUs (gpus_per_node) next "
                                "to the replicas before it: the local backend runs on one "
                                "machine")


def _resources(run: RunConfig, profile: Profile, placement: Placement) -> ResourceSpec:
    return profile_resources(profile, max(placement.gpus_used, default=0),
                             max(placement.nodes, 1), run.resources.time_limit,
                             run.resources.cpus, run.resources.mem_mb)


def profile_resources(profile: Profile, gpus: int, nodes: int = 1,
                      time_limit: Optional[str] = None, cpus: Optional[int] = None,
                      mem_mb: Optional[int] = None) -> ResourceSpec:
    """What an allocation of ``nodes`` nodes with ``gpus`` GPUs each asks of Slurm under
    ``profile`` (``time_limit``, ``cpus`` and ``mem_mb`` given by the run win); ``profile
    validate`` asks it for the profile's own defaults."""
    per_node_cpus = profile.cpus_per_task
    if profile.cpus_per_gpu and gpus:
        per_node_cpus = profile.cpus_per_gpu * gpus
    mem = profile.mem_mb
    if profile.mem_per_gpu_mb and gpus:
        mem = profile.mem_per_gpu_mb * gpus
    return ResourceSpec(
        partition=profile.partition,
        account=profile.account,
        qos=profile.qos,
        time_limit=time_limit or profile.default_time_limit,
        nodes=nodes,
        gpus=gpus,
        gpu_request=profile.gpu_request,
        cpus=cpus or per_node_cpus,
        mem_mb=mem_mb or mem,
        reservation=profile.reservation,
        options=dict(profile.sbatch_options),
    )


def _runtime(placement: Placement, profile: Profile, resources: ResourceSpec) -> RuntimeSpec:
    per_node = [0] * max(placement.nodes, 1)
    for replicas in placement.replicas:
        for replica in replicas:
            for node in replica.span:
                per_node[node] += 1
    per_node[0] += 1  # the client runs on the first node
    steps = max(per_node)
    step_mem = resources.mem_mb // steps
    if step_mem < 32:
        raise PlanError("resources.mem_mb", f"{resources.mem_mb} MB is too little for "
                                            f"{steps} concurrent steps")
    return RuntimeSpec(
        launcher="local" if profile.backend == "local" else "srun",
        python=profile.python,
        port_base=profile.port_base,
        env_allow=tuple(profile.env_allow),
        step_mem_mb=step_mem,
        grace_s=profile.grace_s,
        secrets=tuple(profile.secrets),
    )


def _generate_spec(client: GenerateClient, config_dir: Path, profile: Profile,
                   images: Mapping[str, ImageEntry],
                   mounts: Tuple[MountSpec, ...]) -> GenerateSpec:
    container = container_for(profile, client.image, "client.image", images, mounts)
    seed_data = None
    if client.seed_data is not None:
        path = config_path(client.seed_data.path, config_dir)
        # the plan keeps the host path (plan and preflight read it there); the agent hands
        # the generator in an image the path under its mount (launch.client_launch)
        model_inside(path, container, "client.seed_data.path")
        seed_data = SeedDataSpec(path=path, order=client.seed_data.order,
                                 fields=tuple(client.graph().seed_fields))
    return GenerateSpec(
        model=client.model or "",
        prompt_template=client.prompt_template or "",
        system_prompt=client.system_prompt,
        max_tokens=client.max_tokens,
        temperature=client.temperature,
        concurrency=client.concurrency,
        max_retries=client.max_retries,
        request_timeout_s=client.request_timeout_s,
        seed=client.seed,
        on_error=client.on_error,
        columns=tuple(ColumnSpec(name=c.name, type=c.type, params=c.params(), drop=c.drop)
                      for c in client.columns or ()),
        seed_data=seed_data,
        container=container,
        context=client.context,
    )


def _command_spec(client: CommandClient, profile: Profile, config_dir: Path,
                  images: Mapping[str, ImageEntry],
                  mounts: Tuple[MountSpec, ...]) -> CommandClientSpec:
    container = container_for(profile, client.image, "client.image", images, mounts)
    argv = _fill(client.command, {"python": profile.python, "config_dir": str(config_dir)})
    env, secret_env = _env(client.env, "client.env", profile, container)
    return CommandClientSpec(argv=tuple(inside(a, container) for a in argv), env=env,
                             secret_env=secret_env, container=container)


def _data_designer_spec(client: DataDesignerClient, profile: Profile, config_dir: Path,
                        images: Mapping[str, ImageEntry],
                        mounts: Tuple[MountSpec, ...]) -> DataDesignerSpec:
    container = container_for(profile, client.image, "client.image", images, mounts)
    path, function = split_dd_config(client.data_designer)
    path = model_inside(config_path(path, config_dir), container, "client.data_designer")
    python = config_path(client.python, config_dir) if client.python else IMAGE_PYTHON
    env, secret_env = _env(client.env, "client.env", profile, container)
    return DataDesignerSpec(config=f"{path}:{function}" if function else path, python=python,
                            models=dict(client.models), run_config=dict(client.run_config),
                            max_passes=client.max_passes, env=env, secret_env=secret_env,
                            container=container)


def _plan(run: RunConfig, profile: Profile, run_id: str, config_dir: Path,
          images: Mapping[str, ImageEntry], max_array_size: Optional[int],
          agent_sha256: str) -> Plan:
    for index, dep in enumerate(run.deployments):
        if dep.gpus == "auto":  # control.runs.plan.resolve fills it in from the model
            raise PlanError(f"deployments[{index}].gpus",
                            "'auto' is chosen by plan/submit from the model's files")
    placement = _placement(run, profile)
    resources = _resources(run, profile, placement)
    mounts = mounts_for(profile, str(run_dir(profile.workspace, run_id)))
    shards = tuple(split_records(run.records, run.shards.count, run.shards.records_per_shard))
    client = run.client
    return Plan(
        run_id=run_id,
        name=run.name,
        total_records=run.records,
        shards=shards,
        deployments=tuple(_deployment(i, d, profile, config_dir, images, mounts,
                                      placement.replicas[i])
                          for i, d in enumerate(run.deployments)),
        client=(_generate_spec(client, config_dir, profile, images, mounts)
                if isinstance(client, GenerateClient) else None),
        client_command=(_command_spec(client, profile, config_dir, images, mounts)
                        if isinstance(client, CommandClient) else None),
        client_data_designer=(_data_designer_spec(client, profile, config_dir, images, mounts)
                              if isinstance(client, DataDesignerClient) else None),
        resources=resources,
        runtime=_runtime(placement, profile, resources),
        max_attempts=run.max_attempts,
        arrays=array_chunks(len(shards), max_array_size),
        array_throttle=(run.shards.throttle if run.shards.throttle is not None
                        else profile.array_throttle),
        resume=run.resume,
        output_format=run.output_format,
        agent_sha256=agent_sha256,
        restarts_in_allocation=run.retries.in_allocation,
    )


def make_plan(run: RunConfig, profile: Profile, run_id: str, config_dir: Path, *,
              images: Optional[Mapping[str, ImageEntry]] = None,
              run_file: Optional[Path] = None, profile_file: Optional[Path] = None,
              max_array_size: Optional[int] = None, agent_sha256: str = "") -> Plan:
    """Resolve a validated run config against a profile into a Plan.

    ``images`` is the workspace's image registry; ``run_file``/``profile_file`` name the
    files in error messages (InvalidInput: ``<file>: <field path>: <why>``).
    """
    try:
        return _plan(run, profile, run_id, config_dir, images or {}, max_array_size,
                     agent_sha256)
    except PlanError as err:
        source = run_file if err.source == "run" else profile_file
        raise InvalidInput(f"{source or err.source + ' config'}: {err.where}: "
                           f"{err.message}") from err
