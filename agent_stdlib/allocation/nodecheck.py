"""Paths on the other nodes of an allocation: checked there, before any server starts.

Preflight checks the batch node itself. A replica placed on another node needs its model
and its server executable (or its image file) on *that* node's view of the filesystems,
so the agent runs ``python -I agent.pyz check --path P ...`` once per other node as a
small ``srun`` step and fails preflight naming the node and the path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from ..contracts import Plan
from .steps import step_argv, step_env

CHECK_TIMEOUT_S = 60.0
STEP_MEM_MB = 64


def remote_paths(plan: Plan) -> Dict[int, List[str]]:
    """Per allocation node other than the batch node: the absolute paths the replicas (and
    the ranks of replicas across nodes) placed there need."""
    needed: Dict[int, List[str]] = {}
    for dep in plan.deployments:
        paths = []
        if dep.container is not None:
            paths.append(dep.container.path)
        else:
            paths += [p for p in (dep.model, dep.command[0] if dep.command else "")
                      if os.path.isabs(p)]
        for node in (n for spec in dep.placement for n in spec.span if n != 0):
            row = needed.setdefault(node, [])
            row += [p for p in paths if p not in row]
    return needed


def missing(paths: Sequence[str]) -> List[str]:
    """The paths that do not exist or cannot be read here."""
    return [p for p in paths if not os.access(p, os.R_OK)]


def check_command(plan: Plan, agent_pyz: str, node: int, paths: Sequence[str]) -> List[str]:
    """The srun argv that runs the ``check`` role on allocation node ``node``."""
    runtime = dataclasses.replace(plan.runtime, step_mem_mb=STEP_MEM_MB)
    resources = dataclasses.replace(plan.resources, gpus=0)
    argv = [plan.runtime.python, "-I", agent_pyz, "check"]
    for path in paths:
        argv += ["--path", path]
    return step_argv(runtime, resources, "preflight-paths", argv, 0, relative=node)


def check_remote(plan: Plan, agent_pyz: str, ambient: Mapping[str, str],
                 node_names: Mapping[int, str]) -> Optional[str]:
    """Run the check on every other node that hosts a replica; the first problem, or None."""
    for node, paths in sorted(remote_paths(plan).items()):
        name = node_names.get(node, f"node {node}")
        try:
            done = subprocess.run(check_command(plan, agent_pyz, node, paths),
                                  env=step_env(plan.runtime, ambient, {}),
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"paths: {name}: the path check did not run ({err})"
        problem = _verdict(done.stdout, done.returncode)
        if problem is not None:
            lines = done.stderr.strip().splitlines()
            reason = problem or (lines[-1] if lines else f"exit status {done.returncode}")
            return f"paths: {name}: {reason}"
    return None


def _verdict(stdout: str, code: int) -> Optional[str]:
    """None when the node reported every path present; a reason (maybe empty) otherwise."""
    for line in reversed(stdout.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        gone = report.get("missing") or []
        if not gone and code == 0:
            return None
        return f"{gone[0]} is missing or not readable" if gone else ""
    return ""


def main(argv: List[str]) -> int:
    """``python agent.pyz check --path P ...``: report which paths this node cannot read."""
    parser = argparse.ArgumentParser(prog="agent check")
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args(argv)
    gone = missing(args.path)
    print(json.dumps({"node": os.environ.get("SLURMD_NODENAME"), "missing": gone}))
    sys.stdout.flush()
    return 1 if gone else 0
