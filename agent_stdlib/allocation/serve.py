"""``python agent.pyz serve --gpus 2,3 [--replica NAME] [--env-prefix P] [--nnodes N --hosts
H0,H1 [--follower-arg=A]...] -- ENGINE ...``

Binds one server replica to the GPUs the plan gives it, then ``exec``s the engine (same
pid: signals and exit status are the engine's). With ``--nnodes N`` > 1 it is one rank of
a replica across N nodes (see "Ranks" below).

Why a role and not an srun flag (measured on Slurm 22.05, ``docs/runtime.md`` "GPU
binding"): concurrent ``srun --overlap --gres=gpu:2`` steps of one allocation are all
given the *same* first GPUs (both see ``CUDA_VISIBLE_DEVICES=0,1``); a
``CUDA_VISIBLE_DEVICES`` passed through srun's environment is overwritten in the task;
``--gpu-bind=map_gpu:``/``mask_gpu:`` were ignored. So every server step asks Slurm for
all of the allocation's GPUs on its node, and this role narrows the step's device lists
inside the task to the plan's positions:

    plan GPU index k  ->  the k-th entry of the list Slurm gave the step

That holds whether Slurm renumbers devices (``ConstrainDevices=yes``: a job holding GPUs
2,3 sees ``CUDA_VISIBLE_DEVICES=0,1``) or not (it sees 2,3). ``SLURM_STEP_GPUS`` (global
ids in both cases) is narrowed the same way, so it names the physical GPUs the replica
uses. A step whose lists cannot cover the plan exits with :data:`EXIT_UNCOVERED` and one
line saying so, before the engine starts.

Ranks: a replica across N nodes is one ``srun --nodes=N --ntasks-per-node=1
--kill-on-bad-exit=1 --label`` step; each task runs this role, which takes its rank from
``SLURM_NODEID`` (its node's index in the step), binds its node's GPUs, fills ``{host}``
(``--hosts``, the address of each rank's node) and ``{node_rank}`` in the engine's argv,
appends ``--follower-arg``s on ranks > 0, and runs the engine as its child (dying with
it, signals forwarded). Whenever the engine ends by itself, with any status, the role
prints one :func:`exit_line` and exits non-zero (:data:`EXIT_RANK_ENDED` for status 0),
so that Slurm ends every other rank too: a rank that exits 0 would otherwise leave the
rest of the replica running. The agent finds the first such line in the step's log
(:func:`first_rank_exit`) and names that rank, its node and its log lines.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from agent_stdlib.allocation.launch import fill_placeholders
from agent_stdlib.allocation.supervisor import die_with_parent
from agent_stdlib.errors import AgentError
from agent_stdlib.text import visible

# Device lists Slurm sets in a step with GPUs (CUDA, ROCm, OpenCL), then its own record.
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
               "GPU_DEVICE_ORDINAL")
LIST_VARS = DEVICE_VARS + ("SLURM_STEP_GPUS",)
NO_DEVICES = "NoDevFiles"  # Slurm's value when the GRES has no device files
EXIT_USAGE = 2
EXIT_UNCOVERED = 78  # sysexits EX_CONFIG: the step cannot give the replica its GPUs
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


class BindError(AgentError, ValueError):
    """The step's device lists cannot give the replica the plan's GPUs."""


@dataclass(frozen=True)
class Binding:
    """The narrowed variables of one replica and the line that reports them."""

    env: Dict[str, str]
    line: str


def parse_indices(text: str) -> Tuple[int, ...]:
    """``"2,3"`` -> ``(2, 3)``: distinct non-negative GPU indices, at least one."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise BindError(f"--gpus {text!r} is not a comma-separated list of GPU indices")
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise BindError(f"--gpus {text!r} names a GPU twice")
    return indices


def device_list(value: Optional[str]) -> Optional[List[str]]:
    """A device list variable's entries; None when unset (``NoDevFiles`` means none)."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",")
            if item.strip() and item.strip() != NO_DEVICES]


def narrow(env: Mapping[str, str], positions: Sequence[int], replica: str = "",
           node: str = "", prefix: str = "") -> Binding:
    """Each device list of ``env`` reduced to ``positions`` (pure).

    Every list Slurm set (:data:`LIST_VARS`) must cover every position; ``prefix``
    (e.g. ``APPTAINERENV_``) repeats the narrowed variables under that prefix for a
    runtime that passes only prefixed variables on. Raises BindError naming what the step
    sees.
    """
    who = f"replica {replica}" if replica else "this replica"
    where = f" of {node}" if node else ""
    wanted = ",".join(str(p) for p in positions)
    present = [name for name in DEVICE_VARS if name in env]
    if not present:
        raise BindError(f"the plan gives {who} GPUs {wanted}{where}, but this step sees no "
                        "GPUs (CUDA_VISIBLE_DEVICES is not set)")
    out: Dict[str, str] = {}
    for name in (n for n in LIST_VARS if n in env):
        items = device_list(env[name]) or []
        if max(positions) >= len(items):
            raise BindError(f"the plan gives {who} GPUs {wanted}{where}, but this step sees "
                            f"{len(items)} GPU(s) ({name}={','.join(items) or 'none'})")
        out[name] = ",".join(items[p] for p in positions)
    shown = " ".join(f"{name}={value}" for name, value in out.items())
    if prefix:
        out.update({prefix + name: value for name, value in list(out.items())})
    return Binding(env=out, line=f"serve: {who}{where}: plan GPUs {wanted} -> {shown}")


# ----------------------------------------------------------------------------- ranks


def rank_of(env: Mapping[str, str], nnodes: int) -> int:
    """This task's rank in a replica of ``nnodes`` nodes: ``SLURM_NODEID``, its node's
    index in the step (measured on 22.05: ``--relative=1 --nodes=2`` gives node2 0 and
    node3 1). BindError unless the step has one task on each of exactly ``nnodes`` nodes."""
    node_id, proc_id = env.get("SLURM_NODEID", ""), env.get("SLURM_PROCID", "")
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or ""
    if not (node_id.isdigit() and proc_id.isdigit() and nodes.isdigit()):
        raise BindError("this step does not say which node it is (SLURM_NODEID, "
                        "SLURM_PROCID, SLURM_STEP_NUM_NODES)")
    if int(nodes) != nnodes:
        raise BindError(f"the replica spans {nnodes} nodes, this step runs on {nodes}")
    if node_id != proc_id:
        raise BindError(f"task {proc_id} runs on the step's node {node_id}: one task per node "
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


def ended(status: int) -> str:
    """How an engine ended, in words: ``exited with status 3``, ``was killed by signal 9
    (SIGKILL)``."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-status} ({name})"


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
    tail = " | ".join(visible(line) for line in _rank_lines(lines, rank)[-limit:])
    return RankExit(rank, node, visible(what), tail)


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


# ----------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent serve")
    parser.add_argument("--gpus", required=True, help="the plan's GPU indices on this node")
    parser.add_argument("--replica", default="", help="the replica's name, for messages")
    parser.add_argument("--env-prefix", default="", help="also set each variable with this "
                        "prefix (APPTAINERENV_ for apptainer --cleanenv)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes of the replica (one "
                        "rank each)")
    parser.add_argument("--hosts", default="", help="comma-separated: the address {host} "
                        "is on each rank's node")
    parser.add_argument("--follower-arg", action="append", default=[],
                        help="appended to the engine argv of ranks > 0 (give as =VALUE)")
    return parser


def main(argv: List[str]) -> int:
    """Narrow the device lists, report the binding, and exec the engine's argv (or run it
    as one rank of a replica across nodes)."""
    if "--" not in argv:
        print("serve: usage: serve --gpus I,J [--replica NAME] [--env-prefix P] [--nnodes N "
              "--hosts H0,H1 [--follower-arg=A]] -- ENGINE ...", file=sys.stderr)
        return EXIT_USAGE
    split = argv.index("--")
    command = argv[split + 1:]
    args = _parser().parse_args(argv[:split])
    hosts = [h for h in args.hosts.split(",") if h]
    if not command or (args.nnodes > 1 and len(hosts) != args.nnodes):
        print("serve: no engine command after --, or --hosts does not name every rank's "
              "address", file=sys.stderr)
        return EXIT_USAGE
    try:
        positions = parse_indices(args.gpus)
    except BindError as err:
        print(f"serve: {err}", file=sys.stderr)
        return EXIT_USAGE
    node = os.environ.get("SLURMD_NODENAME", "")
    who = RankId(args.replica, node or "unknown-node", 0, args.nnodes)
    try:
        if args.nnodes > 1:
            who = who._replace(rank=rank_of(os.environ, args.nnodes))
        binding = narrow(os.environ, positions, args.replica,
                         who.where if args.nnodes > 1 else node, args.env_prefix)
    except BindError as err:
        print(f"serve: {args.replica}: {err}" if args.nnodes > 1 else f"serve: {err}",
              file=sys.stderr, flush=True)
        return EXIT_UNCOVERED
    print(binding.line, file=sys.stderr, flush=True)
    env = dict(os.environ)
    env.update(binding.env)
    if args.nnodes > 1:
        return run_rank(rank_argv(command, hosts, who.rank, args.follower_arg), env, who)
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        print(f"serve: cannot run {command[0]}: {err.strerror}", file=sys.stderr, flush=True)
    return EXIT_NOT_FOUND
