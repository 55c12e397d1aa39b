"""``--reuse RUN_ID`` on the login node (issue 31): bad input is one line naming the run;
a good one puts the run's directory into the plan and ``plan`` says which columns match."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.runs.reuse import comparison, reused_runs
from tests.agent_runs import recipe_plan

COLUMNS = (ColumnSpec("topic", "category", {"values": ["a", "b"]}),
           ColumnSpec("q", "llm-text", {"model": "gen", "prompt": "Ask about {topic}."}),
           ColumnSpec("r", "llm-text", {"model": "gen", "prompt": "Answer {q}."}))


def _run(workspace: Path, run_id: str, plan: Plan, committed: bool = True) -> None:
    root = workspace / "runs" / run_id
    root.mkdir(parents=True)
    (root / "plan.json").write_text(plan.to_json())
    if committed:
        (root / "run.json").write_text("{}")


def test_a_missing_run_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="run old-20260101-000000-abcd: no such run"):
        reused_runs(tmp_path, ["old-20260101-000000-abcd"])


def test_an_uncommitted_run_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, "old-20260101-000000-abcd", recipe_plan(COLUMNS), committed=False)
    with pytest.raises(InvalidInput, match="--reuse old-20260101-000000-abcd: the run was "
                                           "never submitted"):
        reused_runs(tmp_path, ["old-20260101-000000-abcd"])


def test_plan_says_which_columns_are_reused(tmp_path: Path) -> None:
    old = recipe_plan(COLUMNS)
    changed = (*COLUMNS[:2], dataclasses.replace(COLUMNS[2], params={
        "model": "gen", "prompt": "Answer  {q}."}))
    assert comparison(recipe_plan(changed), [old]).summary() == (
        "reuse: 1 of 2 LLM columns (q); regenerate: r")
    assert comparison(recipe_plan(COLUMNS), [old]).regenerated == []


def test_the_plan_carries_the_reused_runs_through_its_contract() -> None:
    plan = recipe_plan(COLUMNS)
    assert plan.client is not None
    with_reuse = plan.replace(client=dataclasses.replace(plan.client,
                                                         reuse={"old": "/w/runs/old"}))
    assert Plan.from_dict(with_reuse.to_dict()).client.reuse == {"old": "/w/runs/old"}


def test_the_run_files_reuse_comes_first_and_each_run_once(tmp_path: Path) -> None:
    from synthbatch.control.runs.reuse import run_ids_of

    class Config:
        reuse = ["a", "b"]

    class Resolved:
        config = Config()

    assert run_ids_of(Resolved(), ["b", "c"]) == ["a", "b", "c"]  # type: ignore[arg-type]
