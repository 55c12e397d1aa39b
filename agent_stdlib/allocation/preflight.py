"""Preflight: everything an allocation needs is checked before any server starts.

Each check raises :class:`PreflightError` with one line naming what is wrong, so the
attempt fails within a second instead of after a server has spent minutes loading a
model. Checks: scheduler identity, node list and count, GPUs (this node's cover the
highest GPU index the plan uses on a node; :func:`replica_slots` is the one rule for each
replica's node, port offset and GPU indices), controller Python,
every path the plan names (on the batch node here, on every other replica node through
:mod:`agent_stdlib.allocation.nodecheck`; the recipe's seed data is read through when the
login node could not see it at plan time), secrets (by name), container images (sha256), a
Data Designer config (``dd --validate`` where the client will run), the address
of every node that runs a replica, and the ports the servers will listen on.

Ports (one rule, :func:`plan_sites`): replica *k* has the plan's offset
``placement.port - port_base`` (its index in the allocation when the plan has no
placement). In an ``exclusive`` allocation it listens on the plan's port exactly; on
nodes that other jobs may share it listens on ``port_base + block(raw job id) + offset``,
so that concurrent allocations on one node do not race for the same port. Either way a
port that is taken fails preflight, naming it.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..containers import DEFAULT_EXECUTABLE, SCRATCH_MOUNT
from ..contracts import (
    DIST_PORTS,
    MIN_PYTHON,
    PORT_SLOTS,
    PORT_STRIDE,
    AttemptRecord,
    ContainerSpec,
    Plan,
    dd_check_report,
)
from ..recipe.seeds import SeedError, scan
from . import nodecheck, slurmjob
from .errors import LaunchError, PreflightError
from .imagehash import cached_sha256
from .launch import (
    LOOPBACK,
    Site,
    dd_validate_launch,
    in_container,
    secret_values,
)
from .slurmjob import JobIdentity
from .steps import COMMAND_TIMEOUT_S

CONNECT_S = 0.5  # a remote port is taken when something accepts within this
DD_CHECK_TIMEOUT_S = 300.0  # importing Data Designer from a cold shared filesystem is slow



@dataclass(frozen=True)
class Context:
    """Everything preflight looks at (injected, so tests need no allocation)."""

    plan: Plan
    shard: int
    attempt: AttemptRecord
    ident: JobIdentity
    env: Mapping[str, str]
    plan_json: Path
    agent_pyz: Path
    writable: Sequence[Path]
    host: str = LOOPBACK
    array_task: Optional[int] = None  # the array task id that runs ``shard``
    hash_cache: Optional[Path] = None  # the run's image-hashes/ folder (None: always hash)


def assign_ports(base: int, key: str, count: int) -> List[int]:
    """The ports of ``count`` servers of the allocation ``key`` (deterministic per job).

    A numeric key (a raw job id) picks block ``id % PORT_SLOTS``, so concurrent jobs get
    different blocks; any other key is hashed. A collision left is caught by the port
    check and fails the attempt with a clear reason.
    """
    stride = max(PORT_STRIDE, count)
    if key.isdigit():
        slot = int(key) % PORT_SLOTS
    else:
        slot = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % PORT_SLOTS
    first = base + slot * stride
    return list(range(first, first + count))


def allocation_key(ident: JobIdentity) -> str:
    """What distinguishes this allocation's ports: the raw job id, or the pid outside Slurm.

    Raw ids of jobs that run at the same time are distinct and mostly consecutive, so
    their port blocks (:func:`assign_ports`) differ unless the ids are 512 apart.
    """
    return ident.job_id or ident.key or f"local-{os.getpid()}"


def check_identity(ctx: Context) -> None:
    """Job id, array task id and restart count must match the attempt record."""
    ident, record = ctx.ident, ctx.attempt
    if ident.job_id is None:
        raise PreflightError("identity: SLURM_JOB_ID is not set (not inside an allocation?)")
    if record.job_id and record.job_id != ident.key and record.job_id != ident.job_id:
        raise PreflightError(f"identity: this allocation is job {ident.key}, the attempt "
                             f"record names job {record.job_id}")
    task = ctx.shard if ctx.array_task is None else ctx.array_task
    if ident.array_task_id is not None and ident.array_task_id != task:
        raise PreflightError(f"identity: array task {ident.array_task_id} was asked to run "
                             f"shard {ctx.shard} (array task {task})")
    if ident.restart_count < record.restarts:
        raise PreflightError(f"identity: SLURM_RESTART_COUNT={ident.restart_count} is behind "
                             f"the attempt's {record.restarts} restarts (stale allocation?)")


def check_nodes(ctx: Context) -> None:
    """The node count must be what the plan asked for, with a node list."""
    wanted = ctx.plan.resources.nodes
    if ctx.ident.num_nodes != wanted:
        raise PreflightError(f"nodes: the plan needs {wanted} node(s), the allocation has "
                             f"{ctx.ident.num_nodes} (SLURM_JOB_NUM_NODES)")
    if not ctx.ident.nodelist or not ctx.ident.node:
        raise PreflightError("nodes: SLURM_JOB_NODELIST or SLURMD_NODENAME is not set")


def visible_gpus(env: Mapping[str, str]) -> Optional[List[str]]:
    """GPU ids the allocation exposes (SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES)."""
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is not None:
            return [g for g in value.split(",") if g.strip() and g.strip() != "NoDevFiles"]
    return None


def gpu_indices(plan: Plan) -> Dict[int, List[int]]:
    """Allocation node -> the GPU indices the plan's replicas use there (sorted).

    PreflightError when a replica's placement does not name as many GPUs as its
    deployment needs per replica, or when two replicas share a GPU index of one node.
    """
    per_node: Dict[int, Dict[int, str]] = {}  # node -> GPU index -> the replica using it
    for dep, row in zip(plan.deployments, replica_slots(plan)):
        if dep.gpus_per_replica == 0:
            continue
        for replica, slot in enumerate(row):
            who = f"deployment {dep.alias} replica {replica}"
            if len(slot.nodes) != dep.nodes_per_replica:
                raise PreflightError(f"gpus: {who}: the plan places it on nodes "
                                     f"{_ids(slot.nodes)}, it spans {dep.nodes_per_replica}")
            if len(slot.gpus) != dep.gpus_per_rank:
                each = " on each node" if dep.nodes_per_replica > 1 else ""
                raise PreflightError(f"gpus: {who}: the plan gives it GPU indices "
                                     f"{_ids(slot.gpus) or 'none'}{each}, it needs "
                                     f"{dep.gpus_per_rank}")
            for node in slot.nodes:
                used = per_node.setdefault(node, {})
                for gpu in slot.gpus:
                    if gpu in used:
                        raise PreflightError(f"gpus: {who} and {used[gpu]} both have GPU "
                                             f"{gpu} of node {node} in the plan")
                    used[gpu] = who
    return {node: sorted(gpus) for node, gpus in per_node.items()}


def _ids(items: Sequence[object]) -> str:
    return ",".join(str(i) for i in items)


def check_gpus(ctx: Context) -> None:
    """This node's GPUs must cover the highest GPU index the plan uses on any node (a
    superset is fine).

    The batch step sees its own node's GPUs only; Slurm grants every node of the job the
    same per-node count, so this node stands for all of them. Each server step checks its
    own node's list again before its engine starts (:mod:`agent_stdlib.allocation.serve`).
    """
    per_node = gpu_indices(ctx.plan)
    if not per_node:
        return
    node, used = max(per_node.items(), key=lambda item: (item[1][-1], -item[0]))
    wanted = used[-1] + 1
    where = " per node" if len(per_node) > 1 else ""
    detail = f"; the plan gives node {node} GPU indices {_ids(used)}"
    seen = visible_gpus(ctx.env)
    if seen is None:
        raise PreflightError(f"gpus: the plan needs {wanted} GPU(s){where}, the allocation "
                             "shows none (neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES is "
                             f"set){detail}")
    if len(seen) < wanted:
        raise PreflightError(f"gpus: the plan needs {wanted} GPU(s){where}, the allocation has "
                             f"{len(seen)} ({_ids(seen) or 'none'}){detail}")


def check_python() -> None:
    """The controller's Python must be new enough for the agent."""
    if sys.version_info[:2] < MIN_PYTHON:
        raise PreflightError(f"python: the agent needs Python >= 3.9, this is "
                             f"{sys.version.split()[0]} ({sys.executable})")


def _executable(what: str, name: str) -> None:
    if os.sep in name:
        if not (os.path.isfile(name) and os.access(name, os.X_OK)):
            raise PreflightError(f"paths: {what} {name} is missing or not executable")
    elif shutil.which(name) is None:
        raise PreflightError(f"paths: {what} {name!r} is not on PATH")


def check_paths(ctx: Context) -> None:
    """Every file the plan names is readable, every directory the agent writes writable."""
    for path in (ctx.plan_json, ctx.agent_pyz):
        if not os.access(path, os.R_OK):
            raise PreflightError(f"paths: {path} is missing or not readable")
    for folder in ctx.writable:
        if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            raise PreflightError(f"paths: {folder} is missing or not writable")
    if ctx.plan.runtime.launcher == "srun":
        _executable("launcher", "srun")
    _executable("client python", ctx.plan.runtime.python)
    command = ctx.plan.client_command
    if command is not None and command.container is None and command.argv:
        _executable("client command", command.argv[0])
    dd = ctx.plan.client_data_designer
    if dd is not None and dd.container is None:  # in an image it is the image's business
        _executable("client python", dd.python)
        config = dd.config.rpartition(":")[0] or dd.config
        if not os.access(config, os.R_OK):
            raise PreflightError(f"paths: client: Data Designer config {config} is missing "
                                 "or not readable")
    for dep in ctx.plan.deployments:
        if dep.command and dep.container is None:  # in an image it is the image's business
            _executable(f"deployment {dep.alias}: command", dep.command[0])
        if os.path.isabs(dep.model) and not os.access(dep.model, os.R_OK):
            raise PreflightError(f"paths: deployment {dep.alias}: model {dep.model} is "
                                 "missing or not readable")
    check_seed_data(ctx.plan)


def check_seed_data(plan: Plan) -> None:
    """The recipe's seed file is there; read through once when the login node could not
    see it at plan time (``rows`` 0), naming file and line of the first bad row."""
    seed = plan.client.seed_data if plan.client is not None else None
    if seed is None:
        return
    if seed.rows and os.access(seed.path, os.R_OK):
        return  # checked at plan time; the generator notices a changed row count
    try:
        scan(seed.path, validate=True, required=seed.fields)
    except SeedError as err:
        raise PreflightError(f"paths: seed data: {err}") from err


def port_free(host: str, port: int) -> bool:
    """True if a server could listen on ``host:port`` now (SO_REUSEADDR, like servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def port_taken_remote(host: str, port: int) -> bool:
    """True if something accepts connections on ``host:port`` (another node's port)."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_S):
            return True
    except OSError:
        return False


def _check_port(ctx: Context, site: Site, node: Optional[str], local: bool) -> None:
    if not 1024 <= site.port <= 65535:
        raise PreflightError(f"ports: {site.port} is outside 1024-65535 (port_base "
                             f"{ctx.plan.runtime.port_base} is too high)")
    taken = not port_free(site.host, site.port) if local else \
        port_taken_remote(site.host, site.port)
    if taken:
        raise PreflightError(f"ports: {site.host}:{site.port} is already in use on "
                             f"{node or 'this node'}")


def check_secrets(ctx: Context) -> None:
    """Every secret a step needs is set in the job's environment (named, never shown)."""
    try:
        for dep in ctx.plan.deployments:
            secret_values(dep.secret_env, ctx.env, f"deployment {dep.alias}")
        secret_values(ctx.plan.client_secret_env, ctx.env, "client")
    except LaunchError as err:
        raise PreflightError(f"secrets: {err}") from err


def _containers(plan: Plan) -> Iterator[Tuple[str, ContainerSpec]]:
    for dep in plan.deployments:
        if dep.container is not None and dep.container.runtime != "none":
            yield f"deployment {dep.alias}", dep.container
    box = plan.client_container
    if box is not None and box.runtime != "none":
        yield "client", box


def _readable_image(path: str) -> bool:
    """A sealed image file, or an image directory (charliecloud), that can be read."""
    if os.path.isdir(path):
        return os.access(path, os.R_OK | os.X_OK)
    return os.path.isfile(path) and os.access(path, os.R_OK)


def missing_mount_point(box: ContainerSpec) -> Optional[str]:
    """The first bind target a charliecloud image directory lacks (None if it has all).

    ch-run 0.31 mounts the image read-only and binds only onto directories that exist in
    it ("can't mkdir: ... Read-only file system"); a SquashFS image is not looked into.
    """
    if box.runtime != "charliecloud" or not os.path.isdir(box.path):
        return None
    for target in [m.container for m in box.mounts] + [SCRATCH_MOUNT]:
        if not os.path.isdir(os.path.join(box.path, target.lstrip("/"))):
            return target
    return None


def _runtime_problem(box: ContainerSpec, exe: str, env: Mapping[str, str]) -> Optional[str]:
    """Why the runtime cannot run steps here as :mod:`agent_stdlib.containers` wraps them."""
    if box.runtime != "charliecloud":
        return None
    if not env.get("USER"):
        return "ch-run needs $USER, which is not set in the job environment"
    try:
        done = subprocess.run([exe, "--feature=extglob"], env=dict(env), capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{exe} --feature=extglob did not run ({err})"
    if done.returncode != 0:
        return (f"{exe} has no extglob support (--feature=extglob), so --unset-env cannot "
                "keep only the step's own variables")
    return None


def check_images(ctx: Context, hashed: Optional[Dict[str, str]] = None) -> None:
    """Each image exists and matches its pinned digest (each image hashed once); the
    runtime's binary is executable and can wrap steps; the run directory is visible
    inside the container; a charliecloud image directory has every mount point."""
    hashed = {} if hashed is None else hashed
    checked: Dict[str, Optional[str]] = {}
    for owner, box in _containers(ctx.plan):
        where = f"images: {owner}: image {box.image} ({box.path})"
        if not _readable_image(box.path):
            raise PreflightError(f"{where} is missing or not readable")
        if not ctx.env.get("SHIV_ROOT", "").startswith("/"):
            raise PreflightError(f"images: {owner}: SHIV_ROOT (the node-local scratch "
                                 "mounted into images) is not an absolute path")
        if box.path not in hashed:
            try:
                hashed[box.path] = cached_sha256(box.path, ctx.hash_cache)
            except OSError as err:
                raise PreflightError(f"{where}: {err.strerror or err}") from err
        if hashed[box.path] != box.sha256:
            raise PreflightError(f"{where}: sha256 {hashed[box.path]} does not match the "
                                 f"pinned {box.sha256}")
        if box.runtime in DEFAULT_EXECUTABLE:
            exe = box.executable or DEFAULT_EXECUTABLE[box.runtime]
            _executable(f"{owner}: container runtime", exe)
            if exe not in checked:
                checked[exe] = _runtime_problem(box, exe, ctx.env)
            if checked[exe]:
                raise PreflightError(f"images: {owner}: {checked[exe]}")
        target = missing_mount_point(box)
        if target is not None:
            raise PreflightError(f"{where} has no directory {target} to mount onto "
                                 "(ch-run binds only onto directories the image has)")
        try:
            in_container(str(ctx.agent_pyz), box, f"{owner}: agent")
            for folder in ctx.writable:
                in_container(str(folder), box, f"{owner}: run path")
        except LaunchError as err:
            raise PreflightError(f"images: {err}") from err


def check_data_designer(ctx: Context) -> None:
    """The Data Designer config passes the adapter's own checks where the client will run
    (``dd --validate`` as a step: the client's Python, image, env): installation, config,
    model aliases, seed dataset. One PreflightError naming every problem."""
    if ctx.plan.client_data_designer is None:
        return
    try:
        launch = dd_validate_launch(ctx.plan, str(ctx.agent_pyz), str(ctx.plan_json), ctx.env)
    except LaunchError as err:
        raise PreflightError(f"data designer: {err}") from err
    try:
        done = subprocess.run(list(launch.argv), env=launch.env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=DD_CHECK_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise PreflightError(f"data designer: the config check did not run ({err})") from err
    problems, _ = dd_check_report(done.stdout, done.stderr, done.returncode)
    if problems:
        raise PreflightError("data designer: " + "; ".join(problems))


def _resolve(addr: str) -> Optional[str]:
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def node_hosts(ctx: Context, needed: Sequence[int]) -> Dict[int, Tuple[str, str]]:
    """Node index -> (node name, address servers there bind and the proxy reaches).

    The node the agent runs on gets loopback. Any other node's address is its
    ``NodeAddr`` from ``scontrol show node`` (the node name if none), resolved to IPv4;
    the order of nodes is ``scontrol show hostnames $SLURM_JOB_NODELIST`` (``--relative``).
    """
    me = ctx.ident.node or "this node"
    if ctx.plan.runtime.launcher != "srun" or set(needed) <= {0}:
        return {index: (me, ctx.host) for index in {0, *needed}}  # local: one machine
    names = slurmjob.allocation_nodes(ctx.ident.nodelist or "")
    if not names:
        raise PreflightError(f"hosts: cannot list the nodes of {ctx.ident.nodelist!r} "
                             "(scontrol show hostnames)")
    missing = [i for i in needed if i >= len(names)]
    if missing:
        raise PreflightError(f"hosts: the plan places replicas on node {missing[0]}, the "
                             f"allocation has {len(names)} node(s)")
    remote = [names[i] for i in needed if names[i] != ctx.ident.node]
    addrs = slurmjob.node_addrs(remote)
    out: Dict[int, Tuple[str, str]] = {}
    for index in sorted(set(needed)):
        name = names[index]
        if name == ctx.ident.node:
            out[index] = (name, ctx.host)
            continue
        addr = _resolve(addrs.get(name, name))
        if addr is None:
            raise PreflightError(f"hosts: cannot resolve node {name} (NodeAddr "
                                 f"{addrs.get(name, 'unknown')})")
        out[index] = (name, addr)
    return out


class Slot(NamedTuple):
    """One replica as the plan gives it: node index, port offset, GPU indices there; for a
    replica across nodes also every node it spans and its rank ports' offset."""

    node: int
    offset: int
    gpus: Tuple[int, ...]
    span: Tuple[int, ...] = ()  # () for one node; see ``nodes``
    dist_offset: int = -1  # -1: no rank ports

    @property
    def nodes(self) -> Tuple[int, ...]:
        """The nodes this replica runs on, leader first."""
        return self.span or (self.node,)


def replica_slots(plan: Plan) -> List[List[Slot]]:
    """Per deployment, per replica: its :class:`Slot` (pure).

    A placed replica has its placement's node, port and GPUs. A replica without one (a
    plan built without placement) runs on node 0, with its index in the allocation as
    port offset and the next contiguous GPU indices of node 0, as the planner would.
    """
    out: List[List[Slot]] = []
    running = 0
    next_gpu: Dict[int, int] = {}
    for dep in plan.deployments:
        row = []
        for replica in range(dep.replicas):
            if replica < len(dep.placement):
                spec = dep.placement[replica]
                base = plan.runtime.port_base
                slot = Slot(spec.node, spec.port - base, spec.gpus, spec.nodes,
                            spec.dist_port - base if spec.dist_port else -1)
            else:
                first = next_gpu.get(0, 0)
                slot = Slot(0, running, tuple(range(first, first + dep.gpus_per_replica)))
            if slot.gpus:
                next_gpu[slot.node] = max(next_gpu.get(slot.node, 0), max(slot.gpus) + 1)
            row.append(slot)
            running += 1
        out.append(row)
    return out


def port_block(plan: Plan, key: str) -> int:
    """The first port of this allocation's block (see the module docstring)."""
    base = plan.runtime.port_base
    if "exclusive" in plan.resources.options:
        return base
    offsets = [max(slot.offset, slot.dist_offset + DIST_PORTS - 1)
               for row in replica_slots(plan) for slot in row]
    return assign_ports(base, key, max(offsets, default=0) + 1)[0]


def leader_addrs(ctx: Context, hosts: Mapping[int, Tuple[str, str]],
                 leaders: Sequence[int]) -> Dict[int, str]:
    """Node index -> the address the other ranks of a replica across nodes reach its leader
    at: the node's own address from :func:`node_hosts`, except for the agent's node, whose
    servers bind loopback (for the proxy) while the other ranks need its ``NodeAddr``."""
    own = [i for i in set(leaders) if hosts[i][0] == ctx.ident.node
           and ctx.plan.runtime.launcher == "srun"]
    out = {i: hosts[i][1] for i in set(leaders) if i not in own}
    if own:
        addrs = slurmjob.node_addrs([hosts[i][0] for i in own])
        for i in own:
            name = hosts[i][0]
            addr = _resolve(addrs.get(name, name))
            if addr is None:
                raise PreflightError(f"hosts: cannot resolve node {name} (NodeAddr "
                                     f"{addrs.get(name, 'unknown')}) for the ranks on other "
                                     "nodes")
            out[i] = addr
    return out


def plan_sites(plan: Plan, key: str, hosts: Mapping[int, Tuple[str, str]],
               leaders: Optional[Mapping[int, str]] = None) -> Dict[str, List[Site]]:
    """Alias -> the site of each replica, in replica order (pure). A replica across nodes
    also gets every node's address and its leader's (``leaders``, else its own address)."""
    block = port_block(plan, key)
    out: Dict[str, List[Site]] = {}
    for dep, row in zip(plan.deployments, replica_slots(plan)):
        sites = out.setdefault(dep.alias, [])
        for slot in row:
            site = Site(node=slot.node, host=hosts[slot.node][1], port=block + slot.offset,
                        gpus=slot.gpus)
            if slot.span:
                site = dataclasses.replace(
                    site, span=slot.span, hosts=tuple(hosts[n][1] for n in slot.span),
                    leader=(leaders or {}).get(slot.node, site.host),
                    dist_port=block + slot.dist_offset)
            sites.append(site)
    return out


def check_sites(ctx: Context, sites: Mapping[str, Sequence[Site]],
                hosts: Mapping[int, Tuple[str, str]]) -> None:
    """Every replica's port is free: bound locally, connected to on other nodes; for a
    replica across nodes also on every other node it spans, and its leader's rank ports."""
    for group in sites.values():
        for site in group:
            name = hosts[site.node][0]
            local = site.node == 0 or name == ctx.ident.node
            _check_port(ctx, site, name, local=local)
            for node, addr in zip(site.span[1:], site.hosts[1:]):
                follower = hosts[node][0]
                _check_port(ctx, Site(node, addr, site.port), follower,
                            local=follower == ctx.ident.node)
            if site.span:  # the ranks' rendezvous ports, on the leader
                for port in range(site.dist_port, site.dist_port + DIST_PORTS):
                    _check_port(ctx, Site(site.node, site.leader, port), name, local=local)


def run_preflight(ctx: Context) -> Dict[str, List[Site]]:
    """Run every check in order; return each alias's replica sites. Raises PreflightError."""
    srun = ctx.plan.runtime.launcher == "srun"
    if srun or ctx.ident.job_id:  # Slurm, or the local backend's supervisor
        check_identity(ctx)
    if srun:
        check_nodes(ctx)
    check_gpus(ctx)
    check_python()
    check_paths(ctx)
    check_secrets(ctx)
    check_images(ctx)
    check_data_designer(ctx)
    slots = [slot for row in replica_slots(ctx.plan) for slot in row]
    needed = sorted({node for slot in slots for node in slot.nodes})
    hosts = node_hosts(ctx, needed)
    if ctx.plan.runtime.launcher == "srun":
        problem = nodecheck.check_remote(ctx.plan, str(ctx.agent_pyz), ctx.env,
                                         {i: name for i, (name, _) in hosts.items()})
        if problem:
            raise PreflightError(problem)
    leaders = leader_addrs(ctx, hosts, [slot.node for slot in slots if slot.span])
    sites = plan_sites(ctx.plan, allocation_key(ctx.ident), hosts, leaders)
    check_sites(ctx, sites, hosts)
    return sites
