"""``--reuse RUN_ID`` on the login node (issue 31): which earlier runs a new run takes
LLM cells from, checked before anything is written, and what ``plan`` says of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Sequence

from synthbatch.agent_stdlib.contracts import Plan, sha256_bytes
from synthbatch.agent_stdlib.recipe.columns import Node, analyze
from synthbatch.agent_stdlib.recipe.reuse import (
    Comparison,
    compare,
    definition_digests,
    model_identity,
)
from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs.plan import Resolved
from synthbatch.control.runs.store import load_plan, load_run, run_layout


def reused_runs(workspace: Path, run_ids: Sequence[str]) -> Dict[str, Plan]:
    """Run id -> plan of every reused run of ``workspace``; one-line errors name the run
    that does not exist, never committed, or does not run the built-in generator."""
    plans: Dict[str, Plan] = {}
    for run_id in run_ids:
        layout = run_layout(workspace, run_id)  # NotFound / InvalidInput name the run
        if load_run(layout) is None:
            raise InvalidInput(f"--reuse {run_id}: the run was never submitted (no run.json)")
        plan = load_plan(layout)
        if plan.client is None or not plan.client.columns:
            raise InvalidInput(f"--reuse {run_id}: not a run of the built-in generator's "
                               "columns: it has no LLM cells to reuse")
        plans[run_id] = plan
    return plans


def digests(plan: Plan) -> Dict[str, str]:
    """The definition digest of every column of ``plan`` (``recipe.reuse``)."""
    spec = plan.client
    if spec is None or not spec.columns:
        return {}
    nodes = [Node(c.name, c.type, c.params) for c in spec.columns]
    graph = analyze(nodes, has_seed=spec.seed_data is not None, context=spec.context)
    return definition_digests(nodes, graph.inputs,
                              {d.alias: model_identity(d) for d in plan.deployments},
                              spec.context)


def comparison(plan: Plan, earlier: Sequence[Plan]) -> Comparison:
    """Which LLM columns of ``plan`` the ``earlier`` runs' definitions match."""
    spec = plan.client
    nodes = [Node(c.name, c.type, c.params) for c in (spec.columns if spec else ())]
    return compare(nodes, digests(plan), [digests(p) for p in earlier])


def run_ids_of(resolved: Resolved, extra: Sequence[str]) -> List[str]:
    """The run file's ``reuse = [...]`` then ``--reuse`` ones, each once."""
    named = list(resolved.config.reuse) if resolved.config is not None else []
    return list(dict.fromkeys(named + list(extra)))


def with_reuse(resolved: Resolved, workspace: Path, extra: Sequence[str]) -> Resolved:
    """``resolved`` whose plan's ``client.reuse`` names the reused runs' directories
    (the run file's ``reuse`` and ``extra``, checked by :func:`reused_runs`), its bytes
    and digest made again."""
    run_ids = run_ids_of(resolved, extra)
    if not run_ids:
        return resolved
    plan = resolved.plan
    if plan.client is None or not plan.client.columns:
        raise InvalidInput("--reuse: the run does not use the built-in generator's columns")
    reused_runs(workspace, run_ids)
    folders = {r: str(run_layout(workspace, r).root) for r in run_ids}
    new = plan.replace(client=dataclasses.replace(plan.client, reuse=folders))
    payload = new.to_json().encode("utf-8")
    return dataclasses.replace(resolved, plan=new, plan_bytes=payload,
                               plan_sha256=sha256_bytes(payload))


def summary_lines(plan: Plan, workspace: Path, run_ids: List[str]) -> List[str]:
    """What ``plan`` prints about reuse: one line, ``reuse: ...``."""
    if not run_ids:
        return []
    found = reused_runs(workspace, run_ids)
    return [comparison(plan, list(found.values())).summary()
            + f" (from {', '.join(run_ids)})"]

