"""Reconciliation for status: missing winners completed, attempts whose job is gone recorded."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.attempts import advance_attempt, load_readiness
from synthbatch.agent_stdlib.contracts import AttemptRecord
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.publish import complete_winner, load_winner, publish_result
from synthbatch.agent_stdlib.statefile import StateError, ensure_dir
from synthbatch.control.runs.status.reconcile import mark_ended
from synthbatch.control.runs.status.refresh import SchedulerView, gone
from synthbatch.control.slurm.parsers import JobRow
from tests.agent_runs import local_plan, stage
from tests.fakes import write_readiness


@pytest.mark.parametrize("row, asked, is_gone", [
    (JobRow("12_0", "RUNNING"), True, False),
    (JobRow("12_0", "COMPLETING"), True, False),  # KillWait: the agent may still write
    (JobRow("12_0", "PENDING", reason="BeginTime"), True, False),  # requeued, waiting
    (JobRow("12_0", "REQUEUED"), True, False),
    (JobRow("12_0", "FAILED", reason="NonZeroExitCode"), True, True),
    (JobRow("12_0", "CANCELLED"), True, True),
    (JobRow("12_0", "COMPLETED"), True, True),
    (None, True, True),  # squeue no longer lists it (MinJobAge passed)
    (None, False, False),  # Slurm was not asked (unreachable): nothing is known
])
def test_gone_only_once_squeue_shows_no_process_left(row, asked, is_gone) -> None:
    view = SchedulerView(queue={"12_0": row} if row else {},
                         asked={"12_0"} if asked else set())
    assert gone(view, "12_0") is is_gone
    assert gone(view, None) is False


@pytest.fixture
def run(tmp_path: Path) -> RunLayout:
    stage(tmp_path / "run", local_plan(sys.executable, ["serve"], records=2), records=True)
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


def test_mark_ended_fails_a_running_attempt_once(run):
    marked = mark_ended(run, 0, 1, "failed", "lost: test")
    assert marked.state == "failed" and marked.reason == "lost: test"
    assert mark_ended(run, 0, 1, "failed", "lost: other") == marked


def test_mark_ended_keeps_a_record_the_agent_finished_meanwhile(run):
    finished = succeed(run)
    assert mark_ended(run, 0, 1, "failed", "lost: late") == finished


def test_mark_ended_closes_an_open_readiness_and_only_that(run):
    path = run.attempt(0, 1).readiness_json
    write_readiness(path, 0, 1, 2, "ready", endpoints={"tiny": "http://127.0.0.1:9/v1"})
    mark_ended(run, 0, 1, "cancelled", "job cancelled outside synthbatch")
    closed = load_readiness(path)
    assert (closed.state, closed.revision, closed.execution, closed.endpoints) == \
        ("failed", 2, 2, {})
    assert closed.reason == ("the allocation ended without its agent: job cancelled outside "
                             "synthbatch")


def test_a_closed_readiness_is_left_as_the_agent_wrote_it(run):
    path = run.attempt(0, 1).readiness_json
    write_readiness(path, 0, 1, 1, "stopped")
    mark_ended(run, 0, 1, "failed", "job failed before the agent recorded an outcome")
    assert (load_readiness(path).state, load_readiness(path).revision) == ("stopped", 1)


def test_missing_winner_is_completed_once(run):
    succeed(run)
    winner = complete_winner(run, 0, 1)
    assert winner.records == 2 and load_winner(run, 0) == winner
    assert complete_winner(run, 0, 1) == winner  # first writer won


def test_tampered_output_is_reported_not_published(run):
    succeed(run)
    (run.attempt(0, 1).output / "records.jsonl").write_text("{}\n")
    with pytest.raises(StateError, match="does not match its manifest"):
        complete_winner(run, 0, 1)
    assert not run.winner_json(0).exists()
