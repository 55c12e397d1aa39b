"""Retry: selection, resume source, idempotent attempts, the lock, one submission."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, TypeVar

import pytest
from click.testing import CliRunner

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import advance_attempt, load_attempt
from synthbatch.agent_stdlib.contracts import WinnerRecord
from synthbatch.agent_stdlib.statefile import publish_json_immutable
from synthbatch.control.config.loader import load_model
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.errors import Conflict, InvalidInput, NotFound, SchedulerRejected
from synthbatch.control.planning.planner import make_plan
from synthbatch.control.runs import retry as retrying
from synthbatch.control.runs.retry import RetryLock, resume_source, retry_run, select
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.runs.submit.arrays import Staged, commit_run, stage_run, submit_all
from synthbatch.control.slurm.scheduler import Scheduler
from tests.conftest import REPO
from tests.fakes import SbatchRecorder, create_attempt, first_record

T = TypeVar("T")


def _run(tmp_path: Path, agent_pyz: Path, shards: int = 6, max_array_size: Optional[int] = None,
         max_attempts: int = 3, resume: str = "auto"):
    run = load_model(REPO / "examples" / "fake-server.toml", RunConfig)
    run = run.model_copy(update={"records": shards * 4, "max_attempts": max_attempts,
                                 "resume": resume,
                                 "shards": run.shards.model_copy(update={"count": shards})})
    profile = load_model(REPO / "examples" / "profiles" / "testbed.toml", Profile)
    profile = profile.model_copy(update={"workspace": str(tmp_path / "ws")})
    plan = make_plan(run, profile, "retry-1", REPO / "examples",
                     max_array_size=max_array_size)
    staged = stage_run(Path(profile.workspace), plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    submit_all(staged, profile, Scheduler(runner=SbatchRecorder()), {i: 1 for i in range(shards)},
               implied=True)
    return staged, profile


def _end(staged: Staged, shard: int, attempt: int, state: str,
         partial: Optional[int] = None, records: Optional[List[int]] = None) -> None:
    """Drive an attempt to ``state`` as an agent would; write kept records when given."""
    path = staged.layout.attempt(shard, attempt).attempt_json
    if load_attempt(path) is None:  # a first attempt, as its submission implies it
        advance_attempt(path, states.RUNNING, first=first_record(staged.layout, shard))
    if load_attempt(path).state == states.CREATED:
        advance_attempt(path, states.SUBMITTED)
    if load_attempt(path).state == states.SUBMITTED:
        advance_attempt(path, states.RUNNING)
    if records is not None:
        out = staged.layout.attempt(shard, attempt).output
        out.mkdir(parents=True, exist_ok=True)
        (out / "records.jsonl").write_text("".join(json.dumps({"index": i}) + "\n"
                                                   for i in records))
    advance_attempt(path, state, reason=f"test {state}", partial_records=partial)


def _start(staged: Staged, shard: int) -> None:
    """Attempt 1 of ``shard`` recorded ``running``, as its agent does when it starts."""
    advance_attempt(staged.layout.attempt(shard, 1).attempt_json, states.RUNNING,
                    first=first_record(staged.layout, shard))


def _win(staged: Staged, shard: int, attempt: int = 1) -> None:
    winner = WinnerRecord(shard=shard, attempt=attempt, records=0, result_sha256="0" * 64,
                          files=(), created_at=1.0)
    publish_json_immutable(staged.layout.winner_json(shard), winner.to_dict())


@pytest.fixture
def failed_run(tmp_path: Path, agent_pyz: Path):
    """Six shards: 0, 2, 3, 5 won; 1 failed keeping 2 records; 4 failed keeping none."""
    staged, profile = _run(tmp_path, agent_pyz)
    for shard in (0, 2, 3, 5):
        _end(staged, shard, 1, states.SUCCEEDED)
        _win(staged, shard)
    _end(staged, 1, 1, states.FAILED, partial=2, records=[4, 5])
    _end(staged, 4, 1, states.FAILED)
    return staged, profile


# ----------------------------------------------------------------------------- selection


def test_select_takes_failed_and_cancelled_shards_without_winners(failed_run) -> None:
    staged, _ = failed_run
    selection = select(staged.layout, staged.plan)
    assert [(c.shard, c.attempt, c.previous) for c in selection.choices] == [(1, 2, 1),
                                                                             (4, 2, 1)]
    assert [(c.resume_from, c.resume_records) for c in selection.choices] == [(1, 2), (None, 0)]
    assert not selection.refused


def test_select_refuses_named_shards_that_won_or_run(failed_run) -> None:
    staged, _ = failed_run
    selection = select(staged.layout, staged.plan, [0, 1])
    assert selection.refused == {0: "shard 0 already has a winner"}
    with pytest.raises(Conflict, match="shard 0 already has a winner"):
        retry_run(staged.layout, failed_run[1], Scheduler(runner=SbatchRecorder()), [0, 1])
    with pytest.raises(NotFound, match="no shard 6"):
        select(staged.layout, staged.plan, [6])
    with pytest.raises(InvalidInput, match="--resume"):
        select(staged.layout, staged.plan, policy="sometimes")


def test_select_refuses_a_running_named_shard(tmp_path: Path, agent_pyz: Path) -> None:
    staged, _ = _run(tmp_path, agent_pyz, shards=2)
    _start(staged, 0)
    selection = select(staged.layout, staged.plan, [0, 1])
    assert selection.refused == {0: "shard 0 is running (attempt 1)",
                                 1: "shard 1 is submitted (attempt 1)"}
    assert select(staged.layout, staged.plan).choices == []  # unnamed: just skipped


def test_named_refusals_use_the_words_of_status(tmp_path: Path, agent_pyz: Path) -> None:
    from synthbatch.control.runs.status import verdict as norm

    staged, _ = _run(tmp_path, agent_pyz, shards=3)
    for shard in (0, 1):
        _start(staged, shard)
    verdicts = {0: ShardRow(0, "running", norm.COMPLETING_REASON, 1, None, 10),
                1: ShardRow(1, "cancelling", "cancel requested; squeue says RUNNING", 1, None,
                            10),
                2: ShardRow(2, "pending", "Priority", 1, None, 10)}
    selection = select(staged.layout, staged.plan, [0, 1, 2], verdicts=verdicts)
    assert selection.refused == {
        0: "shard 0: its job is still completing in Slurm (COMPLETING); retry in a few "
           "seconds",
        1: "shard 1 is cancelling (attempt 1): cancel requested; squeue says RUNNING",
        2: "shard 2 is pending (attempt 1): Priority"}


def test_auto_takes_failed_only_and_stops_at_max_attempts(tmp_path: Path,
                                                          agent_pyz: Path) -> None:
    staged, profile = _run(tmp_path, agent_pyz, shards=3, max_attempts=2)
    _end(staged, 0, 1, states.FAILED)
    _end(staged, 1, 1, states.CANCELLED)
    _end(staged, 2, 1, states.FAILED)
    selection = select(staged.layout, staged.plan, auto=True)
    assert [c.shard for c in selection.choices] == [0, 2]
    slurm = SbatchRecorder()
    retry_run(staged.layout, profile, Scheduler(runner=slurm), auto=True)
    _end(staged, 0, 2, states.FAILED)
    _end(staged, 2, 2, states.SUCCEEDED)
    _win(staged, 2, 2)
    selection = select(staged.layout, staged.plan, auto=True)
    assert selection.choices == []
    assert selection.exhausted == {0: "shard 0: 2 of 2 attempts used"}
    # a manual retry is the user's decision: not limited by max_attempts
    assert [c.shard for c in select(staged.layout, staged.plan).choices] == [0, 1]


def test_a_manual_retry_past_max_attempts_says_so(tmp_path: Path, agent_pyz: Path) -> None:
    # issue 34: a manual retry went to attempt 3 with max_attempts = 2 without a word
    staged, profile = _run(tmp_path, agent_pyz, shards=2, max_attempts=2)
    _end(staged, 0, 1, states.FAILED)
    _end(staged, 1, 1, states.FAILED)
    assert select(staged.layout, staged.plan).over_limit == {}  # attempt 2 is within
    retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()), shards=[0])
    _end(staged, 0, 2, states.FAILED)
    selection = select(staged.layout, staged.plan)
    assert [(c.shard, c.attempt) for c in selection.choices] == [(0, 3), (1, 2)]
    assert selection.over_limit == {
        0: "shard 0: attempt 3 goes past max_attempts = 2 (a manual retry is not bounded by it)"}
    from synthbatch.control.cli.retry import describe
    text = describe({"shards": [c.to_dict() for c in selection.choices], "submissions": [],
                     "exhausted": [], "skipped": [],
                     "over_limit": list(selection.over_limit.values())})
    assert "past the limit: shard 0: attempt 3 goes past max_attempts = 2" in text


def test_requeues_do_not_count_as_attempts(tmp_path: Path, agent_pyz: Path) -> None:
    staged, _ = _run(tmp_path, agent_pyz, shards=1, max_attempts=2)
    path = staged.layout.attempt(0, 1).attempt_json
    _start(staged, 0)
    for restart in (1, 2, 3):  # three requeues: same attempt, next restart epoch
        advance_attempt(path, states.RUNNING, restarts=restart)
    advance_attempt(path, states.FAILED, reason="x")
    choice = select(staged.layout, staged.plan, auto=True).choices
    assert [(c.shard, c.attempt) for c in choice] == [(0, 2)]


# ----------------------------------------------------------------------------- resume source


def test_resume_policies(tmp_path: Path, agent_pyz: Path) -> None:
    staged, _ = _run(tmp_path, agent_pyz, shards=1)
    layout, plan = staged.layout, staged.plan
    _end(staged, 0, 1, states.FAILED, partial=3, records=[0, 1, 2])
    assert resume_source(layout, plan, 0, [1], "auto") == (1, 3)
    assert resume_source(layout, plan, 0, [1], "always") == (1, 3)
    assert resume_source(layout, plan, 0, [1], "never") == (None, 0)
    # attempt 2 was lost (killed; the agent recorded no partial) but left 2 records
    (layout.attempt(0, 2).root).mkdir(parents=True)
    create_attempt(layout.attempt(0, 2).attempt_json, plan.run_id, 0, 2, resume_from=1)
    _end(staged, 0, 2, states.FAILED, partial=None, records=[0, 1, 2, 3])
    assert resume_source(layout, plan, 0, [1, 2], "auto") == (1, 3)  # trusts the records
    assert resume_source(layout, plan, 0, [1, 2], "always") == (2, 4)  # scans the output


def test_resume_prefers_the_latest_attempt_on_a_tie(tmp_path: Path, agent_pyz: Path) -> None:
    staged, _ = _run(tmp_path, agent_pyz, shards=1)
    layout = staged.layout
    _end(staged, 0, 1, states.FAILED, partial=2, records=[0, 1])
    layout.attempt(0, 2).root.mkdir(parents=True)
    create_attempt(layout.attempt(0, 2).attempt_json, "retry-1", 0, 2, resume_from=1)
    _end(staged, 0, 2, states.FAILED, partial=2, records=[0, 1])
    assert resume_source(layout, staged.plan, 0, [1, 2], "auto") == (2, 2)


# ----------------------------------------------------------------------------- retry_run


def test_retry_creates_attempt_two_and_submits_one_sparse_held_array(failed_run) -> None:
    staged, profile = failed_run
    slurm = SbatchRecorder()
    done = retry_run(staged.layout, profile, Scheduler(runner=slurm))
    assert [(c.shard, c.attempt) for c in done.submitted] == [(1, 2), (4, 2)]
    assert done.submissions == [{"number": 2, "job_id": "901", "shards": [1, 4]}]
    (sbatch,) = slurm.sbatch()
    assert "--array=1,4" in sbatch and "--hold" in sbatch
    assert ["scontrol", "release", "901"] == [c for c in slurm.calls
                                               if "release" in c][0][-3:]
    one = load_attempt(staged.layout.attempt(1, 2).attempt_json)
    four = load_attempt(staged.layout.attempt(4, 2).attempt_json)
    assert (one.state, one.job_id, one.submission, one.resume_from) == \
        ("submitted", "901_1", 2, 1)
    assert (four.job_id, four.resume_from) == ("901_4", None)
    record = json.loads(staged.layout.submission_json(2).read_text())
    assert record["attempts"] == {"1": 2, "4": 2} and record["released"] is True
    # nothing left: a second retry submits nothing
    again = retry_run(staged.layout, profile, Scheduler(runner=slurm))
    assert again.submitted == [] and len(slurm.sbatch()) == 1


def test_dry_run_writes_nothing(failed_run) -> None:
    staged, profile = failed_run
    slurm = SbatchRecorder()
    done = retry_run(staged.layout, profile, Scheduler(runner=slurm), dry_run=True)
    assert [c.shard for c in done.submitted] == [1, 4]
    assert slurm.calls == []
    assert not staged.layout.attempt(1, 2).root.exists()


def test_retry_splits_by_plan_array(tmp_path: Path, agent_pyz: Path) -> None:
    staged, profile = _run(tmp_path, agent_pyz, shards=5, max_array_size=2)
    for shard in (1, 4):
        _end(staged, shard, 1, states.FAILED)
    slurm = SbatchRecorder()
    done = retry_run(staged.layout, profile, Scheduler(runner=slurm))
    assert [s["shards"] for s in done.submissions] == [[1], [4]]
    assert [next(a for a in c if a.startswith("--array=")) for c in slurm.sbatch()] == \
        ["--array=1", "--array=0"]  # shard 4 is task 0 of the plan's third array
    assert load_attempt(staged.layout.attempt(4, 2).attempt_json).job_id.endswith("_0")


def _concurrently(count: int, call: Callable[[], T]) -> List[T]:
    """``call()`` in ``count`` threads that start together; their results (none raised)."""
    results: List[T] = []
    errors: List[BaseException] = []
    start = threading.Barrier(count)

    def one() -> None:
        try:
            start.wait(timeout=10)
            results.append(call())
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    return results


def test_concurrent_retries_converge_on_one_submission(failed_run) -> None:
    staged, profile = failed_run
    slurm = SbatchRecorder(delay_s=0.3)  # sbatch is slow: the others must wait on the lock
    results = _concurrently(4, lambda: retry_run(staged.layout, profile,
                                                 Scheduler(runner=slurm)))
    assert sorted(len(r.submitted) for r in results) == [0, 0, 0, 2]
    assert len(slurm.sbatch()) == 1
    assert sorted(p.name for p in staged.layout.submissions.glob("*.json")) == \
        ["0001.json", "0002.json"]
    assert not staged.layout.attempt(1, 3).root.exists()


def test_retries_that_refreshed_status_together_leave_the_second_nothing_to_do(
        failed_run) -> None:
    """Two ``retry --yes`` at the same moment (issue 28 item 7): both status refreshes saw
    attempt 1 failed; the second retry gets the lock after the first submitted attempt 2
    and must find nothing to do, not report attempt 2 "still recorded submitted" as damage
    (which made the CLI exit 4 with a repair hint)."""
    staged, profile = failed_run
    verdicts = {1: ShardRow(1, "failed", "test failed", 1, None, 10),
                4: ShardRow(4, "failed", "test failed", 1, None, 10)}
    slurm = SbatchRecorder(delay_s=0.3)  # the second waits on the lock meanwhile
    results = _concurrently(2, lambda: retry_run(staged.layout, profile,
                                                 Scheduler(runner=slurm), verdicts=verdicts))
    assert sorted(len(r.submitted) for r in results) == [0, 2]
    assert [r.selection.skipped for r in results] == [{}, {}]
    assert len(slurm.sbatch()) == 1
    # a verdict on the attempt the record names still counts: status could not record it
    still = select(staged.layout, staged.plan,
                   verdicts={1: ShardRow(1, "failed", "gone", 2, None, 10)})
    assert still.skipped == {1: "shard 1: status shows it failed but attempt 2 is still "
                                "recorded submitted"}


def test_lock_wait_is_bounded(failed_run) -> None:
    staged, profile = failed_run
    with RetryLock(staged.layout):
        started = time.monotonic()
        with pytest.raises(Conflict, match="another retry of this run is in progress"):
            retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()), lock_wait_s=0.3)
        assert time.monotonic() - started < 5
    assert "pid" in (staged.layout.root / "retry.lock").read_text()


def test_a_created_attempt_left_by_a_crashed_retry_is_submitted_not_replaced(
        failed_run, monkeypatch: pytest.MonkeyPatch) -> None:
    staged, profile = failed_run
    choice = select(staged.layout, staged.plan, [1]).choices
    retrying.create_attempts(staged.layout, staged.plan.run_id, choice)  # then "crashed"
    young = select(staged.layout, staged.plan)
    assert [c.shard for c in young.choices] == [4]  # attempt 2 of shard 1 may be in flight
    assert select(staged.layout, staged.plan, [1]).refused == {
        1: "shard 1: attempt 2 is being submitted"}
    later = time.time() + retrying.ABANDONED_AFTER_S + 1
    old = select(staged.layout, staged.plan, now=later)
    assert [(c.shard, c.attempt, c.existing) for c in old.choices] == [(1, 2, True),
                                                                       (4, 2, False)]
    monkeypatch.setattr(retrying.time, "time", lambda: later)
    done = retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()))
    assert [(c.shard, c.attempt) for c in done.submitted] == [(1, 2), (4, 2)]
    assert load_attempt(staged.layout.attempt(1, 2).attempt_json).resume_from == 1
    assert not staged.layout.attempt(1, 3).root.exists()


def test_a_submit_killed_before_sbatch_is_submitted_by_the_next_retry(
        tmp_path: Path, agent_pyz: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by the crash harness: the submission record was written (no job id yet), then
    # the process died before sbatch; status found no job to adopt and retry counted the
    # attempts as submitted: the shards stayed "created" forever
    from synthbatch.control.runs.submit import arrays as submitting
    from tests.fakes import Crash, crash_on_call

    run = load_model(REPO / "examples" / "fake-server.toml", RunConfig)
    profile = load_model(REPO / "examples" / "profiles" / "testbed.toml", Profile)
    plan = make_plan(run, profile, "retry-1", REPO / "examples")
    staged = stage_run(tmp_path / "ws", plan, {}, agent_pyz, "0" * 64)
    commit_run(staged, "slurm")
    sbatch = SbatchRecorder()
    monkeypatch.setattr(submitting, "sbatch_adopting", crash_on_call(submitting.sbatch_adopting, 1))
    with pytest.raises(Crash):
        submit_all(staged, profile, Scheduler(runner=sbatch), {i: 1 for i in range(3)})
    monkeypatch.undo()
    assert sbatch.sbatch() == [] and staged.layout.submission_json(1).exists()
    assert select(staged.layout, staged.plan).choices == []  # young: may still be in flight
    later = time.time() + retrying.ABANDONED_AFTER_S + 1
    monkeypatch.setattr(retrying.time, "time", lambda: later)
    done = retry_run(staged.layout, profile, Scheduler(runner=sbatch))
    assert [(c.shard, c.attempt) for c in done.submitted] == [(0, 1), (1, 1), (2, 1)]
    assert len(sbatch.sbatch()) == 1
    assert all(load_attempt(staged.layout.attempt(s, 1).attempt_json).state == "submitted"
               for s in range(3))


def test_a_retry_killed_after_making_the_attempt_folder_shows_the_attempt_before(
        failed_run, monkeypatch: pytest.MonkeyPatch) -> None:
    # found by the crash harness: mkdir attempt-0002, then killed before its record; status
    # showed the shard "unknown: no attempt record" forever (retry would have taken it,
    # but nothing said so)
    from synthbatch.control.runs.status.refresh import observe

    staged, profile = failed_run
    from tests.fakes import FakeSlurm

    staged.layout.attempt(1, 2).root.mkdir(mode=0o700)
    slurm = FakeSlurm()
    slurm.on("squeue")
    slurm.on("sacct")
    rows = observe(staged.layout, Scheduler(runner=slurm))["shards"]
    assert (rows[1]["state"], rows[1]["attempt"]) == ("failed", 1), rows[1]
    later = time.time() + retrying.ABANDONED_AFTER_S + 1
    monkeypatch.setattr(retrying.time, "time", lambda: later)
    done = retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()))
    assert [(c.shard, c.attempt) for c in done.submitted] == [(1, 2), (4, 2)]
    assert not staged.layout.attempt(1, 3).root.exists()


def test_a_rejected_sbatch_fails_the_new_attempts(failed_run) -> None:
    staged, profile = failed_run
    with pytest.raises(SchedulerRejected):
        retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder(refuse=True)))
    record = load_attempt(staged.layout.attempt(1, 2).attempt_json)
    assert record.state == "failed" and "sbatch was rejected" in record.reason
    # the next retry moves on to attempt 3 (attempt 2 never ran)
    done = retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()))
    assert [(c.shard, c.attempt, c.resume_from) for c in done.submitted] == [(1, 3, 1),
                                                                             (4, 3, None)]


def test_uncommitted_run_is_refused(tmp_path: Path, agent_pyz: Path) -> None:
    staged, profile = _run(tmp_path, agent_pyz, shards=1)
    os.chmod(staged.layout.run_json, 0o600)
    staged.layout.run_json.unlink()
    with pytest.raises(Conflict, match="never committed"):
        retry_run(staged.layout, profile, Scheduler(runner=SbatchRecorder()))


# ----------------------------------------------------------------------------- CLI


def _cli_env(staged: Staged, profile: Profile, tmp_path: Path, monkeypatch) -> Path:
    from synthbatch.control import api

    path = tmp_path / "profile.toml"
    path.write_text((REPO / "examples" / "profiles" / "testbed.toml").read_text()
                    .replace(_workspace_line(), f'workspace = "{profile.workspace}"'))
    slurm = SbatchRecorder()
    monkeypatch.setattr(api, "scheduler_for", lambda prof: Scheduler(runner=slurm))
    monkeypatch.setattr("synthbatch.control.runs.status.refresh.observe",
lambda layout, sched: {"shards": []})
    return path


def _workspace_line() -> str:
    for text in (REPO / "examples" / "profiles" / "testbed.toml").read_text().splitlines():
        if text.startswith("workspace"):
            return text
    raise AssertionError("no workspace line")


def test_cli_needs_yes_when_not_interactive(failed_run, tmp_path: Path, monkeypatch) -> None:
    from synthbatch.control.cli.main import cli

    staged, profile = failed_run
    prof = _cli_env(staged, profile, tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, ["retry", "retry-1", "--profile", str(prof)])
    assert result.exit_code == 2 and "--yes" in result.output
    assert not staged.layout.attempt(1, 2).root.exists()
    dry = CliRunner().invoke(cli, ["retry", "retry-1", "--dry-run", "--profile", str(prof)])
    assert dry.exit_code == 0 and "would submit" in dry.output and "shard 1: attempt 2, " \
        "resumes 2 record(s) of attempt 1" in dry.output
    done = CliRunner().invoke(cli, ["retry", "retry-1", "--yes", "--json", "--profile",
                                    str(prof)])
    assert done.exit_code == 0, done.output
    data: Dict = json.loads(done.stdout)
    assert [s["shard"] for s in data["shards"]] == [1, 4] and len(data["submissions"]) == 1
    named = CliRunner().invoke(cli, ["retry", "retry-1", "--shard", "0", "--yes", "--profile",
                                     str(prof)])
    assert named.exit_code == 4 and "shard 0 already has a winner" in named.output


def test_cli_prompts_on_a_terminal(failed_run, tmp_path: Path, monkeypatch) -> None:
    from synthbatch.control.cli import retry as cli_retry
    from synthbatch.control.cli.main import cli

    staged, profile = failed_run
    prof = _cli_env(staged, profile, tmp_path, monkeypatch)
    monkeypatch.setattr(cli_retry, "interactive", lambda: True)
    no = CliRunner().invoke(cli, ["retry", "retry-1", "--profile", str(prof)], input="n\n")
    assert no.exit_code == 0 and "aborted" in no.output
    assert not staged.layout.attempt(1, 2).root.exists()
    yes = CliRunner().invoke(cli, ["retry", "retry-1", "--profile", str(prof)], input="y\n")
    assert yes.exit_code == 0 and "submitted" in yes.output
    assert staged.layout.attempt(1, 2).root.exists()
