"""``--reuse RUN_ID`` on the login node (issue 31): which earlier runs a new run takes
LLM cells from, checked before anything is written, and what ``plan`` says of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

from synthbatch.agent_stdlib.contracts import ContractError, Plan, sha256_bytes
from synthbatch.agent_stdlib.layout import RunLayout, run_dir, runs_root
from synthbatch.agent_stdlib.recipe.columns import Node
from synthbatch.agent_stdlib.recipe.reuse import Comparison, compare, plan_digests
from synthbatch.agent_stdlib.statefile import StateError
from synthbatch.control.errors import InvalidInput, one_line
from synthbatch.control.runs.plan import Resolved
from synthbatch.control.runs.store import load_plan, load_run, run_layout


def _layout(workspace: Path, run_id: str) -> RunLayout:
    """The reused run's layout in ``workspace``; a path to a run directory of another
    workspace, or a run folder that leads out of this one, is refused naming both."""
    if "/" in run_id:  # a path given for an id: say whose run it is
        where = Path(run_id).expanduser()
        if RunLayout(where).run_json.is_file() and where.parent.name == "runs":
            raise InvalidInput(f"--reuse {run_id}: a run of another workspace "
                               f"({where.parent.parent}); --reuse takes runs of this "
                               f"profile's workspace ({workspace}) by id")
    layout = run_layout(workspace, run_id)  # NotFound / InvalidInput name the run
    home = runs_root(workspace).resolve()
    if layout.root.resolve().parent != home:
        raise InvalidInput(f"--reuse {run_id}: the run folder leads to another workspace "
                           f"({layout.root.resolve().parent.parent}), not {workspace}")
    return layout


def reused_runs(workspace: Path, run_ids: Sequence[str]) -> Dict[str, Plan]:
    """Run id -> plan of every reused run of ``workspace``; one-line errors name the run
    that does not exist, belongs to another workspace, never committed, has a damaged
    ``run.json`` or ``plan.json``, or does not run the built-in generator."""
    plans: Dict[str, Plan] = {}
    for run_id in run_ids:
        layout = _layout(workspace, run_id)
        try:
            if load_run(layout) is None:
                raise InvalidInput(f"--reuse {run_id}: the run was never submitted "
                                   "(no run.json)")
            plan = load_plan(layout)
        except (StateError, ContractError, ValueError) as err:
            raise InvalidInput(f"--reuse {run_id}: damaged run record: "
                               f"{one_line(str(err), 300)}") from err
        if plan.client is None or not plan.client.columns:
            raise InvalidInput(f"--reuse {run_id}: not a run of the built-in generator's "
                               "columns: it has no LLM cells to reuse")
        plans[run_id] = plan
    return plans


def unfinished(workspace: Path, plans: Mapping[str, Plan]) -> List[str]:
    """One warning line per reused run not every shard of which has a winner: it is used
    for the records it has; the others' cells are generated."""
    lines = []
    for run_id, plan in plans.items():
        layout = RunLayout(run_dir(workspace, run_id))
        won = sum(1 for s in plan.shards if layout.winner_json(s.index).is_file())
        if won < len(plan.shards):
            lines.append(f"--reuse {run_id}: the run is not finished ({won} of "
                         f"{len(plan.shards)} shards succeeded): the records it has are "
                         "reused, the other cells generated")
    return lines


def comparison(plan: Plan, earlier: Sequence[Plan]) -> Comparison:
    """Which LLM columns of ``plan`` the ``earlier`` runs' definitions match."""
    spec = plan.client
    nodes = [Node(c.name, c.type, c.params) for c in (spec.columns if spec else ())]
    return compare(nodes, plan_digests(plan), [plan_digests(p) for p in earlier])


def merged(named: Sequence[str], extra: Sequence[str]) -> List[str]:
    """The run file's ``named`` runs then ``--reuse``'s ``extra`` ones, each once."""
    return list(dict.fromkeys(list(named) + list(extra)))


def with_reuse(resolved: Resolved, workspace: Path,
               extra: Sequence[str]) -> Tuple[Resolved, List[str]]:
    """``resolved`` whose plan's ``client.reuse`` names the reused runs' directories
    (the run file's ``reuse`` and ``extra``, checked by :func:`reused_runs`), its bytes
    and digest made again; and the warnings (:func:`unfinished`)."""
    run_ids = merged(resolved.reuse, extra)
    if not run_ids:
        return resolved, []
    plan = resolved.plan
    if plan.client is None or not plan.client.columns:
        raise InvalidInput("--reuse: the run does not use the built-in generator's columns")
    warnings = unfinished(workspace, reused_runs(workspace, run_ids))
    folders = {r: str(run_layout(workspace, r).root) for r in run_ids}
    new = plan.replace(client=dataclasses.replace(plan.client, reuse=folders))
    payload = new.to_json().encode("utf-8")
    return dataclasses.replace(resolved, plan=new, plan_bytes=payload,
                               plan_sha256=sha256_bytes(payload)), warnings


def summary_lines(plan: Plan, workspace: Path, run_ids: List[str]) -> List[str]:
    """What ``plan`` prints about reuse: ``reuse: ...``, then a warning per unfinished
    reused run."""
    if not run_ids:
        return []
    found = reused_runs(workspace, run_ids)
    return [comparison(plan, list(found.values())).summary()
            + f" (from {', '.join(run_ids)})"] + [f"warning: {w}"
                                                  for w in unfinished(workspace, found)]

