"""The Python API: str or Path everywhere, typed results, and the Run handle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.control import api
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.runs.results import MergeResult, PlanResult, RunStatus, RunSummary
from tests.conftest import REPO
from tests.fakes import Shard, make_run

FAKE = REPO / "examples" / "fake-server.toml"
RUN = "obs-20240101-000000-abcdef"


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)


def test_plan_takes_a_str_or_a_path(profile_file: Path) -> None:
    by_str = api.plan(str(FAKE), profile=str(profile_file))  # was AttributeError on a str
    by_path = api.plan(FAKE, profile=profile_file)
    assert isinstance(by_str, PlanResult) and by_str.ok
    assert (by_str.name, by_str.shards, by_str.records) == ("fake-server", 3, 30)
    assert by_str.summary.splitlines()[0] == by_path.summary.splitlines()[0]
    assert by_str.script.startswith("#!/bin/bash\n")
    assert all(c.level in ("ok", "node", "warning", "error") for c in by_str.checks)
    assert by_str.to_dict()["plan"]["name"] == "fake-server"


def test_plan_overrides_are_keyword_arguments(profile_file: Path) -> None:
    result = api.plan(FAKE, profile_file, partition="gpu", time_limit="00:20:00")
    assert result.overrides == {"partition": "gpu", "time_limit": "00:20:00"}
    assert result.to_dict()["plan"]["resources"]["partition"] == "gpu"
    with pytest.raises(InvalidInput, match="--time: "):
        api.plan(FAKE, profile_file, time_limit="soon")


def test_a_relative_path_profile_is_a_file_not_a_name(tmp_path: Path, profile_file: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(profile_file.parent)
    assert api.plan(FAKE, Path(profile_file.name)).ok  # Path("profile.toml"), not a name
    (profile_file.parent / "cluster").write_text(profile_file.read_text())
    assert api.plan(FAKE, Path("cluster")).ok  # a Path without suffix is still a file
    with pytest.raises(NotFound):
        api.plan(FAKE, "cluster")  # a str without "/" or suffix is a profile name


def test_status_merge_and_runs_are_typed(workspace: Path, profile_file: Path) -> None:
    make_run(workspace, [Shard("winner"), Shard("failed", reason="preflight: no model")])
    status = api.status(RUN, profile_file)
    assert isinstance(status, RunStatus)
    assert (status.state, status.finished, status.succeeded) == ("failed", True, False)
    assert (status.records, status.records_done) == (20, 10)
    assert [f.shard for f in status.failures] == [1]
    assert status.failures[0].reason == "preflight: no model"
    assert [s.state for s in status.shards] == ["succeeded", "failed"]
    assert status.to_dict()["run_id"] == RUN and "totals" in status.data
    (summary,) = api.runs(profile_file)
    assert isinstance(summary, RunSummary) and summary.run_id == RUN
    assert (summary.state, summary.records_done, summary.records) == ("failed", 10, 20)


def test_the_run_handle(workspace: Path, profile_file: Path, tmp_path: Path) -> None:
    layout = make_run(workspace, [Shard("winner"), Shard("winner")])
    for index in (0, 1):
        layout.attempt(index, 1).output.mkdir(parents=True, exist_ok=True)
    run = api.run(profile=profile_file)  # the latest run
    assert repr(run) == f"Run({RUN!r})" and run.dir == layout.root
    assert run.job_ids == [] and run.warnings == []
    assert run.to_dict() == {"run_id": RUN}
    assert run.status().succeeded
    assert run.wait(timeout_s=0).state == "succeeded"
    merged = run.merge(tmp_path / "out.jsonl")  # a Path (a str works the same)
    assert isinstance(merged, MergeResult) and merged.complete
    assert merged.output == str(tmp_path / "out.jsonl") and merged.missing_shards == ()
    again = api.run(RUN, str(profile_file))
    assert again.run_id == run.run_id


def test_an_unknown_run_points_at_runs(profile_file: Path) -> None:
    with pytest.raises(NotFound) as err:
        api.status("nope-20240101-000000-abcdef", profile_file)
    assert err.value.hint == "'synthbatch runs' lists the runs of this workspace"


def test_run_logs_returns_the_text(workspace: Path, profile_file: Path) -> None:
    layout = make_run(workspace, [Shard("running")])
    folder = layout.attempt(0, 1).execution_logs(1)
    folder.mkdir(parents=True)
    (folder / "client.log").write_text("hello\n")
    assert api.run(RUN, profile_file).logs(0) == "hello\n"
    assert json.loads(json.dumps(api.logs(RUN, 0, profile=profile_file)))["step"] == "client"


def test_merge_result_from_a_manifest() -> None:
    result = MergeResult.from_dict({"output": "/o.jsonl", "manifest": "/m.json", "records": 3,
                                    "sha256": "a" * 64, "complete": True,
                                    "missing_shards": [], "new_key": 1})
    assert (result.records, result.complete, result.data["new_key"]) == (3, True, 1)


def test_typed_results_read_their_fields_by_name_and_default_the_rest() -> None:
    summary = RunSummary.from_dict({"run_id": "r", "shards": 4, "gpu_hours": 1.5,
                                    "story": "merging", "new_key": 1})
    assert (summary.run_id, summary.shards, summary.gpu_hours, summary.story) == \
        ("r", 4, 1.5, "merging")
    assert (summary.name, summary.records, summary.created_at) == ("", None, 0.0)
    status = RunStatus.from_dict({"state": "running", "counts": {"running": 2},
                                  "notes": ["n"], "totals": {"gpu_hours": 2.0}, "rate": 0.5})
    assert (status.state, status.counts, status.notes, status.gpu_hours, status.rate,
            status.elapsed_s, status.records) == ("running", {"running": 2}, ("n",), 2.0,
                                                  0.5, None, 0)
    merged = MergeResult.from_dict({"files_sha256": "b" * 64, "missing_shards": [2]})
    assert (merged.sha256, merged.missing_shards, merged.complete) == ("b" * 64, (2,), False)


def test_preview_takes_a_str_or_a_path(profile_file: Path, agent_pyz: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without endpoints the recipe's samplers, seed data and expressions run here."""
    monkeypatch.setenv("SYNTHBATCH_AGENT_PYZ", str(agent_pyz))
    run_file = REPO / "examples" / "qa-fake.toml"
    by_str = api.preview(str(run_file), profile=str(profile_file), count=2)  # was AttributeError
    by_path = api.preview(run_file, profile=profile_file, count=2)
    assert [r["index"] for r in by_str["records"]] == [0, 1]
    assert by_str["records"] == by_path["records"]
    first = by_str["records"][0]
    assert {"topic", "level"} <= set(first) and "question" not in first
