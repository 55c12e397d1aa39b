"""Slurm's pending reasons that mean a shard will not start by itself (pure).

squeue's reason (``%r``) is in each pending shard's row already; a run whose shards sit
``PENDING BadConstraints`` would otherwise just say ``running`` forever. ``blocked`` groups
the shards by such a reason, with what it means and what to do; ``status`` shows it under
the headline and in ``--json`` (``blocked``).

``never``: the job cannot start as submitted (cancel it, fix the request, submit again);
otherwise it waits for something outside the run (a node back, a hold released).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from synthbatch.agent_stdlib.states import PENDING

if TYPE_CHECKING:
    from synthbatch.control.runs.status.rows import ShardRow

FIX = "cancel the run, fix the request (synthbatch plan checks it against the partition) " \
      "and submit again"
NEVER: Dict[str, str] = {
    "BadConstraints": "no node of the partition has the CPUs, memory, GPUs or features "
                      f"asked for; {FIX}",
    "PartitionConfig": "the request breaks the partition's configuration (nodes, time, "
                       f"account or QOS it does not allow); {FIX}",
    "PartitionNodeLimit": f"more nodes than the partition allows; {FIX}",
    "PartitionTimeLimit": f"the time limit is above the partition's MaxTime; {FIX}",
    "InvalidAccount": f"the account is not valid for this user or partition; {FIX}",
    "InvalidQOS": f"the QOS is not valid for this user or partition; {FIX}",
    "QOSMaxWallDurationPerJobLimit": f"the time limit is above the QOS's MaxWall; {FIX}",
    "AssocMaxWallDurationPerJobLimit": f"the time limit is above the account's MaxWall; "
                                       f"{FIX}",
    "QOSMaxGRESPerJob": f"more GPUs than the QOS allows a job; {FIX}",
    "QOSMaxCpuPerJobLimit": f"more CPUs than the QOS allows a job; {FIX}",
    "QOSMaxNodePerJobLimit": f"more nodes than the QOS allows a job; {FIX}",
    "DependencyNeverSatisfied": "a dependency can never be satisfied; cancel the run",
}
WAITS: Dict[str, str] = {
    "ReqNodeNotAvail": "a node the job needs is down, drained or reserved: it starts when "
                       "the node is back (sinfo -R says why)",
    "JobHeldAdmin": "an administrator held the job: it starts once they release it",
    "PartitionDown": "the partition is down: it starts once the partition is up",
    "PartitionInactive": "the partition is inactive: it starts once it is up",
    "NodeDown": "a node the job needs is down: it starts when the node is back",
}


def explain(reason: Optional[str]) -> Optional[Tuple[str, bool]]:
    """(what ``reason`` means and what to do, whether the job can never start), or None
    for a reason that is just the queue (Resources, Priority, ...)."""
    if not reason:
        return None
    key = reason.split(",", 1)[0].split(":", 1)[0].strip()
    if key in NEVER:
        return NEVER[key], True
    if key in WAITS:
        return WAITS[key], False
    return None


def blocked(shards: Sequence[ShardRow]) -> List[Dict[str, Any]]:
    """Pending shards grouped by a reason ``explain`` knows: reason, shards, hint, never."""
    groups: Dict[str, Dict[str, Any]] = {}
    for row in shards:
        if row.state != PENDING or not row.reason:
            continue
        known = explain(row.reason)
        if known is None:
            continue
        group = groups.setdefault(row.reason, {"reason": row.reason, "shards": [],
                                               "hint": known[0], "never": known[1]})
        group["shards"].append(row.index)
    return sorted(groups.values(), key=lambda g: (not g["never"], g["shards"][0]))


def reasons(shards: Sequence[ShardRow]) -> Dict[str, int]:
    """How many pending shards wait for each of Slurm's reasons (``None`` and ``"None"``:
    no reason given yet), most first: what the progress lines of ``wait`` show."""
    counts: Dict[str, int] = {}
    for row in shards:
        reason = row.reason
        if row.state == PENDING and reason and reason != "None":
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
