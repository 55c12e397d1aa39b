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

With ``--nnodes N`` it is one rank of a replica across N nodes
(:mod:`agent_stdlib.allocation.ranks`): it binds its node's GPUs the same way, then runs
the engine of its rank as a child instead of ``exec``ing it.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..containers import DEVICE_VARS
from ..errors import AgentError
from .ranks import (
    EXIT_NOT_FOUND,
    RankError,
    RankId,
    rank_argv,
    rank_of,
    run_rank,
)

# Slurm's device lists (CUDA, ROCm, OpenCL), then its own record.
LIST_VARS = DEVICE_VARS + ("SLURM_STEP_GPUS",)
NO_DEVICES = "NoDevFiles"  # Slurm's value when the GRES has no device files
EXIT_USAGE = 2
EXIT_UNCOVERED = 78  # sysexits EX_CONFIG: the step cannot give the replica its GPUs


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
    except (BindError, RankError) as err:
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
