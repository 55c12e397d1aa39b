"""Runs sharing one Slurm array (benchmark cases of one shape): grouping, the batch
script's task -> run mapping, the joint submit, and recovery of a crashed one."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any, List, Tuple

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.control.bundle import sha256_file
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.arrays import array_chunks
from synthbatch.control.planning.planner import make_plan
from synthbatch.control.runs import shared
from synthbatch.control.runs.status.records import shard_scanner
from synthbatch.control.runs.submit.arrays import Staged, commit_run, load_submissions, stage_run
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import Crash, FileCluster, crash_on_call


def _profile(tmp_path: Path) -> Profile:
    profile = load_model(REPO / "examples" / "profiles" / "testbed.toml", Profile)
    return profile.model_copy(update={"workspace": str(tmp_path / "ws")})


def _plan(profile: Profile, run_id: str, shards: int = 3, first_task: int = 0,
          mem_mb: int = 0) -> Any:
    run = load_model(REPO / "examples" / "fake-server.toml", RunConfig)
    run = run.model_copy(update={"records": 10 * shards, "shards": run.shards.model_copy(
        update={"count": shards})})
    plan = make_plan(run, profile, run_id, REPO / "examples", max_array_size=16)
    if mem_mb:
        plan = plan.replace(resources=dataclasses.replace(plan.resources, mem_mb=mem_mb))
    return plan.replace(arrays=array_chunks(shards, 16, first_task))


def _two_runs(tmp_path: Path, agent_pyz: Path) -> Tuple[Profile, List[Staged]]:
    profile = _profile(tmp_path)
    staged = []
    for run_id, first in (("case-a", 0), ("case-b", 3)):
        stage = stage_run(Path(profile.workspace), _plan(profile, run_id, first_task=first),
                          {}, agent_pyz, sha256_file(agent_pyz))
        commit_run(stage, "slurm")
        staged.append(stage)
    return profile, staged


def test_runs_of_one_shape_are_grouped_at_consecutive_task_offsets(tmp_path: Path) -> None:
    profile = _profile(tmp_path)
    plans = [_plan(profile, "a"), _plan(profile, "b", mem_mb=4096), _plan(profile, "c"),
             _plan(profile, "d")]
    assert shared.groups(plans, 16) == [[(0, 0), (2, 3), (3, 6)], [(1, 0)]]
    # a group closes where the next run's tasks would reach MaxArraySize
    assert shared.groups(plans, 7) == [[(0, 0), (2, 3)], [(1, 0)], [(3, 0)]]
    assert shared.groups([_plan(profile, "big", shards=9), plans[0]], 8) == [
        [(0, 0)], [(1, 0)]]  # a run too large for one array is alone, split by its plan
    assert shared.groups(plans, 1) == [[(0, 0)], [(1, 0)], [(2, 0)], [(3, 0)]]


def test_one_held_array_carries_both_runs_at_their_offsets(tmp_path: Path,
                                                            agent_pyz: Path) -> None:
    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    cluster = FileCluster(tmp_path / "cluster.json")
    records = shared.submit_shared([a, b], profile, Scheduler(runner=cluster))
    jobs = cluster.jobs()
    assert list(jobs) == ["1000"] and not jobs["1000"]["held"]
    assert sorted(jobs["1000"]["tasks"], key=int) == [str(t) for t in range(6)]
    assert jobs["1000"]["name"] == shared.shared_job_name(("case-a/1", "case-b/1"))
    assert [(r.job_id, r.tasks, r.group, r.released) for r in records] == [
        ("1000", (0, 1, 2), ("case-a/1", "case-b/1"), True),
        ("1000", (3, 4, 5), ("case-a/1", "case-b/1"), True)]
    assert [shard_scanner(s.layout)(i).attempt.job_id  # implied by each member's record
            for s in (a, b) for i in range(3)] == [f"1000_{t}" for t in range(6)]
    assert [load_attempt(s.layout.attempt(i, 1).attempt_json)
            for s in (a, b) for i in range(3)] == [None] * 6
    assert load_submissions(b.layout) == [records[1]]


def _script_run(script: Path, task: int, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_JOB_ID": "1000",
           "SLURM_TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          check=False, timeout=60)


def test_the_batch_script_runs_the_task_s_run_and_logs_there(tmp_path: Path,
                                                               agent_pyz: Path) -> None:
    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    echo = tmp_path / "python"  # stands for the interpreter: prints what the agent gets
    echo.write_text("#!/bin/sh\necho \"$@\"\n")
    echo.chmod(0o755)
    profile = profile.model_copy(update={"python": str(echo)})
    shared.submit_shared([a, b], profile, Scheduler(runner=FileCluster(tmp_path / "c.json")))
    script = b.layout.submission_script(1)
    assert script.read_bytes() == a.layout.submission_script(1).read_bytes()
    assert f"#SBATCH --output={a.layout.root}/logs/shared-%A_%a.out" in script.read_text()
    for task, stage in ((1, a), (4, b)):
        done = _script_run(script, task, tmp_path)
        assert done.returncode == 0, done.stderr
        said = (stage.layout.slurm_logs / f"slurm-1000_{task}.out").read_text().split()
        assert said[said.index("--run-dir") + 1] == str(stage.layout.root)
        assert said[said.index("--plan-sha256") + 1] == stage.plan_sha256
        assert said[said.index("--array-index") + 1] == "0"
    done = _script_run(script, 6, tmp_path)
    assert done.returncode == 2 and "belongs to no run" in done.stderr


# write_json_atomic's calls: a, b without a job id (1, 2); a, b with it (3, 4); a, b
# released (5, 6); the release is between 4 and 5
@pytest.mark.parametrize("where,call", [("write_json_atomic", 3), ("write_json_atomic", 4),
                                        ("write_json_atomic", 5), ("write_json_atomic", 6)])
def test_recovery_from_either_run_finishes_the_whole_group(
        tmp_path: Path, agent_pyz: Path, monkeypatch, where: str, call: int) -> None:
    from synthbatch.control.runs.status.refresh import observe

    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    cluster = FileCluster(tmp_path / "cluster.json")
    real = getattr(shared, where)
    monkeypatch.setattr(shared, where, crash_on_call(real, call))
    with pytest.raises(Crash):
        shared.submit_shared([a, b], profile, Scheduler(runner=cluster))
    monkeypatch.setattr(shared, where, real)
    assert cluster.jobs()["1000"]["held"] == (call < 5)
    later = load_submissions(a.layout)[0].submitted_at + 3600
    data = observe(b.layout, Scheduler(runner=cluster), now=later)  # b: the later member
    assert any("job 1000 released" in note for note in data["notes"]), data["notes"]
    assert not cluster.jobs()["1000"]["held"]
    for stage, first in ((a, 0), (b, 3)):
        record, = load_submissions(stage.layout)
        assert (record.job_id, record.released) == ("1000", True)
        attempts = [shard_scanner(stage.layout)(i).attempt for i in range(3)]
        assert [(x.state, x.job_id) for x in attempts] == [
            ("submitted", f"1000_{first + i}") for i in range(3)]


def test_recovery_never_cancels_a_shared_job(tmp_path: Path, agent_pyz: Path,
                                             monkeypatch) -> None:
    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    cluster = FileCluster(tmp_path / "cluster.json")
    real = shared.write_json_atomic
    monkeypatch.setattr(shared, "write_json_atomic", crash_on_call(real, 3))
    with pytest.raises(Crash):
        shared.submit_shared([a, b], profile, Scheduler(runner=cluster))
    monkeypatch.setattr(shared, "write_json_atomic", real)
    name = cluster.jobs()["1000"]["name"]  # a duplicate of the same name (a lost answer)
    cluster(["sbatch", "--parsable", "--hold", f"--job-name={name}", "--array=0-5", "x"], 5)
    record, = load_submissions(a.layout)
    notes = shared.recover_shared(a.layout, Scheduler(runner=cluster), record,
                                  now=record.submitted_at + 3600)
    assert notes == [f"shared array {name}: several jobs (1000, 1001); none adopted: "
                     "cancel the duplicate by hand"]
    jobs = cluster.jobs()
    assert all(t["state"] == "PENDING" for j in jobs.values() for t in j["tasks"].values())


def test_status_and_cancel_of_one_run_touch_only_its_tasks(tmp_path: Path,
                                                           agent_pyz: Path) -> None:
    from synthbatch.control.runs.cancel import cancel_run
    from synthbatch.control.runs.status.refresh import observe

    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    cluster = FileCluster(tmp_path / "cluster.json")
    sched = Scheduler(runner=cluster)
    shared.submit_shared([a, b], profile, sched)
    for task in range(6):
        cluster.set("1000", task, "RUNNING")
    seen = observe(a.layout, sched)
    assert [(s["state"], s["job_id"]) for s in seen["shards"]] == [
        ("running", f"1000_{t}") for t in range(3)]
    done = cancel_run(a.layout, sched, wait_s=5.0, sleep=lambda s: None)
    assert done["scancelled"] == ["1000_0", "1000_1", "1000_2"]  # never the array 1000
    assert done["converged"]
    tasks = cluster.jobs()["1000"]["tasks"]
    assert [tasks[str(t)]["state"] for t in range(6)] == ["CANCELLED"] * 3 + ["RUNNING"] * 3
    assert {s["state"] for s in observe(b.layout, sched)["shards"]} == {"running"}
    assert json.loads(b.layout.submission_json(1).read_text())["job_name"].startswith(
        "synthbatch-shared-")


def test_gpu_hours_of_a_run_count_only_its_own_tasks_of_a_shared_array(
        tmp_path: Path, agent_pyz: Path) -> None:
    from synthbatch.control.runs.status.totals import totals

    profile, (a, b) = _two_runs(tmp_path, agent_pyz)
    shared.submit_shared([a, b], profile, Scheduler(runner=FileCluster(tmp_path / "c.json")))

    class Usage(Scheduler):
        asked: List[List[str]] = []

        def usage(self, job_ids):  # noqa: ANN001, ANN201 - what sacct would be asked
            self.asked.append(list(job_ids))
            return None

    sched = Usage()
    totals(b.layout, {"state": "succeeded"}, sched, jobs=lambda: ["1000_3", "1000_4", "1000_5"])
    assert sched.asked == [["1000_3", "1000_4", "1000_5"]]  # not the array 1000: a's too
