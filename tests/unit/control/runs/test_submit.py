"""Submit splits a run into one held array per MaxArraySize chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_stdlib.attempts import load_attempt
from control.config.loader import load_model
from control.config.profile import Profile
from control.config.run import RunConfig
from control.planning.planner import make_plan
from control.runs.submit import array_groups, commit_run, stage_run, submit_all
from control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import Crash, SbatchRecorder, crash_on_call


def _first(staged, profile, runner, count: int = 5):
    """A submit's first attempts (no records: their submission records imply them)."""
    return submit_all(staged, profile, Scheduler(runner=runner), {i: 1 for i in range(count)},
                      implied=True)


def _shown(layout, count: int = 5):
    """(state, job id) of each shard as status reads it."""
    from control.runs.store import shard_scanner

    scan = shard_scanner(layout)
    return [(v.attempt.state, v.attempt.job_id) if v.attempt else None
            for v in (scan(i) for i in range(count))]


def _plan(tmp_path: Path, max_array_size: int):
    run = load_model(REPO / "examples" / "fake-server.toml", RunConfig)
    run = run.model_copy(update={"records": 50, "shards": run.shards.model_copy(
        update={"count": 5})})
    profile = load_model(REPO / "examples" / "profiles" / "testbed.toml", Profile)
    profile = profile.model_copy(update={"workspace": str(tmp_path / "ws")})
    return make_plan(run, profile, "arr-1", REPO / "examples",
                     max_array_size=max_array_size), profile


def test_array_groups_map_shards_to_task_ids(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, 2)
    assert array_groups(plan, [0, 1, 2, 3, 4]) == [(0, {0: 0, 1: 1}), (1, {2: 0, 3: 1}),
                                                    (2, {4: 0})]
    assert array_groups(plan, [3]) == [(1, {3: 1})]


def test_submit_all_sends_one_held_array_per_chunk(tmp_path: Path, agent_pyz: Path) -> None:
    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    runner = SbatchRecorder(next_id=700)
    records = _first(staged, profile, runner)
    sbatch = [c for c in runner.calls if c[0].endswith("sbatch")]
    assert [c[3] for c in sbatch] == ["--array=0-1", "--array=0-1", "--array=0"]
    assert [r.job_id for r in records] == ["701", "702", "703"]
    assert [r.number for r in records] == [1, 2, 3]
    scripts = [staged.layout.submission_script(n).read_text() for n in (1, 2, 3)]
    assert [("--array-index 0" in s, "--array-index 1" in s, "--array-index 2" in s)
            for s in scripts] == [(True, False, False), (False, True, False),
                                  (False, False, True)]
    assert [job for _, job in _shown(staged.layout)] == \
        ["701_0", "701_1", "702_0", "702_1", "703_0"]
    assert list((staged.layout.root / "shards").iterdir()) == []  # nothing per shard
    second = json.loads(staged.layout.submission_json(2).read_text())
    assert second["attempts"] == {"2": 1, "3": 1} and second["released"] is True


def test_recovery_of_a_crashed_submit_releases_every_array(
        tmp_path: Path, agent_pyz: Path, monkeypatch) -> None:
    from control.runs import submit
    from control.slurm.parsers import JobRow

    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    real = submit._release_held  # dies after every array's sbatch, before any release
    monkeypatch.setattr(submit, "_release_held", crash_on_call(real, 1))
    runner = SbatchRecorder(next_id=700)
    with pytest.raises(Crash):
        _first(staged, profile, runner)
    monkeypatch.setattr(submit, "_release_held", real)
    records = submit.load_submissions(staged.layout)
    assert [(r.job_id, r.released) for r in records] == [
        ("701", False), ("702", False), ("703", False)]
    # each record's job id implies its attempts submitted, with their tasks' job ids
    assert _shown(staged.layout) == [("submitted", j) for j in
                                     ("701_0", "701_1", "702_0", "702_1", "703_0")]
    rows = [JobRow("701_[0-1]", "PENDING", "JobHeldUser"),
            JobRow("702_[0-1]", "PENDING", "JobHeldUser"), JobRow("703_0", "PENDING",
                                                                "JobHeldUser")]
    notes = submit.recover_submissions(staged.layout, Scheduler(runner=runner), True, records,
                                       rows, now=records[-1].submitted_at + 3600)
    assert notes == [f"submission {n}: job {j} released" for n, j in
                     ((1, 701), (2, 702), (3, 703))]
    assert [load_attempt(staged.layout.attempt(i, 1).attempt_json) for i in range(5)] == \
        [None] * 5  # recovery writes nothing per shard either
    assert runner.calls[-1][-2:] == ["release", "703"]


def test_arrays_held_before_a_failed_sbatch_are_released_and_the_error_raised(
        tmp_path: Path, agent_pyz: Path) -> None:
    from control.errors import SchedulerRejected
    from control.runs import submit

    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    runner = SbatchRecorder(next_id=700, fail_on=3)
    with pytest.raises(SchedulerRejected):
        _first(staged, profile, runner)
    records = submit.load_submissions(staged.layout)
    assert [(r.job_id, r.released) for r in records] == [("701", True), ("702", True),
                                                          (None, False)]
    assert _shown(staged.layout) == [("submitted", j) for j in
                                     ("701_0", "701_1", "702_0", "702_1")] + \
        [("created", None)]
    jobs = [load_attempt(staged.layout.attempt(i, 1).attempt_json) for i in range(5)]
    assert jobs[:4] == [None] * 4  # implied by their records
    assert jobs[4].state == "created"  # left for a retry, as a retry's own are


def test_cancel_folds_the_tasks_of_a_split_array_into_its_job_id(
        tmp_path: Path, agent_pyz: Path) -> None:
    from control.runs.cancel import scancel_targets

    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    _first(staged, profile, SbatchRecorder(next_id=700))
    every = {"701_0", "701_1", "702_0", "702_1", "703_0"}
    assert scancel_targets(staged.layout, plan.arrays, every) == ["701", "702", "703"]
    assert scancel_targets(staged.layout, plan.arrays, every - {"702_1"}) == \
        ["701", "703", "702_0"]


def test_first_attempts_have_no_record_and_are_as_their_submission_implies(
        tmp_path: Path, agent_pyz: Path, monkeypatch) -> None:
    from control.runs import submit
    from control.runs.store import UNSUBMITTED, shard_scanner

    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    layout = staged.layout
    assert list((layout.root / "shards").iterdir()) == []
    assert _shown(layout) == [("created", None)] * 5  # committed, no submission record yet
    seen = []
    real = submit.sbatch_adopting

    def looking(*args, **kwargs):  # what status reads while sbatch is being asked
        scan = shard_scanner(layout)
        seen.append([(v.attempt.state, v.attempt.reason) if v.attempt else None
                     for v in (scan(i) for i in range(5))])
        return real(*args, **kwargs)

    monkeypatch.setattr(submit, "sbatch_adopting", looking)
    records = _first(staged, profile, SbatchRecorder(next_id=700))
    assert seen[0] == [("created", UNSUBMITTED)] * 5
    assert _shown(layout) == [("submitted", j) for j in
                              ("701_0", "701_1", "702_0", "702_1", "703_0")]
    view = shard_scanner(layout)(2)
    assert view.attempt.updated_at == records[1].submitted_at
    assert (view.attempt.number, view.problem, view.progress) == (1, None, None)
    assert list((layout.root / "shards").iterdir()) == []


def test_a_release_that_fails_leaves_the_arrays_released_before_it_recorded(
        tmp_path: Path, agent_pyz: Path) -> None:
    from control.errors import SchedulerRejected
    from control.runs import submit
    from control.slurm.runner import CommandResult

    plan, profile = _plan(tmp_path, 2)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    sbatch = SbatchRecorder(next_id=700)

    def runner(argv, timeout):  # noqa: ANN001 - the Runner protocol
        if argv[1:] == ["release", "702"]:
            return CommandResult(argv, 1, "", "scontrol: error: Invalid job id specified\n")
        return sbatch(argv, timeout)

    with pytest.raises(SchedulerRejected):
        _first(staged, profile, runner)
    records = submit.load_submissions(staged.layout)
    assert [(r.job_id, r.released) for r in records] == [("701", True), ("702", False),
                                                          ("703", False)]
