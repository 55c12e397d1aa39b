"""Automatic retries (issue 34): the round's rules, one round job per run, cancel stops it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.control.cli import autoround
from synthbatch.control.runs import autoretry
from synthbatch.control.runs.autoretry import decide, render_script, sbatch_argv, story
from synthbatch.control.runs.cancel import cancel_run
from synthbatch.control.runs.status.rows import ShardRow
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import FakeSlurm, RoundQueue, Shard, make_run, round_profile

S, F, C, R = "succeeded", "failed", "cancelled", "running"


def _shards(*pairs: tuple) -> List[ShardRow]:
    return [ShardRow(i, state, None, attempt, None, 1) for i, (state, attempt) in enumerate(pairs)]


def test_failed_shards_below_the_limit_are_retried_and_the_run_goes_on() -> None:
    d = decide(_shards((S, 1), (F, 1), (R, 1), (F, 2)), max_attempts=3)
    assert (d.retry, d.waiting, d.exhausted, d.over, d.successor) == ((1, 3), (2,), (), False,
                                                                      True)


def test_a_shard_that_always_fails_stops_after_exactly_max_attempts() -> None:
    d = decide(_shards((S, 1), (F, 3)), max_attempts=3)
    assert (d.retry, d.exhausted, d.over, d.successor, d.merge) == ((), (1,), True, False,
                                                                    False)


def test_cancelled_shards_are_never_retried_automatically() -> None:
    d = decide(_shards((C, 1), (C, 1)), max_attempts=3)
    assert d.retry == () and d.over and not d.successor


def test_merge_is_due_once_every_shard_won_or_with_allow_partial() -> None:
    assert decide(_shards((S, 1), (S, 3)), 3, merge_wanted=True).merge
    assert not decide(_shards((S, 1), (R, 2)), 3, merge_wanted=True).merge
    assert not decide(_shards((S, 1), (F, 3)), 3, merge_wanted=True).merge
    assert decide(_shards((S, 1), (F, 3)), 3, merge_wanted=True, allow_partial=True).merge
    assert not decide(_shards((S, 1), (S, 1)), 3, merge_wanted=False).merge


def test_runs_tells_the_story_while_a_round_is_pending() -> None:
    assert story(_shards((S, 1), (R, 2)), 3, round_pending=True) == \
        "retrying (attempt 2 of 3)"
    assert story(_shards((S, 1), (F, 1)), 3, round_pending=True) == "automatic retry pending"
    assert story(_shards((S, 1), (R, 2)), 3, round_pending=False) is None


def test_the_round_script_quotes_every_word() -> None:
    text = render_script("/opt/py env/bin/python", "run-1", "/ws; rm -rf ~")
    assert text.splitlines()[-1] == ("exec '/opt/py env/bin/python' -m "
                                     "synthbatch.control.cli.autoround "
                                     "--workspace '/ws; rm -rf ~' run-1")


def test_the_round_job_is_cpu_only_small_and_after_the_jobs(tmp_path: Path) -> None:
    argv = sbatch_argv(tmp_path / "round.sbatch", "run-1", ["901", "902"],
                       tmp_path / "round.out", partition="cpu")
    assert "--dependency=afterany:901:902" in argv and "--cpus-per-task=1" in argv
    assert "--time=00:05:00" in argv and "--partition=cpu" in argv
    assert not any("gres" in a or "gpu" in a for a in argv)
    assert argv[-1] == str(tmp_path / "round.sbatch")


def test_never_more_than_one_round_job_per_run(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    q = RoundQueue()
    first = autoretry.submit_round(layout, round_profile(tmp_path), q, "r", ["500"], 1)
    assert first == "701"
    # a manual round (or a second one racing) while 701 is still queued adds nothing
    assert autoretry.submit_round(layout, round_profile(tmp_path), q, "r", ["500"], 2) is None
    # the round job itself submits its successor
    assert autoretry.submit_round(layout, round_profile(tmp_path), q, "r", ["800"], 2,
                                  own_job="701") == "702"
    q.alive.clear()
    assert autoretry.submit_round(layout, round_profile(tmp_path), q, "r", ["900"], 3) == "703"
    assert len(q.submitted) == 3
    assert autoretry.load_pending(layout)["job_id"] == "703"


def test_cancel_of_the_run_cancels_its_pending_round(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    autoretry.record_pending(layout, "777", 1, ["500"])
    fake = FakeSlurm()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|CANCELLED|None\n")
    cancel_run(layout, Scheduler(runner=fake), [], 0)
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "500", "777"]]
    assert autoretry.load_pending(layout) is None  # no automatic job pending any more


def test_runs_tells_no_retry_story_of_a_run_cancelled_while_its_round_waited(
        tmp_path: Path) -> None:
    # shard 1 failed, its round waits: the person cancels the run to stop the retries;
    # nothing is open but the round job, and the run reads failed, not "retrying"
    layout = make_run(tmp_path, [Shard("winner"), Shard("failed")])
    autoretry.record_pending(layout, "777", 1, ["500"])
    assert autoretry.listed_story(layout, "failed", 3) == "retrying (attempt 2 of 3)"
    result = _cancel(layout)
    assert result["scancelled"] == ["777"]
    assert autoretry.listed_story(layout, "failed", 3) is None


def test_a_damaged_round_record_reads_as_none(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    path = layout.round_json
    path.parent.mkdir(mode=0o700)
    path.write_text("{not json")
    path.chmod(0o600)
    assert autoretry.load_pending(layout) is None and autoretry.pending_job_ids(layout) == []


@pytest.mark.parametrize("argv", [[], ["run-1"], ["--ws", "w", "run-1"]])
def test_the_round_entry_point_names_its_usage(argv: List[str], capsys) -> None:
    assert autoround.main(argv) == 2
    assert "usage: python -m synthbatch.control.cli.autoround" in capsys.readouterr().err


def test_submit_starts_one_round_after_the_arrays_unless_turned_off(tmp_path: Path) -> None:
    from synthbatch.control.runs.automerge import settings
    from synthbatch.control.runs.autoround import start

    layout = make_run(tmp_path, [Shard("submitted")])
    q = RoundQueue()
    off = settings(False, 3, None, "jsonl", False)
    assert start(layout, round_profile(tmp_path), q, "r", ["500"], off) is None
    one = settings(True, 1, None, "jsonl", False)  # one attempt and no merge: no round job
    assert start(layout, round_profile(tmp_path), q, "r", ["500"], one) is None
    assert q.submitted == []
    on = settings(True, 3, None, "jsonl", False)
    assert start(layout, round_profile(tmp_path), q, "r", ["500"], on) == "701"
    assert "--dependency=afterany:500" in q.submitted[0]
    assert start(layout, round_profile(tmp_path), q, "r", ["500"], on) is None
    assert len(q.submitted) == 1


def test_one_attempt_with_a_merge_still_gets_a_round(tmp_path: Path) -> None:
    from synthbatch.control.runs.automerge import settings
    from synthbatch.control.runs.autoround import start

    layout = make_run(tmp_path, [Shard("submitted")])
    q = RoundQueue()
    merging = settings(False, 1, tmp_path / "out.jsonl", "jsonl", False)
    assert start(layout, round_profile(tmp_path), q, "r", ["500"], merging) == "701"


def test_status_shows_the_pending_round_and_wait_keeps_waiting(tmp_path: Path) -> None:
    from synthbatch.control.runs.status.watch import finished

    layout = make_run(tmp_path, [Shard("failed")])
    q = RoundQueue()
    rows = lambda: [ShardRow(0, "running", None, 2, None, 1)]  # noqa: E731
    assert autoretry.round_now(layout, q, rows, lambda: 3) is None
    autoretry.submit_round(layout, round_profile(tmp_path), q, "r", ["500"], 1)
    shown = autoretry.round_now(layout, q, rows, lambda: 3)
    assert shown == {"job_id": "701", "round": 1, "action": "retry",
                     "story": "retrying (attempt 2 of 3)"}
    # the shards alone look over (failed); a pending round keeps wait waiting
    assert finished({"state": "failed", "auto_retry": None})
    assert not finished({"state": "failed", "auto_retry": shown})
    q.alive.clear()  # the round ended
    assert autoretry.round_now(layout, q, rows, lambda: 3) is None


def _cancel(layout: Any) -> Dict[str, Any]:
    """``cancel RUN`` of the whole run, Slurm answering that shard 0's job ended."""
    fake = FakeSlurm()
    fake.on("scancel")
    fake.on("squeue", stdout="500_0|CANCELLED|None\n")
    result = cancel_run(layout, Scheduler(runner=fake), [], 0)
    result["calls"] = [c for c in fake.calls if c[0] == "scancel"]
    return result


def test_a_round_running_when_the_run_is_cancelled_submits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from synthbatch.control.runs import automerge
    from synthbatch.control.runs import autoround as rounds
    from synthbatch.control.runs.submit import arrays

    layout = make_run(tmp_path, [Shard("running"), Shard("failed")])
    automerge.save_settings(layout, automerge.settings(True, 3, None, "jsonl", False))
    stale = [{"index": 0, "state": R, "attempt": 1, "job_id": "500_0"},
             {"index": 1, "state": F, "attempt": 1, "job_id": "500_1"}]

    def observe(*_: Any) -> Dict[str, Any]:  # the round read the shards, then the cancel came
        _cancel(layout)
        return {"shards": stale}

    sbatch: List[Any] = []
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not run inside a Slurm job
    monkeypatch.setattr(rounds, "observe", observe)
    monkeypatch.setattr(arrays, "submit_all", lambda *a, **_: sbatch.append(a) or [])
    q = RoundQueue()
    decision = rounds.run_round(layout, round_profile(tmp_path), q)
    assert sbatch == [] and q.submitted == []  # no attempt 2, no successor
    assert not layout.attempt(1, 2).root.exists()
    assert decision.halted and decision.retry == () and decision.over
    assert autoretry.load_pending(layout) is None


def test_cancel_waits_for_a_submitting_retry_and_cancels_what_it_submitted(
        tmp_path: Path) -> None:
    from synthbatch.agent_stdlib.attempts import advance_attempt, load_attempt
    from synthbatch.agent_stdlib.statefile import ensure_dir
    from synthbatch.control.runs.autoretry import RetryLock
    from tests.fakes import RUN_ID, create_attempt

    layout = make_run(tmp_path, [Shard("running"), Shard("failed")])
    held = threading.Event()
    paths = layout.attempt(1, 2)

    def a_round_submitting() -> None:
        with RetryLock(layout):
            held.set()
            deadline = time.monotonic() + 10  # the cancel stops the rounds before it reads
            while not autoretry.halted(layout) and time.monotonic() < deadline:
                time.sleep(0.02)
            ensure_dir(paths.root)  # what retry_run writes: attempt 2, submitted as 900
            create_attempt(paths.attempt_json, RUN_ID, 1, 2)
            advance_attempt(paths.attempt_json, "submitted", job_id="900_1", submission=2)

    thread = threading.Thread(target=a_round_submitting)
    thread.start()
    held.wait()
    cancelled = _cancel(layout)
    thread.join()
    assert "900_1" in cancelled["scancelled"], cancelled
    assert load_attempt(paths.attempt_json).state == "cancelled"
    assert "cancelled" in (autoretry.halted(layout) or "")


def test_a_damaged_halt_record_still_stops_the_rounds(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    assert autoretry.halted(layout) is None
    layout.auto.mkdir(mode=0o700)
    layout.auto_halted.write_text("{torn")
    assert "stay stopped" in autoretry.halted(layout)


def test_a_round_and_a_manual_retry_converge_on_one_submission(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from synthbatch.agent_stdlib.attempts import advance_attempt
    from synthbatch.agent_stdlib.statefile import ensure_dir
    from synthbatch.control.runs import automerge
    from synthbatch.control.runs import autoround as rounds
    from synthbatch.control.runs.submit import arrays
    from tests.fakes import RUN_ID, create_attempt

    layout = make_run(tmp_path, [Shard("failed")])
    automerge.save_settings(layout, automerge.settings(True, 3, None, "jsonl", False))
    paths = layout.attempt(0, 2)

    def observe(*_: Any) -> Dict[str, Any]:  # the round read shard 0 failed; then a manual
        ensure_dir(paths.root)               # `retry` submitted its attempt 2
        create_attempt(paths.attempt_json, RUN_ID, 0, 2)
        advance_attempt(paths.attempt_json, "submitted", job_id="900_0", submission=2)
        return {"shards": [{"index": 0, "state": F, "attempt": 1, "job_id": "500_0"}]}

    sbatch: List[Any] = []
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # not run inside a Slurm job
    monkeypatch.setattr(rounds, "observe", observe)
    monkeypatch.setattr(arrays, "submit_all", lambda *a, **_: sbatch.append(a) or [])
    q = RoundQueue()
    rounds.run_round(layout, round_profile(tmp_path), q)
    assert sbatch == []  # the round selected under the lock: nothing left to retry
    assert not layout.attempt(0, 3).root.exists()
    # its refresh knew no job to wait for: the successor pauses instead of running at once
    assert len(q.submitted) == 1 and f"--begin={autoretry.IDLE_BEGIN}" in q.submitted[0]
    assert not any(a.startswith("--dependency") for a in q.submitted[0])


def test_status_says_when_the_round_job_died_without_finishing(
        tmp_path: Path, workspace: Path, profile_file: Path) -> None:
    from synthbatch.control import api
    from tests.fakes import RUN_ID, fake_slurm_bin, profile_with_bin

    layout = make_run(workspace, [Shard("winner"), Shard("failed")])
    autoretry.record_pending(layout, "701", 2, ["500"], attempt=2)  # then killed by Slurm
    profile = profile_with_bin(profile_file, fake_slurm_bin(tmp_path, squeue="exit 0",
                                                            sacct="exit 0"))
    notes = api.status(RUN_ID, profile).to_dict()["notes"]
    lost = [n for n in notes if "automatic round job 701 ended without finishing" in n]
    assert len(lost) == 1 and str(layout.auto / "round-0002.out") in lost[0], notes
    assert f"`synthbatch retry --auto {RUN_ID}` does it by hand" in lost[0]
    # a live round job, or a cancel, says nothing of the kind
    q = RoundQueue()
    q.alive.add("701")
    assert autoretry.lost_note(layout, q) is None
    autoretry.halt(layout, "the run was cancelled")
    assert autoretry.lost_note(layout, RoundQueue()) is None
