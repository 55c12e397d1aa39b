"""Reconciliation for status: missing winners completed, dead agents marked lost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent_stdlib.attempts import advance_attempt, load_attempt
from agent_stdlib.contracts import AttemptRecord
from agent_stdlib.layout import RunLayout
from agent_stdlib.publish import load_winner, publish_result
from agent_stdlib.statefile import ensure_dir
from control.runs.reconcile import (
    lost_reason,
    mark_lost,
    needs_winner,
    reconcile_shard,
)
from control.slurm.parsers import JobRow
from tests.agent_runs import local_plan, stage


def running(updated_at: float = 1000.0) -> AttemptRecord:
    return AttemptRecord(run_id="r", shard=0, attempt=1, state="running", revision=3,
                         updated_at=updated_at, job_id="12_0")


@pytest.mark.parametrize("row, now, lost", [
    (JobRow("12_0", "RUNNING"), 99999.0, False),
    (JobRow("12_0", "PENDING", reason="BeginTime"), 99999.0, False),  # requeued, waiting
    (JobRow("12_0", "REQUEUED"), 99999.0, False),
    (JobRow("12_0", "FAILED", exit_code=0, signal=9), 1001.0, True),
    (JobRow("12_0", "CANCELLED", exit_code=0), 1001.0, True),
    (None, 1060.0, False),  # accounting lag: not yet
    (None, 5000.0, True),
])
def test_lost_reason(row, now, lost):
    reason = lost_reason(running(), row, now)
    assert (reason is not None) == lost
    if lost:
        assert reason.startswith("lost: job 12_0 ")


def test_only_running_attempts_can_be_lost():
    for state in ("submitted", "succeeded", "failed", "cancelled"):
        attempt = running().replace(state=state)
        assert lost_reason(attempt, JobRow("12_0", "FAILED", exit_code=1), 99999.0) is None


def test_lost_reason_names_state_exit_and_signal():
    reason = lost_reason(running(), JobRow("12_0", "FAILED", exit_code=0, signal=9), 2000.0)
    assert "ended FAILED (exit 0, signal 9)" in reason


@pytest.fixture
def run(tmp_path: Path) -> RunLayout:
    stage(tmp_path / "run", local_plan(sys.executable, ["serve"], records=2))
    layout = RunLayout(tmp_path / "run")
    advance_attempt(layout.attempt(0, 1).attempt_json, "running")
    return layout


def succeed(layout: RunLayout) -> AttemptRecord:
    paths = layout.attempt(0, 1)
    ensure_dir(paths.output)
    lines = [json.dumps({"index": i}) + "\n" for i in range(2)]
    (paths.output / "records.jsonl").write_text("".join(lines))
    publish_result(paths.output, paths.result_json, 0, 1, 2)
    return advance_attempt(paths.attempt_json, "succeeded")


def test_mark_lost_fails_a_running_attempt_once(run):
    marked = mark_lost(run, 0, 1, "lost: test")
    assert marked.state == "failed" and marked.reason == "lost: test"
    assert mark_lost(run, 0, 1, "lost: other") == marked


def test_mark_lost_keeps_a_record_the_agent_finished_meanwhile(run):
    finished = succeed(run)
    assert mark_lost(run, 0, 1, "lost: late") == finished


def test_missing_winner_is_completed_once(run):
    attempt = succeed(run)
    assert needs_winner(attempt, None)
    done = reconcile_shard(run, 0, attempt, None, None, now=0.0)
    assert done.winner is not None and done.winner.records == 2
    assert done.note == "winner completed from attempt 1"
    assert load_winner(run, 0) == done.winner
    again = reconcile_shard(run, 0, attempt, None, None, now=0.0)
    assert again.winner == done.winner and not needs_winner(attempt, again.winner)


def test_tampered_output_is_reported_not_published(run):
    attempt = succeed(run)
    (run.attempt(0, 1).output / "records.jsonl").write_text("{}\n")
    done = reconcile_shard(run, 0, attempt, None, None, now=0.0)
    assert done.winner is None and "does not match its manifest" in done.note
    assert not run.winner_json(0).exists()


def test_reconcile_marks_a_dead_agent_lost(run):
    attempt = load_attempt(run.attempt(0, 1).attempt_json)
    row = JobRow("1_0", "CANCELLED", exit_code=0, signal=9)
    done = reconcile_shard(run, 0, attempt, None, row, now=attempt.updated_at + 1)
    assert done.attempt.state == "failed" and done.note.startswith("lost: ")
    unchanged = reconcile_shard(run, 0, done.attempt, None, row, now=attempt.updated_at + 1)
    assert unchanged.attempt == done.attempt and unchanged.note is None
