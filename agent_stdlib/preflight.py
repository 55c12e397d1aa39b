"""Preflight: everything an allocation needs is checked before any server starts.

Each check raises :class:`PreflightError` with one line naming what is wrong, so the
attempt fails within a second instead of after a server has spent minutes loading a
model. Checks: scheduler identity, node list and count, GPU shape, controller Python,
every path the plan names, and the ports the servers will listen on.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from agent_stdlib.contracts import AttemptRecord, Plan
from agent_stdlib.slurmjob import JobIdentity

MIN_PYTHON = (3, 9)
PORT_SLOTS = 512  # distinct port blocks per port_base
PORT_STRIDE = 16  # ports per block (servers of one allocation)


class PreflightError(Exception):
    """The allocation cannot run this attempt; the message is one line."""


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
    host: str = "127.0.0.1"


def server_count(plan: Plan) -> int:
    """How many server processes the plan starts."""
    return sum(dep.replicas for dep in plan.deployments)


def assign_ports(base: int, key: str, count: int) -> List[int]:
    """The ports of ``count`` servers of the allocation ``key`` (deterministic per job).

    Allocations sharing a node get different blocks unless their keys collide; a
    collision is caught by the port check and fails the attempt with a clear reason.
    """
    stride = max(PORT_STRIDE, count)
    slot = int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) % PORT_SLOTS
    first = base + slot * stride
    return list(range(first, first + count))


def allocation_key(ident: JobIdentity) -> str:
    """What distinguishes this allocation's ports: the job key, or the pid outside Slurm."""
    return ident.key or f"local-{os.getpid()}"


def check_identity(ctx: Context) -> None:
    """Job id, array task id and restart count must match the attempt record."""
    ident, record = ctx.ident, ctx.attempt
    if ident.job_id is None:
        raise PreflightError("identity: SLURM_JOB_ID is not set (not inside an allocation?)")
    if record.job_id and record.job_id != ident.key and record.job_id != ident.job_id:
        raise PreflightError(f"identity: this allocation is job {ident.key}, the attempt "
                             f"record names job {record.job_id}")
    if ident.array_task_id is not None and ident.array_task_id != ctx.shard:
        raise PreflightError(f"identity: array task {ident.array_task_id} was asked to run "
                             f"shard {ctx.shard}")
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


def check_gpus(ctx: Context) -> None:
    """At least as many GPUs as the plan's steps need (a superset is fine)."""
    wanted = sum(dep.gpus_per_replica * dep.replicas for dep in ctx.plan.deployments)
    if wanted == 0:
        return
    seen = visible_gpus(ctx.env)
    if seen is None:
        raise PreflightError(f"gpus: the plan needs {wanted} GPU(s), the allocation shows "
                             "none (neither SLURM_JOB_GPUS nor CUDA_VISIBLE_DEVICES is set)")
    if len(seen) < wanted:
        raise PreflightError(f"gpus: the plan needs {wanted} GPU(s), the allocation has "
                             f"{len(seen)} ({','.join(seen) or 'none'})")


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
    for dep in ctx.plan.deployments:
        if dep.command:
            _executable(f"deployment {dep.alias}: command", dep.command[0])
        if os.path.isabs(dep.model) and not os.access(dep.model, os.R_OK):
            raise PreflightError(f"paths: deployment {dep.alias}: model {dep.model} is "
                                 "missing or not readable")


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


def check_ports(ctx: Context, ports: Sequence[int]) -> None:
    """Every server port must be valid and free on this node."""
    for port in ports:
        if not 1024 <= port <= 65535:
            raise PreflightError(f"ports: {port} is outside 1024-65535 (port_base "
                                 f"{ctx.plan.runtime.port_base} is too high)")
        if not port_free(ctx.host, port):
            node = ctx.ident.node or "this node"
            raise PreflightError(f"ports: {ctx.host}:{port} is already in use on {node}")


def run_preflight(ctx: Context) -> List[int]:
    """Run every check in order; return the server ports. Raises PreflightError."""
    if ctx.plan.runtime.launcher == "srun":
        check_identity(ctx)
        check_nodes(ctx)
    check_gpus(ctx)
    check_python()
    check_paths(ctx)
    ports = assign_ports(ctx.plan.runtime.port_base, allocation_key(ctx.ident),
                         server_count(ctx.plan))
    check_ports(ctx, ports)
    return ports
