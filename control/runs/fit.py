"""Does the request fit the cluster? Checked at plan time, from the login node.

Slurm 22.05 accepts a job that no node of its partition can run (``-c 16`` on 8-CPU
nodes, ``--mem`` above every node's RealMemory, ``--gres=gpu:8`` on 4-GPU nodes, measured
on the testbed) and leaves it ``PENDING`` with reason ``BadConstraints`` forever. So
``plan`` asks Slurm for the partition's limits (``scontrol show partition -o``) and its
nodes (``sinfo -N``) and refuses a request that no node, or not enough nodes, can hold:
naming the field that asked for it and the partition's biggest node. When Slurm cannot
be asked, plan says so (``node`` level) and goes on.

Who may use what is checked too: the request's account, QOS and reservation (``sbatch -A
bogus`` is queued and runs as the user's default account on a cluster that does not
enforce associations; ``--reservation nosuch`` is refused only by ``sbatch``), from the
accounting's associations of this user and its QOS (``sacctmgr``; on a cluster without
accounting the check says it was skipped) and ``scontrol show reservation``.
``check_request`` is the one entry ``plan``, ``submit`` and ``profile validate`` share.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.runs.checks import ERROR, NODE, OK, WARNING, Finding
from synthbatch.control.slurm.parsers import (
    Association,
    NodeShape,
    ParseError,
    PartitionLimits,
    Reservation,
    seconds_of,
)
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


def login_user() -> str:
    """The name Slurm knows this user by (its uid's)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _have(names: Sequence[str]) -> str:
    return ", ".join(sorted(set(names))) or "none"


def check_account(res: ResourceSpec, assoc: Sequence[Association], user: str,
                  where: str) -> List[Finding]:
    """The account is one of the user's associations (for this partition)."""
    account = res.account
    if not account:
        return []
    mine = [a for a in assoc if a.account == account]
    if not mine:
        return [Finding(ERROR, where, f"{account}: not an account of user {user} (have: "
                                      f"{_have([a.account for a in assoc])})")]
    if res.partition and not any(a.partition in (None, res.partition) for a in mine):
        return [Finding(ERROR, where, f"{account}: user {user}'s association with it is for "
                                      f"partition {_have([str(a.partition) for a in mine])} "
                                      f"only, not {res.partition}")]
    return [Finding(OK, where, f"{account}: an account of user {user}")]


def check_qos(res: ResourceSpec, assoc: Sequence[Association], names: Sequence[str],
              user: str, where: str) -> List[Finding]:
    """The QOS exists, and the user's associations (of the account) allow it."""
    qos = res.qos
    if not qos:
        return []
    if qos not in names:
        return [Finding(ERROR, where, f"{qos}: no such QOS on this cluster (have: "
                                      f"{_have(names)})")]
    mine = [a for a in assoc if not res.account or a.account == res.account]
    allowed = sorted({q for a in mine for q in a.qos})
    if mine and allowed and qos not in allowed:
        whose = f"account {res.account} of user {user}" if res.account else f"user {user}"
        return [Finding(ERROR, where, f"{qos}: not a QOS of {whose} (allowed: "
                                      f"{', '.join(allowed)})")]
    return [Finding(OK, where, f"{qos}: a QOS of user {user}")]


def check_reservation(res: ResourceSpec, reservations: Sequence[Reservation], user: str,
                      where: str) -> List[Finding]:
    """The reservation exists and is open to this user or the job's account."""
    name = res.reservation
    if not name:
        return []
    found = next((r for r in reservations if r.name == name), None)
    if found is None:
        return [Finding(ERROR, where, f"{name}: no such reservation (have: "
                                      f"{_have([r.name for r in reservations])})")]
    account = res.account
    denied = f"-{user}" in found.users or (account and f"-{account}" in found.accounts)
    listed = user in found.users or (account and account in found.accounts)
    open_to_all = not [u for u in found.users if not u.startswith("-")] and \
        not [a for a in found.accounts if not a.startswith("-")]
    if denied or not (listed or open_to_all):
        if not account and found.accounts and not denied:
            return [Finding(WARNING, where, f"{name}: open to account(s) "
                                            f"{', '.join(found.accounts)} only; the job's "
                                            f"default account must be one of them")]
        return [Finding(ERROR, where, f"{name}: not open to user {user}"
                                      + (f" or account {account}" if account else "")
                                      + f" (users: {', '.join(found.users) or 'any'}; "
                                      f"accounts: {', '.join(found.accounts) or 'any'})")]
    if found.state != "ACTIVE":
        return [Finding(WARNING, where, f"{name}: {found.state} until {found.start}: the run "
                                        f"waits for it")]
    return [Finding(OK, where, f"{name}: active, open to user {user}")]


def check_access(res: ResourceSpec, scheduler: Scheduler, origins: Origins,
                 user: str) -> List[Finding]:
    """Account, QOS and reservation; ``node`` level when Slurm cannot be asked."""
    found: List[Finding] = []
    if res.account or res.qos:
        where = origins.account if res.account else origins.qos
        try:
            assoc = scheduler.associations(user)
            names = scheduler.qos_names() if res.qos and assoc is not None else []
        except SchedulerUnavailable as err:
            found.append(Finding(NODE, where, f"account and QOS not checked: {err.message}"))
        else:
            if assoc is None:
                found.append(Finding(OK, where, "account and QOS not checked: this cluster "
                                                "keeps no accounting (no slurmdbd)"))
            else:
                found += check_account(res, assoc, user, origins.account)
                found += check_qos(res, assoc, names or [], user, origins.qos)
    if res.reservation:
        try:
            found += check_reservation(res, scheduler.reservations(), user,
                                       origins.reservation)
        except SchedulerUnavailable as err:
            found.append(Finding(NODE, origins.reservation,
                                 f"{res.reservation}: not checked: {err.message}"))
    return found


def check_request(res: ResourceSpec, scheduler: Scheduler, origins: Optional[Origins] = None,
                  unavailable: Optional[SchedulerUnavailable] = None,
                  user: Optional[str] = None) -> List[Finding]:
    """The request against the cluster: its partition (``check_fit``), then its account,
    QOS and reservation. The one entry of ``plan``, ``submit`` and ``profile validate``."""
    origins = origins or Origins()
    found = check_fit(res, scheduler, origins, unavailable)
    if unavailable is not None or any(f.level == NODE and f.field == origins.partition
                                      for f in found):
        return found  # Slurm did not answer: said once, by check_fit
    return found + check_access(res, scheduler, origins, user or login_user())
