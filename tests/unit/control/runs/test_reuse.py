"""``--reuse RUN_ID`` on the login node (issue 31): bad input is one line naming the run;
a good one puts the run's directory into the plan and ``plan`` says which columns match."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import pytest

from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan, RunRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.runs.reuse import comparison, reused_runs, summary_lines, unfinished
from tests.agent_runs import recipe_plan

COLUMNS = (ColumnSpec("topic", "category", {"values": ["a", "b"]}),
           ColumnSpec("q", "llm-text", {"model": "gen", "prompt": "Ask about {topic}."}),
           ColumnSpec("r", "llm-text", {"model": "gen", "prompt": "Answer {q}."}))


def _run(workspace: Path, run_id: str, plan: Plan, committed: bool = True,
         won: Sequence[int] = ()) -> Path:
    root = workspace / "runs" / run_id
    root.mkdir(parents=True)
    (root / "plan.json").write_text(plan.to_json())
    if committed:
        (root / "run.json").write_text(RunRecord(
            run_id=run_id, name=plan.name, created_at=1.0, plan_sha256="0" * 64,
            agent_pyz="agent-x.pyz", agent_sha256="0" * 64, backend="slurm",
            job_name=f"synthbatch-{run_id}", shard_count=len(plan.shards)).to_json())
    for shard in won:  # only its presence counts for "finished"
        path = RunLayout(root).winner_json(shard)
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    return root


OLD = "old-20260101-000000-abcd"


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
    from synthbatch.control.runs.reuse import merged

    assert merged(["a", "b"], ["b", "c"]) == ["a", "b", "c"]  # the run file's list first


def test_plan_reads_the_run_files_reuse_list(tmp_path: Path, workspace: Path,
                                             profile_file: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan run.toml`` (no ``--reuse``) names what the run file's ``reuse`` gives."""
    from synthbatch.control import api
    from tests.conftest import REPO

    monkeypatch.delenv("SLURM_CONF", raising=False)
    example = REPO / "examples" / "qa-fake.toml"
    first = api.plan(example, profile_file)
    assert "reuse:" not in first.summary
    _run(workspace, "old-20260101-000000-abcd", Plan.from_dict(first.to_dict()["plan"]))
    text = example.read_text().replace('name = "qa-fake"\n', 'name = "qa-fake"\n'
                                       'reuse = ["old-20260101-000000-abcd"]\n', 1)
    run_file = tmp_path / "qa-fake.toml"
    run_file.write_text(text.replace("{config_dir}/..", str(REPO))
                        .replace("{config_dir}", str(example.parent)))
    lines = api.plan(run_file, profile_file).summary.splitlines()
    assert "reuse: 3 of 3 LLM columns (question, answer, grade); regenerate: none (from " \
           "old-20260101-000000-abcd)" in lines, lines


def test_a_run_of_another_workspace_is_one_line_naming_both(tmp_path: Path) -> None:
    other = _run(tmp_path / "other", OLD, recipe_plan(COLUMNS))
    mine = tmp_path / "mine"
    with pytest.raises(InvalidInput, match=f"--reuse {other}: a run of another workspace "
                                           rf"\({tmp_path / 'other'}\)"):
        reused_runs(mine, [str(other)])
    (mine / "runs").mkdir(parents=True)
    (mine / "runs" / OLD).symlink_to(other)  # a folder that leads out of the workspace
    with pytest.raises(InvalidInput, match=f"--reuse {OLD}: the run folder leads to another "
                                           "workspace"):
        reused_runs(mine, [OLD])


def test_a_damaged_run_record_is_one_line_naming_the_run(tmp_path: Path) -> None:
    root = _run(tmp_path, OLD, recipe_plan(COLUMNS))
    (root / "run.json").write_text("{}")
    with pytest.raises(InvalidInput, match=f"--reuse {OLD}: damaged run record: .*run.json"):
        reused_runs(tmp_path, [OLD])
    (root / "run.json").unlink()
    _run(tmp_path / "b", OLD, recipe_plan(COLUMNS))
    (tmp_path / "b" / "runs" / OLD / "plan.json").write_text("{\"schema_version\": 1}")
    with pytest.raises(InvalidInput, match=f"--reuse {OLD}: damaged run record: "):
        reused_runs(tmp_path / "b", [OLD])


def test_an_unfinished_run_is_used_with_one_warning_line(tmp_path: Path) -> None:
    plan = recipe_plan(COLUMNS)
    plan = plan.replace(shards=(plan.shards[0], dataclasses.replace(plan.shards[0], index=1)))
    _run(tmp_path, OLD, plan, won=[0])
    found = reused_runs(tmp_path, [OLD])  # not refused
    assert unfinished(tmp_path, found) == [
        f"--reuse {OLD}: the run is not finished (1 of {len(plan.shards)} shards "
        "succeeded): the records it has are reused, the other cells generated"]
    assert summary_lines(plan, tmp_path, [OLD])[1].startswith(f"warning: --reuse {OLD}: the "
                                                              "run is not finished")
    _run(tmp_path / "b", OLD, plan, won=range(len(plan.shards)))
    assert unfinished(tmp_path / "b", reused_runs(tmp_path / "b", [OLD])) == []
