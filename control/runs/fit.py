"""Does the request fit the partition? Checked at plan time, from the login node.

Slurm 22.05 accepts a job that no node of its partition can run (``-c 16`` on 8-CPU
nodes, ``--mem`` above every node's RealMemory, ``--gres=gpu:8`` on 4-GPU nodes, measured
on the testbed) and leaves it ``PENDING`` with reason ``BadConstraints`` forever. So
``plan`` asks Slurm for the partition's limits (``scontrol show partition -o``) and its
nodes (``sinfo -N``) and refuses a request that no node, or not enough nodes, can hold:
naming the field that asked for it and the partition's biggest node. When Slurm cannot
be asked, plan says so (``node`` level) and goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.runs.checks import ERROR, NODE, OK, WARNING, Finding
from synthbatch.control.slurm.parsers import NodeShape, ParseError, PartitionLimits, seconds_of
from synthbatch.control.slurm.scheduler import Scheduler


@dataclass(frozen=True)
class Origins:
    """Which authored field each requested value came from (for the messages)."""

    partition: str = "profile: partition"
    account: str = "profile: account"
    qos: str = "profile: qos"
    reservation: str = "profile: reservation"
    constraint: str = "profile: sbatch_options.constraint"
    time_limit: str = "profile: default_time_limit"
    cpus: str = "profile: cpus_per_task"
    mem_mb: str = "profile: mem_mb"
    gpus: str = "deployments (GPUs per node)"
    nodes: str = "deployments (nodes)"


def _shape(node: NodeShape) -> str:
    return f"{node.name}: {node.cpus} CPUs, {node.mem_mb} MB, {node.gpus} GPUs"


def _biggest(nodes: Sequence[NodeShape], key: str) -> NodeShape:
    return max(nodes, key=lambda n: (getattr(n, key), n.cpus, n.mem_mb, n.gpus))


def fits(node: NodeShape, res: ResourceSpec) -> bool:
    """True when one node has everything one node of the job asks for."""
    return node.cpus >= res.cpus and node.mem_mb >= res.mem_mb and node.gpus >= res.gpus


def _dimensions(res: ResourceSpec, limits: PartitionLimits, nodes: Sequence[NodeShape],
                origins: Origins) -> List[Finding]:
    """One error per requested amount that even the biggest node lacks."""
    found = []
    name = limits.name
    for key, unit, wanted, where in (("cpus", "CPUs", res.cpus, origins.cpus),
                                     ("mem_mb", "MB", res.mem_mb, origins.mem_mb),
                                     ("gpus", "GPUs", res.gpus, origins.gpus)):
        top = _biggest(nodes, key)
        if wanted > getattr(top, key):
            found.append(Finding(ERROR, where, f"{wanted} {unit} per node, but the biggest "
                                               f"node of partition {name} has "
                                               f"{getattr(top, key)} ({_shape(top)}); Slurm "
                                               f"would keep the job pending (BadConstraints)"))
    if limits.max_cpus_per_node is not None and res.cpus > limits.max_cpus_per_node:
        found.append(Finding(ERROR, origins.cpus, f"{res.cpus} CPUs per node, above partition "
                                                  f"{name}'s MaxCPUsPerNode "
                                                  f"{limits.max_cpus_per_node}"))
    if limits.max_mem_per_node_mb is not None and res.mem_mb > limits.max_mem_per_node_mb:
        found.append(Finding(ERROR, origins.mem_mb, f"{res.mem_mb} MB per node, above "
                                                    f"partition {name}'s MaxMemPerNode "
                                                    f"{limits.max_mem_per_node_mb} MB"))
    return found


def _limits(res: ResourceSpec, limits: PartitionLimits, origins: Origins) -> List[Finding]:
    found = []
    name = limits.name
    most = min(n for n in (limits.total_nodes, limits.max_nodes) if n is not None)
    if res.nodes > most:
        found.append(Finding(ERROR, origins.nodes, f"{res.nodes} nodes per shard, but "
                                                   f"partition {name} has {most} at most"))
    try:
        asked = seconds_of(res.time_limit)
    except ParseError:
        asked = None
    if asked is not None and limits.max_time_s is not None and asked > limits.max_time_s:
        found.append(Finding(ERROR, origins.time_limit, f"time limit {res.time_limit} is above "
                                                        f"partition {name}'s MaxTime "
                                                        f"({limits.max_time_s // 60} min)"))
    for value, allowed, where, what in ((res.account, limits.allow_accounts, origins.account,
                                         "AllowAccounts"),
                                        (res.qos, limits.allow_qos, origins.qos, "AllowQos")):
        if value and allowed is not None and value not in allowed:
            found.append(Finding(ERROR, where, f"{value} is not in partition {name}'s {what} "
                                               f"({', '.join(allowed)})"))
    for value, denied, where, what in ((res.account, limits.deny_accounts, origins.account,
                                        "DenyAccounts"),
                                       (res.qos, limits.deny_qos, origins.qos, "DenyQos")):
        if value and value in denied:
            found.append(Finding(ERROR, where, f"{value} is in partition {name}'s {what} "
                                               f"({', '.join(denied)})"))
    if limits.state != "UP":
        found.append(Finding(WARNING, origins.partition, f"partition {name} is {limits.state}: "
                                                         f"jobs wait until it is UP"))
    return found


FEATURE_SPLIT = re.compile(r"[&|,()\[\]]")
COUNT = re.compile(r"\*\d+$")


def feature_names(constraint: str) -> List[str]:
    """The feature names of a ``--constraint`` expression (``a&b``, ``a|b``, ``[a*2&b]``)."""
    names = (COUNT.sub("", part).strip() for part in FEATURE_SPLIT.split(constraint))
    return sorted({n for n in names if n})


def conjunction(constraint: str) -> bool:
    """True for ``a``, ``a&b`` or ``a,b``: every node must have every feature."""
    return not re.search(r"[|()\[\]*]", constraint)


def check_constraint(constraint: str, partition: str, features: Dict[str, Tuple[str, ...]],
                     nodes: int, where: str) -> List[Finding]:
    """Each feature of the constraint is on some node of the partition (Slurm refuses an
    unknown feature, and keeps a job pending for ever whose features no node has)."""
    have = sorted({f for node in features.values() for f in node})
    missing = [n for n in feature_names(constraint) if n not in have]
    if missing:
        return [Finding(ERROR, where, f"{constraint}: feature {', '.join(missing)} is on no "
                                      f"node of partition {partition} (have: "
                                      f"{', '.join(have) or 'none'})")]
    if conjunction(constraint):
        wanted = set(feature_names(constraint))
        with_all = sorted(n for n, f in features.items() if wanted <= set(f))
        if len(with_all) < nodes:
            return [Finding(ERROR, where, f"{constraint}: {len(with_all)} node(s) of "
                                          f"partition {partition} have every feature "
                                          f"({', '.join(with_all) or 'none'}); the job "
                                          f"needs {nodes}")]
    return [Finding(OK, where, f"{constraint}: features found on partition {partition}'s "
                               f"nodes")]


def _partitions(scheduler: Scheduler) -> str:
    """`` (have: a, b)``: the cluster's partitions, when sinfo says."""
    try:
        names = sorted({p.name for p in scheduler.partitions()})
    except SchedulerUnavailable:
        return ""
    return f" (have: {', '.join(names) or 'none'})"


def check_fit(res: ResourceSpec, scheduler: Scheduler, origins: Optional[Origins] = None,
              unavailable: Optional[SchedulerUnavailable] = None) -> List[Finding]:
    """The request against its partition; ``node`` level when Slurm cannot be asked
    (``unavailable``: an earlier query of this plan already found it so)."""
    origins = origins or Origins()
    try:
        if unavailable is not None:
            raise unavailable
        limits = scheduler.partition_limits(res.partition)
        if limits is None:
            what = f"partition {res.partition} does not exist on this cluster" \
                if res.partition else "no partition is set and the cluster has no default one"
            return [Finding(ERROR, origins.partition, what + _partitions(scheduler))]
        nodes = scheduler.partition_nodes(limits.name)
    except SchedulerUnavailable as err:
        hint = f" (hint: {err.hint})" if err.hint else ""
        return [Finding(NODE, origins.partition, f"resources not checked against the "
                                                 f"partition: {err.message}{hint}")]
    found = _limits(res, limits, origins)
    if not nodes:
        return found + [Finding(ERROR, origins.partition, f"partition {limits.name} has no "
                                                          f"nodes")]
    found += _dimensions(res, limits, nodes, origins)
    constraint = res.options.get("constraint")
    if constraint:
        try:
            features = scheduler.node_features(limits.name)
        except SchedulerUnavailable as err:
            features = None
            found.append(Finding(NODE, origins.constraint, f"constraint {constraint!r} not "
                                                           f"checked: {err.message}"))
        if features is not None:
            found += check_constraint(constraint, limits.name, features, res.nodes,
                                      origins.constraint)
            if conjunction(constraint):  # only nodes with every feature can run it
                wanted = set(feature_names(constraint))
                nodes = [n for n in nodes if wanted <= set(features.get(n.name, ()))]
    fitting = [n for n in nodes if fits(n, res)]
    if not any(f.level == ERROR for f in found) and len(fitting) < res.nodes:
        found.append(Finding(ERROR, origins.partition, f"no {res.nodes} node(s) of partition "
                                                       f"{limits.name} have {res.cpus} CPUs, "
                                                       f"{res.mem_mb} MB and {res.gpus} GPUs "
                                                       f"at once (biggest: "
                                                       f"{_shape(_biggest(nodes, 'cpus'))})"))
    usable = [n for n in fitting if n.usable]
    if fitting and len(usable) < res.nodes:
        states = ", ".join(f"{n.name} {n.state}" for n in fitting)
        found.append(Finding(WARNING, origins.partition, f"the nodes that fit are not taking "
                                                         f"jobs now ({states}): the run waits"))
    if not any(f.level in (ERROR, WARNING) for f in found):
        found.append(Finding(OK, origins.partition, f"{len(fitting)} of {len(nodes)} node(s) "
                                                    f"of partition {limits.name} fit {res.cpus} "
                                                    f"CPUs, {res.mem_mb} MB, {res.gpus} GPUs"))
    return found
