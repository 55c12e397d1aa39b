"""Step launch specs: the argv and environment of every server and client step (pure).

One builder per step kind, no I/O, so the exact command lines are golden-tested
(``tests/unit/agent/allocation/test_launch.py``):

* a server replica runs ``dep.command`` with ``{host}``, ``{port}`` and ``{agent}`` filled,
  on its placement node (``srun --relative``), wrapped for its container; a replica with
  GPUs asks Slurm for all of the allocation's GPUs on its node and runs behind the
  ``serve`` role, which narrows the step's device lists to the plan's GPU indices
  (:mod:`agent_stdlib.allocation.serve`, ``docs/runtime.md`` "GPU binding");
* the client step runs the built-in ``generate`` role (on the host, or with the image's
  ``python3`` in its client image), the run's own command (``plan.client_command``), or the
  Data Designer adapter (``dd`` role) under the client environment's Python
  (``plan.client_data_designer``), with its env, secrets and container;
* secrets are copied by name from the agent's environment into the step's environment,
  never into an argv; inside a container the ``SYNTHBATCH_*`` paths and ``{agent}`` are
  translated to the container's view of the run directory, and the agent's node-local
  scratch (``SHIV_ROOT``) is mounted (:func:`scratch_for`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..clientenv import PATH_VARS, ClientEnv
from ..containers import (
    IMAGE_PYTHON,
    container_env,
    env_prefix,
    task_in_image,
    translate,
    with_scratch,
    wrap,
)
from ..contracts import ContainerSpec, DeploymentSpec, Plan
from .errors import LaunchError
from .steps import local_devices, step_argv, step_env

LOOPBACK = "127.0.0.1"
_PLACEHOLDER = re.compile(r"\{(host|port|agent|node_rank|leader_host|dist_port)\}")



@dataclass(frozen=True)
class Site:
    """Where one replica serves: allocation node index, the address it binds, its port,
    and the plan's GPU indices on that node."""

    node: int
    host: str
    port: int
    gpus: Tuple[int, ...] = ()
    # A replica across nodes: the nodes it spans (leader first), the address {host} is on
    # each of them, where the other ranks reach rank 0, and the first port of its block.
    span: Tuple[int, ...] = ()
    hosts: Tuple[str, ...] = ()
    leader: str = ""
    dist_port: int = 0

    @property
    def url(self) -> str:
        """The replica's base URL as the proxy reaches it."""
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Launch:
    """One step: its name, full argv (srun included) and environment."""

    name: str
    argv: Tuple[str, ...]
    env: Dict[str, str]


def fill_placeholders(argv: Sequence[str], host: Optional[str], port: Optional[int],
                      agent: Optional[str] = "", **ranks: object) -> List[str]:
    """Replace ``{host}``, ``{port}``, ``{agent}`` and the rank placeholders given as
    keywords (``node_rank``, ``leader_host``, ``dist_port``) in one pass (values are never
    rescanned); a placeholder whose value is None stays as it is, for the ``serve`` role of
    each rank to fill."""
    given = {"host": host, "port": port, "agent": agent, **ranks}
    values = {name: str(value) for name, value in given.items() if value is not None}
    return [_PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), arg)
            for arg in argv]


def secret_values(secret_env: Mapping[str, str], ambient: Mapping[str, str],
                  owner: str) -> Dict[str, str]:
    """Step variable -> value of the named job variable; LaunchError naming a missing one."""
    out: Dict[str, str] = {}
    for step_var, job_var in sorted(secret_env.items()):
        value = ambient.get(job_var)
        if not value:
            raise LaunchError(f"{owner}: secret variable {job_var} (for {step_var}) is not "
                              "set in the job environment")
        out[step_var] = value
    return out


def in_container(path: str, container: Optional[ContainerSpec], what: str) -> str:
    """``path`` as the step sees it: translated into ``container``'s mounts (if any)."""
    if container is None or container.runtime == "none":
        return path
    moved = translate(path, container.mounts)
    if moved is None:
        raise LaunchError(f"{what} {path} is not under any mount of image {container.image}")
    return moved


def scratch_for(name: str, container: Optional[ContainerSpec],
                ambient: Mapping[str, str]) -> Optional[ContainerSpec]:
    """``container`` with the agent's node-local scratch (``SHIV_ROOT``, set by the batch
    script) mounted, so shiv extracts there inside the image and never into a home."""
    if container is None or container.runtime == "none":
        return container
    scratch = ambient.get("SHIV_ROOT", "")
    if not scratch.startswith("/"):
        raise LaunchError(f"{name}: a step in image {container.image} needs SHIV_ROOT (an "
                          "absolute node-local scratch directory; the batch script sets it)")
    return with_scratch(container, scratch)


def _step(plan: Plan, name: str, argv: Sequence[str], extra: Mapping[str, str],
          ambient: Mapping[str, str], container: Optional[ContainerSpec], gpus: int,
          relative: Optional[int], task_prefix: Sequence[str] = (), nodes: int = 1) -> Launch:
    names = sorted(extra)
    container = scratch_for(name, container, ambient)
    wrapped = wrap(container, argv, names, gpus, task_prefix, inherit=plan.runtime.env_allow)
    if wrapped.srun_flags and plan.runtime.launcher != "srun":
        raise LaunchError(f"{name}: a {container.runtime if container else ''} image needs the "
                          "srun launcher")
    cmd = step_argv(plan.runtime, plan.resources, name, wrapped.argv, gpus,
                    relative=relative, flags=wrapped.srun_flags, nodes=nodes)
    env = step_env(plan.runtime, ambient, extra)
    env.update(local_devices(plan.runtime, ambient, gpus))
    return Launch(name=name, argv=tuple(cmd), env=container_env(container, env, names))


def server_name(dep: DeploymentSpec, replica: int) -> str:
    """The step (and log) name of one replica."""
    return f"server-{dep.alias}-{replica}"


def gpu_binder(plan: Plan, dep: DeploymentSpec, name: str, gpus: Sequence[int],
               agent_pyz: str) -> List[str]:
    """The ``serve`` role in front of a replica's command: ``python -I agent.pyz serve
    --gpus I,J --replica NAME [--env-prefix P] --`` ([] without GPUs). With the local
    launcher it narrows the allocation's ``CUDA_VISIBLE_DEVICES`` (set by the local
    backend) the same way it narrows a Slurm step's lists.

    It runs where the step's task runs: inside a pyxis image (``python3`` and the agent's
    path there), on the host in front of apptainer (which also needs the narrowed
    variables as ``APPTAINERENV_*``) and charliecloud.
    """
    if dep.gpus_per_replica == 0:
        return []
    if len(gpus) != dep.gpus_per_rank:
        raise LaunchError(f"{name}: the plan gives it GPUs {tuple(gpus)}, the deployment "
                          f"needs {dep.gpus_per_rank}")
    box = dep.container
    inside = task_in_image(box)
    python = IMAGE_PYTHON if inside else plan.runtime.python
    agent = in_container(agent_pyz, box, f"deployment {dep.alias}: agent") if inside \
        else agent_pyz
    argv = [python, "-I", agent, "serve", "--gpus", ",".join(str(g) for g in gpus),
            "--replica", name]
    if env_prefix(box):
        argv += ["--env-prefix", env_prefix(box)]
    return argv + ["--"]


def server_launch(plan: Plan, dep: DeploymentSpec, replica: int, site: Site, agent_pyz: str,
                  ambient: Mapping[str, str]) -> Launch:
    """Replica ``replica`` of ``dep`` serving at ``site``.

    ``--relative`` is set when the plan places the replica (``dep.placement``); a replica
    is one task on one node (the planner never splits one across nodes). A replica with
    GPUs asks for every GPU of the allocation on its node (``plan.resources.gpus``) and
    gets ``site.gpus`` of them through :func:`gpu_binder`.
    """
    if dep.nodes_per_replica > 1:
        return replica_launch(plan, dep, replica, site, agent_pyz, ambient)
    agent = in_container(agent_pyz, dep.container, f"deployment {dep.alias}: agent")
    argv = fill_placeholders(dep.command, site.host, site.port, agent)
    extra = _server_env(dep, ambient)
    relative = site.node if dep.placement else None
    name = server_name(dep, replica)
    binder = gpu_binder(plan, dep, name, site.gpus, agent_pyz)
    gpus = plan.resources.gpus if binder else dep.gpus_per_replica
    return _step(plan, name, argv, extra, ambient, dep.container, gpus, relative, binder)


def _server_env(dep: DeploymentSpec, ambient: Mapping[str, str]) -> Dict[str, str]:
    extra = dict(dep.env)
    extra.update(secret_values(dep.secret_env, ambient, f"deployment {dep.alias}"))
    return extra


# ----------------------------------------------------------------------------- ranks


def rank_binder(plan: Plan, dep: DeploymentSpec, name: str, site: Site,
                agent_pyz: str) -> List[str]:
    """The ``serve`` role of each rank of a replica across nodes: :func:`gpu_binder`'s
    argv plus ``--nnodes N --hosts H0,H1 [--follower-arg=A ...]``; each rank fills its
    ``{host}`` and ``{node_rank}`` (:mod:`agent_stdlib.allocation.serve`)."""
    if plan.runtime.launcher != "srun" or dep.gpus_per_replica == 0:
        raise LaunchError(f"{name}: a replica across {dep.nodes_per_replica} nodes needs the "
                          "srun launcher and GPUs")
    if len(site.span) != dep.nodes_per_replica or len(site.hosts) != len(site.span):
        raise LaunchError(f"{name}: the plan places it on nodes {site.span}, the deployment "
                          f"needs {dep.nodes_per_replica}")
    if list(site.span) != list(range(site.node, site.node + len(site.span))):
        raise LaunchError(f"{name}: nodes {site.span} are not consecutive (one srun step "
                          "runs every rank)")
    binder = gpu_binder(plan, dep, name, site.gpus, agent_pyz)[:-1]  # without its "--"
    binder += ["--nnodes", str(len(site.span)), "--hosts", ",".join(site.hosts)]
    return binder + [f"--follower-arg={arg}" for arg in dep.follower_args] + ["--"]


def replica_launch(plan: Plan, dep: DeploymentSpec, replica: int, site: Site,
                   agent_pyz: str, ambient: Mapping[str, str]) -> Launch:
    """Replica ``replica`` of ``dep`` across the nodes of ``site``: one step
    ``srun --relative=<leader node> --nodes=N --ntasks-per-node=1 --label`` whose tasks
    are its ranks. The agent fills ``{port}``, ``{agent}``, ``{leader_host}`` and
    ``{dist_port}``; each rank's ``serve`` role the rest."""
    agent = in_container(agent_pyz, dep.container, f"deployment {dep.alias}: agent")
    argv = fill_placeholders(dep.command, None, site.port, agent, leader_host=site.leader,
                             dist_port=site.dist_port)
    extra = _server_env(dep, ambient)
    name = server_name(dep, replica)
    binder = rank_binder(plan, dep, name, site, agent_pyz)
    return _step(plan, name, argv, extra, ambient, dep.container, plan.resources.gpus,
                 site.node, binder, nodes=len(site.span))


@dataclass(frozen=True)
class ClientPaths:
    """Host paths and facts the client contract names."""

    agent_pyz: str
    plan_json: str
    output: str
    progress_json: str
    shard: int
    record_offset: int
    num_records: int
    resume: str = ""  # an earlier attempt's output/ to continue from ("" = start clean)


def client_contract(plan: Plan, paths: ClientPaths,
                    endpoints: Mapping[str, str]) -> Dict[str, str]:
    """The ``SYNTHBATCH_*`` variables of the client step (host paths).

    ``SYNTHBATCH_ENDPOINTS`` maps each alias to its proxy's root URL (no ``/v1``: the
    readiness and metrics paths hang off it too); ``SYNTHBATCH_DEPLOYMENTS`` gives what an
    OpenAI client needs per alias: ``base_url`` (ending in ``/v1``) and ``model`` (the
    served name). With one deployment, ``SYNTHBATCH_OPENAI_BASE_URL`` and
    ``SYNTHBATCH_MODEL`` say the same without JSON.
    """
    deployments = {alias: {"base_url": openai_base_url(url),
                           "model": plan.deployment(alias).served_name}
                   for alias, url in endpoints.items()}
    return ClientEnv(endpoints=dict(endpoints), deployments=deployments,
                     shard_index=paths.shard, shard_count=len(plan.shards),
                     record_offset=paths.record_offset, num_records=paths.num_records,
                     output_dir=paths.output, progress_file=paths.progress_json,
                     resume_dir=paths.resume or None).to_environ()


def _contract_inside(contract: Dict[str, str], container: Optional[ContainerSpec]) -> None:
    """The contract's host paths (:data:`PATH_VARS`) as ``container`` sees them."""
    for var in (v for v in PATH_VARS if v in contract):
        contract[var] = in_container(contract[var], container, f"client: {var}")


def openai_base_url(endpoint: str) -> str:
    """The OpenAI-compatible base URL of a proxy endpoint: ``<endpoint>/v1``."""
    return endpoint.rstrip("/") + "/v1"


def client_launch(plan: Plan, paths: ClientPaths, endpoints: Mapping[str, str],
                  ambient: Mapping[str, str]) -> Launch:
    """The client step: built-in ``generate``, ``plan.client_command``, or the ``dd`` role
    under the client environment's Python (``plan.client_data_designer``).

    It runs on the batch node (``--relative=0`` in multi-node allocations), where the
    loopback proxies listen.
    """
    contract = client_contract(plan, paths, endpoints)
    relative = 0 if plan.resources.nodes > 1 else None
    if plan.client is not None:
        box = plan.client.container
        _contract_inside(contract, box)
        python = IMAGE_PYTHON if box is not None and box.runtime != "none" \
            else plan.runtime.python
        argv = [python, "-I", in_container(paths.agent_pyz, box, "client: agent"),
                "generate", "--plan", in_container(paths.plan_json, box, "client: plan")]
        seed = plan.client.seed_data
        if seed is not None and box is not None and box.runtime != "none":
            argv += ["--seed-data", in_container(seed.path, box, "client: seed data")]
        for run_id, folder in sorted(plan.client.reuse.items()):  # issue 31
            argv += ["--reuse", f"{run_id}={in_container(folder, box, 'client: reuse')}"]
        return _step(plan, "client", argv, contract, ambient, box, 0, relative)
    spec = plan.client_command or plan.client_data_designer
    assert spec is not None  # the Plan contract holds exactly one client
    box = spec.container
    argv = list(plan.client_command.argv) if plan.client_command is not None \
        else dd_argv(plan, paths.agent_pyz, paths.plan_json)
    _contract_inside(contract, box)
    extra = dict(spec.env)
    extra.update(secret_values(spec.secret_env, ambient, "client"))
    extra.update(contract)  # the contract wins over a same-named literal
    return _step(plan, "client", argv, extra, ambient, box, 0, relative)


def dd_argv(plan: Plan, agent_pyz: str, plan_json: str, *extra: str) -> List[str]:
    """``<client python> -I <agent> dd --plan <plan.json> [extra]`` as the client step sees
    it (paths inside the client image, when there is one)."""
    spec = plan.client_data_designer
    assert spec is not None
    box = spec.container
    return [spec.python, "-I", in_container(agent_pyz, box, "client: agent"), "dd", "--plan",
            in_container(plan_json, box, "client: plan"), *extra]


def dd_validate_launch(plan: Plan, agent_pyz: str, plan_json: str,
                       ambient: Mapping[str, str]) -> Launch:
    """The preflight step that runs ``dd --validate`` where the client step will run (same
    Python, image, env and secrets), before any server starts."""
    spec = plan.client_data_designer
    assert spec is not None
    extra = dict(spec.env)
    extra.update(secret_values(spec.secret_env, ambient, "client"))
    relative = 0 if plan.resources.nodes > 1 else None
    return _step(plan, "preflight-dd", dd_argv(plan, agent_pyz, plan_json, "--validate"),
                 extra, ambient, spec.container, 0, relative)
