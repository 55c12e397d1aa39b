"""One rank of a replica across nodes: who it is, what it runs, how its end is told.

A replica across N nodes is one ``srun --nodes=N --ntasks-per-node=1 --kill-on-bad-exit=1
--label`` step (:func:`agent_stdlib.allocation.launch.replica_launch`); each task runs the
``serve`` role (:mod:`agent_stdlib.allocation.serve`), which binds its node's GPUs and
then, here, takes its rank from ``SLURM_NODEID`` (:func:`rank_of`), fills ``{host}`` and
``{node_rank}`` (:func:`rank_argv`) and runs the engine as its child, signals forwarded
(:func:`run_rank`). Whenever the engine ends by itself, with any status, the role prints
one :func:`exit_line` and exits non-zero (:data:`EXIT_RANK_ENDED` for status 0), so that
Slurm ends every other rank too: measured on 22.05, a task that exits 0 leaves the rest of
the step running. The agent finds the earliest such line in the step's log
(:func:`first_rank_exit`) and names that rank, its node and its last lines.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence

from ..errors import AgentError
from ..text import visible
from .launch import fill_placeholders
from .reasons import cause, ended
from .supervisor import die_with_parent

EXIT_NOT_FOUND = 127  # the engine executable could not be run (as a shell reports it)
EXIT_RANK_ENDED = 70  # sysexits EX_SOFTWARE: a rank's engine ended with 0 while serving
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)
# srun --label puts "<task>: " before each line of a task (padded to the widest task id).
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_EXIT = re.compile(r"serve: replica (?P<replica>\S+) of (?P<node>[^,\s]+), rank (?P<rank>\d+) "
                   r"of (?P<nnodes>\d+): (?P<what>the engine .*) \((?P<at>[0-9T:.Z-]+)\); "
                   r"the replica ends")
_SRUN = re.compile(r"srun: error: (?P<node>\S+): task (?P<rank>\d+): (?P<what>.+)$")


class RankError(AgentError, ValueError):
    """The step is not one task on each node of the replica."""


def rank_of(env: Mapping[str, str], nnodes: int) -> int:
    """This task's rank in a replica of ``nnodes`` nodes: ``SLURM_NODEID``, its node's
    index in the step (measured on 22.05: ``--relative=1 --nodes=2`` gives node2 0 and
    node3 1). RankError unless the step has one task on each of exactly ``nnodes`` nodes."""
    node_id, proc_id = env.get("SLURM_NODEID", ""), env.get("SLURM_PROCID", "")
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or ""
    if not (node_id.isdigit() and proc_id.isdigit() and nodes.isdigit()):
        raise RankError("this step does not say which node it is (SLURM_NODEID, "
                        "SLURM_PROCID, SLURM_STEP_NUM_NODES)")
    if int(nodes) != nnodes:
        raise RankError(f"the replica spans {nnodes} nodes, this step runs on {nodes}")
    if node_id != proc_id:
        raise RankError(f"task {proc_id} runs on the step's node {node_id}: one task per node "
                        "is needed")
    return int(node_id)


def rank_argv(command: Sequence[str], hosts: Sequence[str], rank: int,
              follower_args: Sequence[str]) -> List[str]:
    """The engine argv of ``rank``: ``{host}`` is its node's address, ``{node_rank}`` the
    rank; ranks > 0 append ``follower_args`` (vLLM's ``--headless``) (pure)."""
    argv = fill_placeholders(command, hosts[rank], None, None, node_rank=rank)
    return argv + (list(follower_args) if rank else [])


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"


class RankId(NamedTuple):
    """One rank of one replica, as its lines name it."""

    replica: str
    node: str
    rank: int
    nnodes: int

    @property
    def where(self) -> str:
        """``node2, rank 1 of 2``."""
        return f"{self.node}, rank {self.rank} of {self.nnodes}"


def exit_line(who: RankId, status: int, at: float) -> str:
    """The one line a rank prints when its engine ended by itself (:data:`_EXIT` parses
    it): replica, node, rank, how, and when (UTC, ms; the agent takes the earliest)."""
    return (f"serve: replica {who.replica} of {who.where}: the engine {ended(status)} "
            f"({_when(at)}); the replica ends")


class RankExit(NamedTuple):
    """The rank that ended a replica, as its log tells."""

    rank: int
    node: str
    what: str  # "the engine exited with status 3" / srun's "Exited with exit code 3"
    tail: str  # that rank's last log lines, control characters made visible
    cause: Optional[str] = None  # that rank's last error line (``reasons.cause``)


def _rank_lines(lines: Sequence[str], rank: int) -> List[str]:
    out = []
    for line in lines:
        match = _LABEL.match(line)
        if match and int(match.group(1)) == rank and match.group(2).strip():
            out.append(match.group(2).strip())
    return out


def first_rank_exit(text: str, limit: int = 5) -> Optional[RankExit]:
    """The rank whose engine ended first, from a multi-node step's ``srun --label`` log:
    the earliest :func:`exit_line`, else srun's own first ``task N: ...`` error (a rank
    whose role could not report, e.g. killed with its node); None if neither is there."""
    lines = text.splitlines()
    reports = []
    for line in lines:
        label = _LABEL.match(line)
        found = _EXIT.search(label.group(2) if label else line)
        if found:
            reports.append(found)
    if reports:
        first = min(reports, key=lambda m: m.group("at"))
        rank, node, what = int(first.group("rank")), first.group("node"), first.group("what")
    else:
        srun = next((m for m in map(_SRUN.search, lines) if m), None)
        if srun is None:
            return None
        rank, node, what = int(srun.group("rank")), srun.group("node"), srun.group("what")
    own = _rank_lines(lines, rank)
    tail = " | ".join(visible(line) for line in own[-limit:])
    engine = "\n".join(line for line in own if not _EXIT.search(line))  # not its exit line
    return RankExit(rank, node, visible(what), tail, cause(engine))


def run_rank(command: List[str], env: Dict[str, str], who: RankId) -> int:
    """Run one rank's engine as a child that dies with this process, signals forwarded;
    returns this role's exit status (never 0 when the engine ended by itself)."""
    stopped: List[int] = []
    child: List[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        if child and child[0].poll() is None:
            child[0].send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        child.append(subprocess.Popen(command, env=env, preexec_fn=die_with_parent))
    except OSError as err:
        print(f"serve: cannot run {command[0]}: {err.strerror}", file=sys.stderr, flush=True)
        return EXIT_NOT_FOUND
    status = child[0].wait()
    code = 128 - status if status < 0 else status
    if stopped:
        print(f"serve: replica {who.replica} of {who.where}: stopped by "
              f"{signal.Signals(stopped[0]).name}; the engine {ended(status)}",
              file=sys.stderr, flush=True)
        return code
    print(exit_line(who, status, time.time()), file=sys.stderr, flush=True)
    return code or EXIT_RANK_ENDED
