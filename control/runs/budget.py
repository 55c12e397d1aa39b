"""The plan-time token-budget check: a structured or judge column whose ``max_tokens``
cannot hold its shortest valid answer (:mod:`agent_stdlib.recipe.budget`) is a warning
naming ``client.columns[i].max_tokens``: every such cell would be cut by the length limit
and retried."""

from __future__ import annotations

from typing import List

from synthbatch.agent_stdlib.contracts import Plan
from synthbatch.agent_stdlib.recipe.budget import budget_problem
from synthbatch.control.runs.checks import WARNING, Finding


def token_budget(plan: Plan, run_file: str) -> List[Finding]:
    """One warning per LLM column whose ``max_tokens`` is too small for its answer."""
    found = []
    columns = plan.client.columns if plan.client is not None else ()
    for i, column in enumerate(columns):
        problem = budget_problem(column.type, dict(column.params))
        if problem is not None:
            found.append(Finding(WARNING, f"{run_file}: client.columns[{i}].max_tokens "
                                          f"({column.name})", problem[0]))
    return found
