"""Exit statuses scripts can trust: ``wait``, ``status --exit-status``, the outcome table.

(``submit --wait`` and ``wait`` on real runs: tests/integration/test_first_hour_slurm.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.control.errors import (
    RUN_CANCELLED,
    RUN_FAILED,
    RUN_STUCK,
    SCHEDULER_UNAVAILABLE,
    STILL_RUNNING,
    Conflict,
    RunCancelled,
    RunFailed,
    SchedulerUnavailable,
    StillRunning,
)
from synthbatch.control.runs.status.watch import outcome
from tests.fakes import Shard, fake_slurm_bin, invoke, make_run, profile_with_bin

RUN = "obs-20240101-000000-abcdef"


def snapshot(state: str, **counts: int) -> dict:
    return {"run_id": RUN, "state": state, "counts": counts, "records": 30,
            "records_done": 10, "failures": [{"shard": 2, "state": "failed",
                                              "reason": "job hit its time limit (TIMEOUT)"}]}


@pytest.mark.parametrize("state, counts, error", [
    ("succeeded", {"succeeded": 3}, None),
    ("failed", {"succeeded": 1, "failed": 1, "cancelled": 1}, RunFailed),
    ("failed", {"succeeded": 2, "lost": 1}, RunFailed),
    ("cancelled", {"succeeded": 2, "cancelled": 1}, RunCancelled),
    ("running", {"running": 3}, StillRunning),
    ("uncommitted", {}, Conflict),
])
def test_outcome_of_each_final_state(state: str, counts: dict, error: type) -> None:
    found = outcome(snapshot(state, **counts))
    assert (found is None) if error is None else isinstance(found, error)


def test_outcome_messages_name_the_run_and_the_first_failure() -> None:
    failed = outcome(snapshot("failed", succeeded=2, failed=1))
    assert failed.message == (f"run {RUN} failed: 1 of 3 shard(s) failed (shard 2: job hit "
                              f"its time limit (TIMEOUT))")
    assert failed.hint == f"synthbatch status {RUN}; synthbatch retry {RUN}"
    assert failed.exit_code == RUN_FAILED == 6
    assert outcome(snapshot("cancelled", cancelled=3)).exit_code == RUN_CANCELLED == 7


def test_a_run_that_is_not_over_only_fails_a_wait() -> None:
    assert outcome(snapshot("running", running=3), waited=False) is None
    late = outcome(snapshot("running", running=3))
    assert late.exit_code == STILL_RUNNING == 8
    assert late.message == f"run {RUN} is still running (10/30 records) after the wait's " \
                           f"time limit"
    down = outcome({**snapshot("running", running=3), "scheduler_error": "squeue failed: x",
                    "scheduler_hint": "is slurmctld up?"})
    assert isinstance(down, SchedulerUnavailable) and down.exit_code == SCHEDULER_UNAVAILABLE


@pytest.mark.parametrize("shards, code", [
    ([Shard("winner"), Shard("winner")], 0),
    ([Shard("winner"), Shard("failed", reason="preflight: model missing")], 6),
    ([Shard("winner"), Shard("cancelled", reason="cancelled")], 7),
    ([Shard("failed", reason="x"), Shard("cancelled", reason="y")], 6),  # failed wins
])
def test_wait_exit_status_of_a_run_that_ended(workspace: Path, profile_file: Path,
                                              shards: list, code: int) -> None:
    make_run(workspace, shards)  # settled by its records: no Slurm needed
    result = invoke("wait", RUN, "--profile", str(profile_file))
    assert result.exit_code == code, result.output
    assert result.stdout.startswith(f"run {RUN}: ")  # the final status
    if code:
        assert result.stderr.splitlines()[-1].startswith(f"synthbatch: error: run {RUN} ")


def test_wait_json_is_the_final_status_and_the_error(workspace: Path,
                                                     profile_file: Path) -> None:
    make_run(workspace, [Shard("winner"), Shard("failed", reason="preflight: model missing")])
    result = invoke("wait", "--profile", str(profile_file), "--json")  # the latest run
    assert result.exit_code == 6
    assert json.loads(result.stdout)["state"] == "failed"
    error = json.loads(result.stderr.splitlines()[-1])["error"]
    assert error["code"] == "run_failed" and "preflight: model missing" in error["message"]


def test_wait_json_writes_nothing_but_its_json_error_to_stderr(workspace: Path,
                                                               profile_file: Path) -> None:
    """Progress lines went to stderr before the JSON error: stderr did not parse."""
    make_run(workspace, [Shard("failed", reason="preflight: model missing")])
    for argv in (["wait", RUN, "--json"], ["--json", "wait", RUN]):
        result = invoke(*argv, "--profile", str(profile_file))
        assert result.exit_code == 6, result.output
        assert json.loads(result.stderr)["error"]["code"] == "run_failed", result.stderr
        assert json.loads(result.stdout)["state"] == "failed"


def test_wait_timeout_while_running_exits_8(tmp_path: Path, workspace: Path,
                                            profile_file: Path) -> None:
    make_run(workspace, [Shard("running")])
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_0|RUNNING|None'")
    result = invoke("wait", RUN, "--timeout", "0", "--profile",
                    profile_with_bin(profile_file, folder))
    assert result.exit_code == 8, result.output
    assert "is still running (0/10 records) after the wait's time limit" in result.stderr


def test_wait_while_slurm_is_unreachable_exits_5(tmp_path: Path, workspace: Path,
                                                 profile_file: Path) -> None:
    make_run(workspace, [Shard("running")])
    folder = fake_slurm_bin(tmp_path, squeue="echo 'Unable to contact slurm controller "
                                             "(connect failure)' >&2; exit 1")
    result = invoke("wait", RUN, "--timeout", "0", "--profile",
                    profile_with_bin(profile_file, folder))
    assert result.exit_code == 5, result.output


def test_wait_prints_progress_lines_on_stderr_unless_quiet(workspace: Path,
                                                           profile_file: Path) -> None:
    make_run(workspace, [Shard("winner")])
    loud = invoke("wait", RUN, "--profile", str(profile_file))
    quiet = invoke("wait", RUN, "--profile", str(profile_file), "--quiet")
    assert f"run {RUN}: succeeded" in loud.stderr and quiet.stderr == ""
    assert loud.stdout == quiet.stdout


@pytest.mark.parametrize("flags, code", [([], 0), (["--exit-status"], 6),
                                         (["--watch", "--exit-status"], 6),
                                         (["--json", "--exit-status"], 6), (["--json"], 0)])
def test_status_exit_status(workspace: Path, profile_file: Path, flags: list,
                            code: int) -> None:
    make_run(workspace, [Shard("failed", reason="x")])
    result = invoke("status", RUN, *flags, "--profile", str(profile_file))
    assert result.exit_code == code, result.output


def test_status_json_of_a_settled_run_is_the_api_status(workspace: Path,
                                                        profile_file: Path) -> None:
    """Printed from the settled index (the second status), ``status --json`` still carries
    what the API's status says: backend, blocked, totals, record failures."""
    from synthbatch.control import api

    make_run(workspace, [Shard("winner", progress=10), Shard("failed", "x", progress=3,
                                                          updated_at=1.0)])
    first = invoke("status", RUN, "--json", "--profile", str(profile_file))
    again = invoke("status", RUN, "--json", "--profile", str(profile_file))
    assert first.exit_code == again.exit_code == 0, again.output
    data = json.loads(again.stdout)
    assert data == json.loads(first.stdout) == api.status(RUN, str(profile_file)).to_dict()
    assert {"backend", "blocked", "totals", "record_failures"} <= set(data)
    assert data["totals"]["elapsed_s"] is not None
    assert (workspace / "runs" / RUN / "observer" / "settled.json").exists()


def test_outcome_of_a_run_whose_open_shards_can_never_start() -> None:
    never = {"reason": "PartitionTimeLimit", "shards": [1], "never": True,
             "hint": "the time limit is above the partition's MaxTime"}
    waiting = {"reason": "ReqNodeNotAvail", "shards": [2], "never": False, "hint": "x"}
    stuck = outcome({**snapshot("running", succeeded=1, pending=1), "blocked": [never]},
                    waited=False)
    assert stuck.exit_code == RUN_STUCK == 9 and stuck.code == "run_stuck"
    assert stuck.message.startswith(f"run {RUN} can never finish: 1 of 2 shard(s) pending "
                                    "with a reason Slurm keeps (shard 1: PartitionTimeLimit")
    assert stuck.hint == f"synthbatch cancel {RUN}"
    # a shard still running, or one waiting for something outside the run: not stuck
    assert isinstance(outcome({**snapshot("running", running=1, pending=1),
                               "blocked": [never]}), StillRunning)
    assert isinstance(outcome({**snapshot("running", pending=2),
                               "blocked": [never, waiting]}), StillRunning)


def test_wait_on_a_run_that_can_never_start_shows_why_and_exits_9(
        tmp_path: Path, workspace: Path, profile_file: Path) -> None:
    """Before: ``1 pending`` progress lines until ``--timeout`` (exit 8), or forever."""
    make_run(workspace, [Shard("submitted")])
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_0|PENDING|PartitionTimeLimit'")
    result = invoke("wait", RUN, "--profile", profile_with_bin(profile_file, folder))
    assert result.exit_code == 9, result.output
    progress = result.stderr.splitlines()[0]
    assert "shards: 1 pending" in progress
    assert progress.endswith("pending: 1 PartitionTimeLimit (can never start)")
    assert f"synthbatch: error: run {RUN} can never finish: 1 of 1 shard(s) pending with " \
           "a reason Slurm keeps (shard 0: PartitionTimeLimit: the time limit is above " \
           "the partition's MaxTime" in result.stderr


def test_wait_progress_lines_name_pending_reasons(tmp_path: Path, workspace: Path,
                                                  profile_file: Path) -> None:
    make_run(workspace, [Shard("submitted"), Shard("submitted")])
    folder = fake_slurm_bin(tmp_path, squeue="echo '500_0|PENDING|Resources'; "
                                             "echo '500_1|PENDING|Resources'")
    result = invoke("wait", RUN, "--timeout", "0", "--profile",
                    profile_with_bin(profile_file, folder))
    assert result.exit_code == 8, result.output
    assert result.stderr.splitlines()[0].endswith("pending: 2 Resources")
