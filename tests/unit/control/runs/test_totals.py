"""A run's numbers while it runs and after retries: GPU-hours so far, and averages over
the time the run was in progress (issue 28 item 9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

from synthbatch.agent_stdlib.attempts import advance_attempt
from synthbatch.agent_stdlib.contracts import SubmissionRecord
from synthbatch.agent_stdlib.statefile import ensure_dir, write_json_atomic
from synthbatch.control.runs.status.totals import totals
from synthbatch.control.slurm.parsers import JobUsage
from tests.fakes import NOW, RUN_ID, Shard, create_attempt, make_run


class Accounting:
    """A scheduler whose accounting answers ``rows`` (None: the cluster keeps none)."""

    USAGE_FROM = "accounting (sacct)"

    def __init__(self, rows: Optional[List[JobUsage]]) -> None:
        self.rows, self.asked = rows, []

    def usage(self, job_ids: List[str]) -> Any:
        self.asked.append(list(job_ids))
        return self.rows


def retried_run(workspace: Path) -> Any:
    """Shard 0 succeeds 100 s after submit; shard 1 fails at 50 s; its retry is submitted
    an hour later and succeeds 100 s after that."""
    layout = make_run(workspace, [Shard("winner", progress=10, updated_at=NOW + 100),
                                  Shard("failed", progress=3, updated_at=NOW + 50)],
                      submitted_at=NOW)
    paths = layout.attempt(1, 2)
    ensure_dir(paths.root)
    create_attempt(paths.attempt_json, RUN_ID, 1, 2)
    advance_attempt(paths.attempt_json, "submitted", job_id="600_1", submission=2)
    advance_attempt(paths.attempt_json, "running")
    advance_attempt(paths.attempt_json, "succeeded")
    record = json.loads(paths.attempt_json.read_text())
    write_json_atomic(paths.attempt_json, {**record, "updated_at": NOW + 3700})
    write_json_atomic(layout.submission_json(2), SubmissionRecord(
        number=2, argv=("sbatch",), job_id="600", attempts={"1": 2},
        submitted_at=NOW + 3600, released=True).to_dict())
    return layout


def test_averages_leave_out_the_idle_hour_before_a_retry(tmp_path: Path) -> None:
    """They were 20 records over 3,700 s (0.005/s): the run was in progress 200 s."""
    layout = retried_run(tmp_path / "ws")
    data = {"state": "succeeded", "records_done": 20, "tokens": 400,
            "shards": [{"job_id": "500_0"}, {"job_id": "600_1"}]}
    found = totals(layout, data, Accounting(None), now=NOW + 4000, ended=NOW + 3700)
    assert (found["elapsed_s"], found["active_s"]) == (3700.0, 200.0)
    assert (found["records_per_s"], found["tokens_per_s"]) == (0.1, 2.0)


def test_a_retry_still_running_counts_until_now(tmp_path: Path) -> None:
    layout = retried_run(tmp_path / "ws")
    path = layout.attempt(1, 2).attempt_json
    record = json.loads(path.read_text())
    write_json_atomic(path, {**record, "state": "running"})
    data = {"state": "running", "records_done": 15, "tokens": 0}
    found = totals(layout, data, Accounting([]), now=NOW + 3650)
    assert (found["elapsed_s"], found["active_s"]) == (3650.0, 150.0)  # 100 s + 50 s so far


def test_gpu_hours_so_far_while_the_run_runs(tmp_path: Path) -> None:
    """``gpu_hours`` was null until the run ended: accounting has the executions so far."""
    layout = make_run(tmp_path / "ws", [Shard("running", progress=4), Shard("winner")])
    accounting = Accounting([JobUsage("500_0", 1800, 2), JobUsage("500_1", 900, 2)])
    found = totals(layout, {"state": "running", "records_done": 14, "tokens": 98},
                   accounting, now=NOW + 60)
    assert found["gpu_hours"] == 1.5 and found["gpu_hours_from"] == "accounting (sacct)"
    assert accounting.asked == [["500"]]
    assert not (layout.root / "totals.json").exists()  # so far: never kept
