"""Merge on completion and the story of automatic jobs (issue 34): settings resolved at
submit, the round submits the merge job once the run is over, the merge job writes the
dataset through the one merge path, ``status``/``runs`` say what is pending."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List

import pytest

from synthbatch.control.cli.render import runs_text, shard_line
from synthbatch.control.config.run import Output, RunConfig
from synthbatch.control.errors import InvalidInput
from synthbatch.control.runs import automerge, autoretry, autoround
from synthbatch.control.runs.merge import verify_jsonl
from synthbatch.control.runs.status.listing import list_runs
from tests.fakes import RoundQueue, Shard, make_run, round_profile


def test_automatic_retries_are_on_by_default() -> None:
    field = RunConfig.model_fields["auto_retry"]
    assert field.default is True


def test_a_relative_merge_target_is_resolved_at_submit(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert automerge.target("out/data.jsonl", tmp_path, "jsonl") == tmp_path / "out" / "data.jsonl"


@pytest.mark.parametrize("raw,fmt,words", [
    ("nowhere/data.jsonl", "jsonl", "is not a directory"),
    (".", "jsonl", "is a directory"),
])
def test_a_bad_merge_target_is_one_line_naming_the_flag(tmp_path: Path, raw: str, fmt: str,
                                                        words: str) -> None:
    with pytest.raises(InvalidInput) as err:
        automerge.target(raw, tmp_path, fmt)
    assert err.value.message.startswith("--merge-to ") and words in err.value.message
    assert "\n" not in err.value.message


def test_the_flag_wins_over_the_run_file_and_the_run_file_is_relative_to_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here, there = tmp_path / "cwd", tmp_path / "runfiles"
    here.mkdir()
    there.mkdir()
    monkeypatch.chdir(here)
    config = SimpleNamespace(auto_retry=False, output=Output(merge_to="m.jsonl",
                                                             allow_partial=True))
    from_file = automerge.auto_settings(config, there / "run.toml", 3)
    assert from_file == {"auto_retry": False, "max_attempts": 3, "merge": {
        "to": str(there / "m.jsonl"), "format": "jsonl", "allow_partial": True}}
    flagged = automerge.auto_settings(config, there / "run.toml", 3, "x", "parquet")
    assert flagged["merge"]["to"] == str(here / "x")
    assert flagged["merge"]["format"] == "parquet"


def _round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, states: List[tuple],
           merge: Dict[str, Any], auto_retry: bool = True, own: str = "") -> tuple:
    layout = make_run(tmp_path, [Shard("submitted")] * len(states))
    monkeypatch.setenv("SLURM_JOB_ID", own)  # the round's own job ("": not in a job)
    automerge.save_settings(layout, automerge.settings(
        auto_retry, 3, Path(merge["to"]) if merge else None, "jsonl",
        bool(merge.get("allow_partial"))))
    rows = [{"index": i, "state": s, "attempt": a, "job_id": "500"} for i, (s, a) in
            enumerate(states)]
    retried: List[int] = []

    def retry_run(*_: Any, **__: Any) -> Any:
        retried.append(1)
        return SimpleNamespace(submissions=[{"job_id": "900"}],
                               submitted=[SimpleNamespace(shard=i, attempt=a + 1)
                                          for i, (s, a) in enumerate(states) if s == "failed"])

    monkeypatch.setattr(autoround, "observe", lambda *_: {"shards": rows})
    monkeypatch.setattr(autoround, "load_plan", lambda _: SimpleNamespace(
        max_attempts=3, run_id="r"))
    monkeypatch.setattr(autoround, "retry_run", retry_run)
    q = RoundQueue()
    decision = autoround.run_round(layout, round_profile(tmp_path), q)
    return layout, q, decision, retried


def test_the_last_round_submits_the_merge_job_once_every_shard_won(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    to = tmp_path / "merged.jsonl"
    layout, q, decision, retried = _round(tmp_path, monkeypatch, [("succeeded", 1),
                                                                  ("succeeded", 3)],
                                          {"to": str(to)})
    assert decision.merge and not retried and len(q.submitted) == 1
    argv = q.submitted[0]
    assert f"--time={autoretry.MERGE_TIME}" in argv and "--cpus-per-task=1" in argv
    assert not any(a.startswith("--dependency") for a in argv)
    script = Path(argv[-1]).read_text()
    assert script.rstrip().endswith("--merge")
    pending = autoretry.load_pending(layout)
    assert pending["action"] == "merge" and pending["job_id"] == "701"
    shown = autoretry.round_now(layout, q, lambda: [], lambda: 3)
    assert shown["action"] == "merge" and shown["story"] == "merging"
    assert autoretry.listed_story(layout, "succeeded", 3) == "merging"


def test_a_failed_round_is_retried_and_runs_tells_the_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout, q, decision, retried = _round(tmp_path, monkeypatch, [("succeeded", 1),
                                                                  ("failed", 1)], {})
    assert retried and decision.retry == (1,)
    assert "--dependency=afterany:900" in q.submitted[0]
    assert autoretry.load_pending(layout)["attempt"] == 2
    assert autoretry.listed_story(layout, "running", 3) == "retrying (attempt 2 of 3)"
    assert autoretry.listed_story(layout, "cancelled", 3) is None


def test_the_next_automatic_job_waits_for_the_round_that_submits_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # never two automatic jobs running together: the successor (or the merge job) starts
    # only after the round job that submitted it has ended
    _, q, _, _ = _round(tmp_path / "a", monkeypatch, [("succeeded", 1), ("failed", 1)], {},
                        own="650")
    assert "--dependency=afterany:900:650" in q.submitted[0]
    _, q, decision, _ = _round(tmp_path / "b", monkeypatch, [("succeeded", 1)],
                               {"to": str(tmp_path / "m.jsonl")}, own="650")
    assert decision.merge and "--dependency=afterany:650" in q.submitted[0]


def test_with_retries_off_a_round_only_merges(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    to = tmp_path / "m.jsonl"
    layout, q, decision, retried = _round(tmp_path, monkeypatch, [("failed", 1)],
                                          {"to": str(to)}, auto_retry=False)
    assert not retried and decision.over and not decision.merge and q.submitted == []
    result = automerge.load_result(layout)
    assert result["state"] == "not merged" and result["missing_shards"] == [0]
    assert autoretry.load_pending(layout) is None


def test_exhausted_with_allow_partial_merges_but_a_cancelled_shard_stops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    merge = {"to": str(tmp_path / "m.jsonl"), "allow_partial": True}
    _, q, decision, _ = _round(tmp_path / "a", monkeypatch, [("succeeded", 1), ("failed", 3)],
                               merge)
    assert decision.merge and len(q.submitted) == 1
    _, q, decision, _ = _round(tmp_path / "b", monkeypatch,
                               [("succeeded", 1), ("cancelled", 1)], merge)
    assert not decision.merge and q.submitted == []


def test_the_merge_job_writes_the_dataset_and_records_what_is_missing(tmp_path: Path) -> None:
    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("failed"), Shard("winner")])
    to = tmp_path / "out.jsonl"
    automerge.save_settings(layout, automerge.settings(True, 3, to, "jsonl", True))
    autoretry.record_pending(layout, "777", 4, (), "merge", 3)
    result = autoround.merge_job(layout)
    assert result["state"] == "partial" and result["missing_shards"] == [1]
    manifest = json.loads((layout.merged / "manifest.json").read_text())
    assert verify_jsonl(to, manifest) is None
    assert automerge.load_result(layout) == result
    assert autoretry.load_pending(layout) is None  # nothing pending any more
    data = {"run_id": "r", "state": "failed", "counts": {}, "shards": [],
            "merge": automerge.view(layout)}
    lines = [line for line in status_text_lines(data) if "merge to" in line]
    assert lines == [f"  merge to {to}: partial; missing shards: 1"]


def test_the_merge_jobs_log_says_what_is_missing(tmp_path: Path, capsys) -> None:
    from synthbatch.control.cli import autoround as entry
    from tests.fakes import RUN_ID, TESTBED

    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("failed")])
    automerge.save_settings(layout, automerge.settings(True, 3, tmp_path / "o.jsonl",
                                                       "jsonl", True))
    layout.inputs.mkdir(mode=0o700)
    (layout.inputs / "profile.toml").write_text(TESTBED.read_text())
    assert entry.main(["--workspace", str(tmp_path / "ws"), RUN_ID, "--merge"]) == 0
    said = capsys.readouterr().out
    assert f"merge of run {RUN_ID}: partial {tmp_path / 'o.jsonl'} missing shards: 1" in said


def test_the_merge_job_without_allow_partial_says_why_nothing_was_merged(
        tmp_path: Path) -> None:
    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("failed")])
    automerge.save_settings(layout, automerge.settings(True, 3, tmp_path / "o.jsonl",
                                                       "jsonl", False))
    result = automerge.run_merge(layout)
    assert result["state"] == "failed" and "1" in result["reason"]
    assert not (tmp_path / "o.jsonl").exists()


def status_text_lines(data: Dict[str, Any]) -> List[str]:
    from synthbatch.control.cli.render import auto_lines

    return auto_lines(data)


def test_status_shows_attempts_of_the_budget_and_the_pending_job() -> None:
    row = {"index": 2, "state": "running", "records_done": 1, "records": 6, "attempt": 2,
           "job_id": "9_2", "reason": None}
    assert "attempt 2 of 3  job 9_2" in shard_line(row, 3)
    assert "attempt 2  job 9_2" in shard_line(row)
    data = {"auto_retry": {"job_id": "950", "action": "retry",
                           "story": "retrying (attempt 2 of 3)"}}
    assert status_text_lines(data) == [
        "  automatic job 950 pending (retry): retrying (attempt 2 of 3)"]
    first = {"auto_retry": {"job_id": "951", "action": "retry", "story": None}}
    assert status_text_lines(first) == [
        "  automatic job 951 pending (retry): waits for the shards' jobs to end"]


def test_runs_shows_the_story_of_a_run_waiting_on_its_round(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("failed")])
    automerge.save_settings(layout, automerge.settings(True, 3, None, "jsonl", False))
    autoretry.record_pending(layout, "950", 2, ["900"], "retry", 1)
    listed = list_runs(tmp_path)
    assert listed[0]["state"] == "failed"
    assert listed[0]["story"] == "retrying (attempt 2 of 3)"
    assert "retrying (attempt 2 of 3)" in runs_text(listed)


def test_the_round_python_is_checked_against_what_the_nodes_see(tmp_path: Path) -> None:
    python = sys.executable
    assert autoretry.python_visible(python, lambda _: True) is None
    assert "not on a shared filesystem" in autoretry.python_visible(python, lambda _: False)
    assert "not an executable absolute path" in autoretry.python_visible(
        "python3", lambda _: True)


def test_a_local_round_is_run_only_by_the_supervisor_its_record_names(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("failed")])
    assert not autoretry.due_locally(layout, "41")  # no record: no round
    autoretry.record_pending(layout, "41", 1, ["41", "42"])
    assert autoretry.due_locally(layout, "41") and autoretry.due_locally(layout, "42")
    assert not autoretry.due_locally(layout, "43")
    autoretry.record_pending(layout, "41", 2, (), "merge", 2)  # merging: no second round
    assert not autoretry.due_locally(layout, "41")


@pytest.mark.parametrize("extra, warned", [("", True), ("auto_retry = false\n", False)])
def test_plan_warns_when_the_nodes_may_not_see_the_rounds_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, warned: bool) -> None:
    from click.testing import CliRunner

    from synthbatch.control.cli.main import cli
    from synthbatch.control.runs.checks import Sight
    from tests.fakes import QUICKSTART, TESTBED

    python = tmp_path / "private" / "python"  # a Python only this login node has
    python.parent.mkdir()
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    real = Sight.shared
    monkeypatch.setattr(Sight, "shared", lambda self, path: path != python and
                        real(self, path))
    (tmp_path / "ws").mkdir()
    profile = tmp_path / "profile.toml"
    profile.write_text(TESTBED.read_text().replace('"/tmp/synthbatch-workspace"',
                                                   json.dumps(str(tmp_path / "ws"))))
    run = tmp_path / "run.toml"
    run.write_text(QUICKSTART.read_text().replace("max_attempts = 3\n",
                                                  "max_attempts = 3\n" + extra))
    result = CliRunner().invoke(cli, ["plan", str(run), "--profile", str(profile)])
    said = result.output
    assert (f"the control plane's Python {python} is not on a shared filesystem" in said) \
        is warned, said
    assert ("auto_retry = false" in said) is warned
