"""Submit splits a run into one held array per MaxArraySize chunk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.planner import make_plan
from synthbatch.control.runs.submit.arrays import array_groups, commit_run, stage_run, submit_all
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import Crash, SbatchRecorder, crash_on_call


def _first(staged, profile, runner, count: int = 5):
    """A submit's first attempts (no records: their submission records imply them)."""
    return submit_all(staged, profile, Scheduler(runner=runner), {i: 1 for i in range(count)},
                      implied=True)


def _shown(layout, count: int = 5):
    """(state, job id) of each shard as status reads it."""
    from synthbatch.control.runs.status.records import shard_scanner

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


def _committed(tmp_path: Path, agent_pyz: Path, max_array_size: int):
    """A staged and committed run of 5 shards, before any sbatch; and its profile."""
    plan, profile = _plan(tmp_path, max_array_size)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    return staged, profile


def test_array_groups_map_shards_to_task_ids(tmp_path: Path) -> None:
    plan, _ = _plan(tmp_path, 2)
    assert array_groups(plan, [0, 1, 2, 3, 4]) == [(0, {0: 0, 1: 1}), (1, {2: 0, 3: 1}),
                                                    (2, {4: 0})]
    assert array_groups(plan, [3]) == [(1, {3: 1})]


def test_submit_all_sends_one_held_array_per_chunk(tmp_path: Path, agent_pyz: Path) -> None:
    staged, profile = _committed(tmp_path, agent_pyz, 2)
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
    from synthbatch.control.runs.submit import arrays as submit
    from synthbatch.control.slurm.parsers import JobRow

    staged, profile = _committed(tmp_path, agent_pyz, 2)
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
    from synthbatch.control.errors import SchedulerRejected
    from synthbatch.control.runs.submit import arrays as submit

    staged, profile = _committed(tmp_path, agent_pyz, 2)
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
    from synthbatch.control.runs.cancel import scancel_targets

    staged, profile = _committed(tmp_path, agent_pyz, 2)
    _first(staged, profile, SbatchRecorder(next_id=700))
    every = {"701_0", "701_1", "702_0", "702_1", "703_0"}
    assert scancel_targets(staged.layout, staged.plan.arrays, every) == ["701", "702", "703"]
    assert scancel_targets(staged.layout, staged.plan.arrays, every - {"702_1"}) == \
        ["701", "703", "702_0"]


def test_first_attempts_have_no_record_and_are_as_their_submission_implies(
        tmp_path: Path, agent_pyz: Path, monkeypatch) -> None:
    from synthbatch.control.runs.status.records import UNSUBMITTED, shard_scanner
    from synthbatch.control.runs.submit import arrays as submit

    staged, profile = _committed(tmp_path, agent_pyz, 2)
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
    from synthbatch.control.errors import SchedulerRejected
    from synthbatch.control.runs.submit import arrays as submit
    from synthbatch.control.slurm.runner import CommandResult

    staged, profile = _committed(tmp_path, agent_pyz, 2)
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


def _withdrawing(staged, profile, runner, count: int = 5):
    """A new run's submit (``api.submit``): a run Slurm refuses is not kept."""
    return submit_all(staged, profile, Scheduler(runner=runner), {i: 1 for i in range(count)},
                      implied=True, withdraw=True)


def test_a_run_whose_sbatch_slurm_refused_is_not_kept(tmp_path: Path, agent_pyz: Path) -> None:
    """Before: run.json stayed, the run read ``running`` forever with its shards "created
    ... not submitted", and as the latest run a bare ``wait`` never ended."""
    from synthbatch.control.errors import SchedulerRejected

    staged, profile = _committed(tmp_path, agent_pyz, 100)
    runner = SbatchRecorder(refuse=True)
    with pytest.raises(SchedulerRejected) as raised:
        _withdrawing(staged, profile, runner)
    assert raised.value.message == ("sbatch failed: sbatch: error: invalid partition "
                                    "(nothing was submitted: run arr-1 was not kept)")
    assert raised.value.hint == "fix the profile or the flags Slurm refused, then submit again"
    assert not staged.layout.root.exists()
    assert list((Path(profile.workspace) / "runs").iterdir()) == []
    assert [c[0].rsplit("/", 1)[-1] for c in runner.calls] == ["sbatch"]  # nothing to cancel


def test_a_refused_chunk_cancels_the_held_arrays_before_it_and_keeps_no_run(
        tmp_path: Path, agent_pyz: Path) -> None:
    from synthbatch.control.errors import SchedulerRejected

    staged, profile = _committed(tmp_path, agent_pyz, 2)
    runner = SbatchRecorder(next_id=700, fail_on=3)
    with pytest.raises(SchedulerRejected, match="run arr-1 was not kept"):
        _withdrawing(staged, profile, runner)
    assert [c[0].rsplit("/", 1)[-1] for c in runner.calls] == ["sbatch"] * 3 + ["scancel"]
    assert runner.calls[-1][1:] == ["701", "702"]  # held, never released
    assert not staged.layout.root.exists()


def test_a_refused_run_is_kept_when_its_held_arrays_cannot_be_cancelled(
        tmp_path: Path, agent_pyz: Path) -> None:
    from synthbatch.control.errors import SchedulerRejected
    from synthbatch.control.slurm.runner import CommandResult

    staged, profile = _committed(tmp_path, agent_pyz, 2)
    sbatch = SbatchRecorder(next_id=700, fail_on=3)

    def runner(argv, timeout):  # noqa: ANN001 - the Runner protocol
        if argv[0].endswith("scancel"):
            return CommandResult(argv, 1, "", "scancel: error: Unable to contact slurm "
                                              "controller (connect failure)\n")
        return sbatch(argv, timeout)

    with pytest.raises(SchedulerRejected) as raised:
        _withdrawing(staged, profile, runner)
    assert "not kept" not in raised.value.message
    assert staged.layout.run_json.exists()  # as before: the held arrays are released
    assert _shown(staged.layout)[:4] == [("submitted", j) for j in
                                         ("701_0", "701_1", "702_0", "702_1")]
