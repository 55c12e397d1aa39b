"""Status: the normalisation table (property tests) and observe() over real run records."""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path
from typing import Dict, List

import pytest

from synthbatch.agent_stdlib import states
from synthbatch.agent_stdlib.attempts import load_attempt, publish_readiness
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import (
    StateError,
    ensure_dir,
    write_json_atomic,
)
from synthbatch.control.errors import EvidenceConflict
from synthbatch.control.runs.status import records as store
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.records import (
    Expected,
    expected_lookup,
    load_plan_view,
    needs_recovery,
    scan_shard,
    submission_views,
)
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.slurm.parsers import ACTIVE_STATES, TERMINAL_STATES, JobRow
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import NOW, RUN_ID, FakeSlurm, Shard, create_attempt, make_run

# ============================================================================= the table

QUEUE_ROWS = [None, JobRow("5_1", "PENDING", "Priority"), JobRow("5_1", "PENDING", "BeginTime"),
              JobRow("5_1", "RUNNING"), JobRow("5_1", "COMPLETING"),
              JobRow("5_1", "SUSPENDED"), JobRow("5_1", "REQUEUE_HOLD", "JobHeldAdmin"),
              JobRow("5_1", "COMPLETED"), JobRow("5_1", "FAILED", "NonZeroExitCode"),
              JobRow("5_1", "CANCELLED"), JobRow("5_1", "TIMEOUT", "TimeLimit"),
              JobRow("5_1", "NODE_FAIL"), JobRow("5_1", "WEIRD_NEW")]
ACCT_ROWS = [None, JobRow("5_1", "PENDING", None, 0, 0), JobRow("5_1", "RUNNING", None, 0, 0),
             JobRow("5_1", "REQUEUED", None, 0, 0), JobRow("5_1", "COMPLETED", None, 0, 0),
             JobRow("5_1", "FAILED", None, 3, 0), JobRow("5_1", "FAILED", None, 0, 9),
             JobRow("5_1", "CANCELLED", "by 0", 0, 0), JobRow("5_1", "OUT_OF_MEMORY", None, 0, 125),
             JobRow("5_1", "PREEMPTED", None, 0, 0), JobRow("5_1", "BOOT_FAIL", None, 0, 0),
             JobRow("5_1", "DEADLINE", None, 1, 0)]
ATTEMPTS = [None, *states.ATTEMPT_STATES]
NON_TERMINAL_SCHEDULED = (states.SUBMITTED, states.PENDING, states.RUNNING)


def all_evidence(seed: int = 7):
    """Every (winner, attempt, queue row, accounting row) with random remaining flags."""
    rng = random.Random(seed)
    for winner, attempt, queue, acct in itertools.product(
            (False, True), ATTEMPTS, QUEUE_ROWS, ACCT_ROWS):
        yield norm.Evidence(winner=winner, attempt_state=attempt,
                            attempt_reason=rng.choice([None, "agent said so"]), queue=queue,
                            acct=acct, asked=rng.random() < 0.8,
                            accounting=rng.random() < 0.7, lag_expired=rng.random() < 0.5,
                            cancel_requested=rng.random() < 0.3)


def both_terminal_and_different(ev: norm.Evidence) -> bool:
    return bool(ev.queue and ev.acct and ev.queue.terminal and ev.acct.terminal
                and ev.queue.state != ev.acct.state)


def test_table_is_total() -> None:
    count = 0
    for ev in all_evidence():
        verdict = norm.normalize(ev)
        assert verdict.state in norm.SHARD_STATES, (ev, verdict)
        assert verdict.reason is None or ("\n" not in verdict.reason
                                          and len(verdict.reason) <= 300)
        count += 1
    assert count == 2 * len(ATTEMPTS) * len(QUEUE_ROWS) * len(ACCT_ROWS)


def test_winner_beats_everything() -> None:
    for ev in all_evidence():
        if ev.winner:
            assert norm.decide(ev) == norm.Verdict(norm.SUCCEEDED, None, "winner")


def test_conflicting_terminal_evidence_is_an_error_naming_both() -> None:
    seen = 0
    for ev in all_evidence():
        if ev.winner or ev.attempt_state is None or not both_terminal_and_different(ev):
            continue
        with pytest.raises(EvidenceConflict) as info:
            norm.decide(ev)
        message = info.value.message
        assert f"squeue says {ev.queue.state}" in message
        assert f"sacct says {ev.acct.state}" in message
        assert norm.normalize(ev).state == norm.UNKNOWN
        assert norm.normalize(ev).reason.startswith("conflicting terminal evidence")
        seen += 1
    assert seen > 100


def test_terminal_attempt_records_are_final() -> None:
    for ev in all_evidence():
        if ev.winner or ev.attempt_state not in states.TERMINAL:
            continue
        try:
            verdict = norm.decide(ev)
        except EvidenceConflict as err:
            ended = ev.acct if ev.acct and ev.acct.terminal else ev.queue
            assert both_terminal_and_different(ev) or (
                ev.attempt_state in (norm.FAILED, norm.CANCELLED) and ended is not None
                and ended.state == "COMPLETED")
            assert ev.attempt_state in err.message or both_terminal_and_different(ev)
            continue
        assert verdict.state == ev.attempt_state and verdict.source == "attempt"


def test_terminal_accounting_beats_a_stale_queue_row() -> None:
    seen = 0
    for ev in all_evidence():
        if ev.winner or ev.attempt_state not in NON_TERMINAL_SCHEDULED:
            continue
        if ev.queue is None or ev.queue.terminal or ev.acct is None or not ev.acct.terminal:
            continue
        verdict = norm.decide(ev)
        assert verdict.state in (norm.FAILED, norm.CANCELLED) and verdict.source == "sacct"
        seen += 1
    assert seen > 50


def test_active_evidence_never_ends_a_shard() -> None:
    for ev in all_evidence():
        if ev.winner or ev.attempt_state not in NON_TERMINAL_SCHEDULED:
            continue
        rows = [r for r in (ev.queue, ev.acct) if r is not None]
        if not rows or any(r.terminal for r in rows) or not all(r.known for r in rows):
            continue
        verdict = norm.decide(ev)
        assert verdict.state in (norm.PENDING, norm.RUNNING, norm.CANCELLING), (ev, verdict)
        assert (verdict.state == norm.CANCELLING) == ev.cancel_requested


def test_missing_everywhere_is_lag_then_lost() -> None:
    for ev in all_evidence():
        if ev.winner or ev.attempt_state not in NON_TERMINAL_SCHEDULED or ev.queue or ev.acct:
            continue
        verdict = norm.decide(ev)
        if not ev.asked:
            assert verdict == norm.Verdict(norm.UNKNOWN, "scheduler unavailable", "none")
        elif ev.lag_expired:
            assert verdict.state == norm.LOST
        else:
            assert verdict.state == norm.UNKNOWN and verdict.reason.startswith("accounting lag")
        assert ("no accounting" in (verdict.reason or "")) == (ev.asked and not ev.accounting)


def test_lost_needs_every_condition() -> None:
    for ev in all_evidence():
        if norm.normalize(ev).state == norm.LOST:
            assert ev.lag_expired and ev.asked and not ev.winner
            assert ev.queue is None and ev.acct is None
            assert ev.attempt_state in NON_TERMINAL_SCHEDULED


def test_state_tables_cover_every_row_state() -> None:
    for row in QUEUE_ROWS + ACCT_ROWS:
        if row is not None and row.known:
            assert (row.state in ACTIVE_STATES) != (row.state in TERMINAL_STATES)


@pytest.mark.parametrize("row,state,words", [
    (JobRow("5_1", "CANCELLED", "by 0", 0, 0), "cancelled",
     "job cancelled by uid 0 outside synthbatch"),
    (JobRow("5_1", "FAILED", None, 3, 0), "failed", "job failed (exit 3) before the agent"),
    (JobRow("5_1", "FAILED", None, 0, 9), "failed", "(exit 0, signal 9)"),
    (JobRow("5_1", "TIMEOUT", None, 0, 0), "failed", "time limit (TIMEOUT)"),
    (JobRow("5_1", "NODE_FAIL", None, 0, 0), "failed", "(NODE_FAIL)"),
    (JobRow("5_1", "OUT_OF_MEMORY", None, 0, 125), "failed", "out of memory"),
    (JobRow("5_1", "PREEMPTED", None, 0, 0), "failed", "preempted"),
    (JobRow("5_1", "BOOT_FAIL", None, 0, 0), "failed", "BOOT_FAIL"),
    (JobRow("5_1", "DEADLINE", None, 1, 0), "failed", "deadline"),
    (JobRow("5_1", "COMPLETED", None, 0, 0), "failed", "job completed before the agent"),
])
def test_job_ended_without_agent_outcome(row: JobRow, state: str, words: str) -> None:
    verdict = norm.decide(norm.Evidence(attempt_state="submitted", acct=row))
    assert verdict.state == state and words in verdict.reason


def test_cancel_by_synthbatch_and_agent_reason() -> None:
    row = JobRow("5_1", "CANCELLED", "by 1000", 0, 0)
    mine = norm.decide(norm.Evidence(attempt_state="pending", acct=row, cancel_requested=True))
    assert mine.reason == "job cancelled by uid 1000 by `synthbatch cancel`"
    agent = norm.decide(norm.Evidence(attempt_state="cancelled", attempt_reason="received "
                                      "SIGTERM", acct=row))
    assert agent.state == "cancelled"
    assert agent.reason == ("job cancelled by uid 1000 outside synthbatch; agent: received "
                            "SIGTERM")


def test_requeued_job_is_pending_again() -> None:
    verdict = norm.decide(norm.Evidence(attempt_state="running",
                                        queue=JobRow("5_1", "PENDING", "BeginTime"),
                                        acct=JobRow("5_1", "REQUEUED", None, 0, 0)))
    assert verdict == norm.Verdict(norm.PENDING, "BeginTime", "squeue")


@pytest.mark.parametrize("counts,committed,expected", [
    ({"succeeded": 3}, True, "succeeded"),
    ({"succeeded": 2, "failed": 1}, True, "failed"),
    ({"succeeded": 2, "lost": 1}, True, "failed"),
    ({"succeeded": 2, "cancelled": 1}, True, "cancelled"),
    ({"succeeded": 1, "running": 1, "pending": 1}, True, "running"),
    ({"pending": 3}, True, "running"),
    ({"succeeded": 1, "pending": 2}, True, "running"),
    ({"unknown": 2}, True, "running"),
    ({}, True, "running"),
    ({"created": 3}, False, "uncommitted"),
])
def test_run_state(counts: Dict[str, int], committed: bool, expected: str) -> None:
    assert norm.run_state(counts, committed) == expected


# ============================================================================= observe()


def squeue_cmd(fake: FakeSlurm, stdout: str) -> None:
    fake.on("squeue", stdout=stdout)


def calls_of(fake: FakeSlurm, name: str) -> List[List[str]]:
    return [c for c in fake.calls if c[0] == name]


@pytest.fixture
def fake() -> FakeSlurm:
    return FakeSlurm()


def test_settled_run_asks_slurm_nothing(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("winner"), Shard("failed", "boom",
                                                        updated_at=NOW - 7200)])
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert fake.calls == []
    assert data["state"] == "failed" and data["counts"] == {"failed": 1, "succeeded": 1}
    assert data["failures"] == [{"shard": 1, "state": "failed", "reason": "boom", "log": None}]
    assert data["records_done"] == 10


def test_pending_running_finished_in_one_squeue_call(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("winner", progress=10), Shard("running", progress=4),
                                 Shard("submitted"), Shard("submitted")])
    squeue_cmd(fake, "500_1|RUNNING|None\n500_[2-3]|PENDING|Priority\n500_0|COMPLETED|None\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [c[0] for c in fake.calls] == ["squeue"]
    assert fake.calls[0][4:6] == ["-n", f"synthbatch-{RUN_ID}"]
    assert [s["state"] for s in data["shards"]] == ["succeeded", "running", "pending", "pending"]
    assert data["shards"][2]["reason"] == "Priority"
    assert data["state"] == "running" and data["records_done"] == 14
    assert data["tokens"] == 7 * 14 and data["rate"] == 2.5
    assert data["eta_s"] == pytest.approx((40 - 14) / 2.5)
    assert data["accounting"] is None  # sacct was not needed


def test_the_generators_figures_per_alias_are_added_up_over_running_shards(
        tmp_path: Path, fake: FakeSlurm) -> None:
    from synthbatch.control.cli.render import status_text

    layout = make_run(tmp_path, [Shard("running", progress=4), Shard("running", progress=2),
                                 Shard("winner", progress=10)])
    figures = {"requests": 10, "tokens_in": 50, "tokens_out": 80, "concurrency": 64,
               "in_flight": 60, "errors": {"429": 2}}
    for shard, dropped in ((0, 1), (1, 0), (2, 3)):
        path = layout.attempt(shard, 1).progress_json
        data = json.loads(path.read_text())
        write_json_atomic(path, {**data, "records_dropped": dropped,
                                 "aliases": {"gen": figures, "judge": {**figures,
                                                                       "errors": {}}}})
    squeue_cmd(fake, "500_[0-1]|RUNNING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["records_dropped"] == 4 and data["shards"][0]["records_dropped"] == 1
    assert "aliases" not in data["shards"][2]  # not running: its figures are not read
    assert data["aliases"]["gen"] == {"shards": 2, "requests": 20, "tokens_in": 100,
                                      "tokens_out": 160, "concurrency": 128,
                                      "in_flight": 120, "errors": {"429": 4}}
    text = status_text(data)
    assert "dropped 4" in text
    assert "  model gen: 120/128 in flight over 2 shard(s), 20 requests, tokens in 100 out " \
           "160, errors 429 x4" in text


def test_damaged_alias_figures_are_a_progress_problem(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running", progress=4)])
    path = layout.attempt(0, 1).progress_json
    write_json_atomic(path, {**json.loads(path.read_text()), "aliases": {"gen": {"x": 1}}})
    squeue_cmd(fake, "500_0|RUNNING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "running"
    assert "field 'requests' has the wrong type" in data["shards"][0]["reason"]


def test_sacct_only_for_jobs_squeue_forgot(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running"), Shard("submitted")])
    squeue_cmd(fake, "500_0|RUNNING|None\n")
    fake.on("sacct", stdout="500_0|RUNNING|0:0\n500_1|CANCELLED by 0|0:0\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [c[0] for c in fake.calls] == ["squeue", "sacct"]
    assert calls_of(fake, "sacct")[0][5] == "500"
    shard = data["shards"][1]
    assert shard["state"] == "cancelled"
    assert shard["reason"] == "job cancelled by uid 0 outside synthbatch"
    assert data["accounting"] is True


def test_log_path_of_a_failure(tmp_path: Path, fake: FakeSlurm) -> None:
    log = tmp_path / "client.log"
    layout = make_run(tmp_path, [Shard("failed", f"client exited with status 3 (log {log}: "
                                                 "boom)"), Shard("submitted")])
    squeue_cmd(fake, "500_1|FAILED|NonZeroExitCode\n")
    fake.on("sacct", stdout="")  # shard 0 failed recently: Slurm's word is asked for
    (layout.slurm_logs / "slurm-500_1.out").write_text("agent: failed\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["log"] == str(log)
    assert data["shards"][1]["log"] == str(layout.slurm_logs / "slurm-500_1.out")
    assert data["shards"][1]["reason"].startswith("job failed (NonZeroExitCode)")


def test_accounting_disabled_lag_then_lost_after_persisted_deadline(tmp_path: Path,
                                                                    fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running", progress=3)])
    squeue_cmd(fake, "")
    fake.on("sacct", code=1, stderr="Slurm accounting storage is disabled\n")
    first = observe(layout, Scheduler(runner=fake), now=NOW, lag_grace_s=300)
    assert first["accounting"] is False
    assert first["shards"][0]["state"] == "unknown"
    assert first["shards"][0]["reason"].startswith("accounting lag")
    assert json.loads(layout.lag_json.read_text())["first_missing"] == {"500_0": NOW}
    again = observe(layout, Scheduler(runner=fake), now=NOW + 299, lag_grace_s=300)
    assert again["shards"][0]["state"] == "unknown"
    later = observe(layout, Scheduler(runner=fake), now=NOW + 301, lag_grace_s=300)
    assert later["shards"][0]["state"] == "lost" and later["state"] == "failed"
    assert "no accounting" in later["shards"][0]["reason"]


def test_job_seen_again_resets_the_deadline(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("submitted")])
    squeue_cmd(fake, "")
    fake.on("sacct", stdout="")
    observe(layout, Scheduler(runner=fake), now=NOW, lag_grace_s=10)
    squeue_cmd(fake, "500_0|PENDING|Priority\n")
    observe(layout, Scheduler(runner=fake), now=NOW + 5, lag_grace_s=10)
    squeue_cmd(fake, "")
    data = observe(layout, Scheduler(runner=fake), now=NOW + 20, lag_grace_s=10)
    assert data["shards"][0]["state"] == "unknown"


def test_scheduler_unavailable_keeps_durable_truth(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("winner"), Shard("running")])
    fake.on("squeue", code=1, stderr="slurm_load_jobs error: Unable to contact slurm "
                                     "controller (connect failure)\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert "Unable to contact" in data["scheduler_error"]
    assert [s["state"] for s in data["shards"]] == ["succeeded", "unknown"]
    assert data["shards"][1]["reason"] == "scheduler unavailable"
    assert not layout.lag_json.exists()


SLURMDBD_DOWN = ("sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
                 "connection to host:127.0.0.1:6819: Connection refused\n"
                 "sacct: error: Sending PersistInit msg: Connection refused\n"
                 "sacct: error: Problem talking to the database: Connection refused\n")


def test_slurmdbd_down_leaves_squeue_s_verdicts_standing(tmp_path: Path,
                                                          fake: FakeSlurm) -> None:
    """Issue 22 (slurmdbd stopped on the testbed): squeue answered, sacct failed as the
    real 22.05 sacct does. Before: the whole refresh was 'scheduler unavailable' with the
    hint 'is slurmctld up?', and the job that ended without an outcome was not recorded."""
    layout = make_run(tmp_path, [Shard("running", progress=3), Shard("running")])
    squeue_cmd(fake, "500_0|RUNNING|None\n500_1|FAILED|NonZeroExitCode\n")
    fake.on("sacct", code=1, stderr=SLURMDBD_DOWN)
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["scheduler_error"] is None and data["accounting"] is None
    assert [s["state"] for s in data["shards"]] == ["running", "failed"]
    assert data["shards"][1]["reason"].endswith(norm.NO_OUTCOME)
    assert load_attempt(layout.attempt(1, 1).attempt_json).state == "failed"
    (note,) = data["notes"]
    assert "Problem talking to the database" in note and "is slurmdbd up?" in note


def test_slurmdbd_down_with_a_job_only_sacct_knows_says_so(tmp_path: Path,
                                                          fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    squeue_cmd(fake, "500_0|RUNNING|None\n")  # 500_1 left squeue (MinJobAge)
    fake.on("sacct", code=1, stderr=SLURMDBD_DOWN)
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["scheduler_error"] == ("sacct failed: sacct: error: Problem talking to the "
                                       "database: Connection refused")
    assert data["scheduler_hint"].startswith("is slurmdbd up?")
    assert [(s["state"], s["reason"]) for s in data["shards"]] == [
        ("running", None), ("unknown", norm.SCHEDULER_UNAVAILABLE)]
    assert not layout.lag_json.exists()  # not a sighting of a missing job


def test_a_job_ended_on_a_full_filesystem_says_so(tmp_path: Path, fake: FakeSlurm,
                                                 monkeypatch) -> None:
    """Issue 22 (workspace disk full on the testbed): the agent could not write its outcome
    and exited 120; status said only 'job failed (exit 120) ...'."""
    import errno
    import os

    from synthbatch.control.runs.status import reconcile
    from synthbatch.control.runs.status import refresh as status

    def no_space(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    squeue_cmd(fake, "500_0|RUNNING|None\n")
    fake.on("sacct", stdout="500_1|FAILED|120:0\n")
    full = os.statvfs_result((4096, 4096, 1024, 0, 0, 100, 0, 0, 0, 255))
    monkeypatch.setattr(status.os, "statvfs", lambda path: full)
    monkeypatch.setattr(reconcile, "mark_ended", no_space)  # the record cannot be written
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["reason"] is None
    assert data["shards"][1]["reason"] == (
        "job failed (exit 120) before the agent recorded an outcome; the run's filesystem is "
        f"full (0 bytes free under {layout.root})")


def test_malformed_records_are_reported_per_shard(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running"), Shard("running")])
    layout.attempt(1, 1).attempt_json.write_text("{half")
    squeue_cmd(fake, "500_0|RUNNING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "running"
    assert data["shards"][1]["state"] == "unknown"
    assert "not valid JSON" in data["shards"][1]["reason"]


def test_conflicting_evidence_is_reported(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    squeue_cmd(fake, "500_0|COMPLETED|None\n")
    fake.on("sacct", stdout="")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "failed"  # squeue alone: ended without an outcome
    layout2 = make_run(tmp_path / "b", [Shard("failed", "agent failed")])
    squeue_cmd(fake, "500_0|COMPLETED|None\n")
    data = observe(layout2, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "unknown"
    assert "attempt record says failed" in data["shards"][0]["reason"]
    assert "squeue says COMPLETED" in data["shards"][0]["reason"]


# ----------------------------------------------------------------------------- lost submissions


def test_held_job_of_a_committed_run_is_released(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("submitted"), Shard("submitted")], released=False)
    squeue_cmd(fake, "500_[0-1]|PENDING|JobHeldUser\n")
    fake.on("scontrol")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert calls_of(fake, "scontrol") == [["scontrol", "release", "500"]]
    assert data["notes"] == ["submission 1: job 500 released"]
    assert json.loads(layout.submission_json(1).read_text())["released"] is True


def test_unrecorded_job_is_adopted(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("created"), Shard("created")], job_id=None,
                      released=False)
    squeue_cmd(fake, "612_[0-1]|PENDING|JobHeldUser\n")
    fake.on("scontrol")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["notes"] == ["submission 1: adopted job 612", "submission 1: job 612 released"]
    record = json.loads(layout.submission_json(1).read_text())
    assert record["job_id"] == "612" and record["released"] is True
    attempt = json.loads(layout.attempt(1, 1).attempt_json.read_text())
    assert (attempt["state"], attempt["job_id"]) == ("submitted", "612_1")
    assert calls_of(fake, "scontrol") == [["scontrol", "release", "612"]]


def test_duplicate_unrecorded_job_is_cancelled(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("submitted")], released=False)
    squeue_cmd(fake, "500_0|RUNNING|None\n777_[0]|PENDING|JobHeldUser\n")
    fake.on("scontrol")
    fake.on("scancel")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert calls_of(fake, "scancel") == [["scancel", "777"]]
    assert calls_of(fake, "scontrol") == []  # 500 is not held any more
    assert "cancelled unrecorded job(s) 777 (duplicate submission)" in data["notes"]


def test_uncommitted_run_job_is_cancelled(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("created")], job_id=None, committed=False,
                      released=False)
    squeue_cmd(fake, "612_[0]|PENDING|JobHeldUser\n")
    fake.on("scancel")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert calls_of(fake, "scancel") == [["scancel", "612"]]
    assert data["state"] == "uncommitted"
    assert json.loads(layout.submission_json(1).read_text())["job_id"] is None


def test_young_submission_is_left_alone(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("created")], job_id=None, released=False,
                      submitted_at=NOW - 5)
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert fake.calls == [] and data["notes"] == []


def test_observe_on_a_real_clock(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("winner")], submitted_at=time.time() - 3600)
    assert observe(layout, Scheduler(runner=fake))["state"] == "succeeded"


def test_both_terminal_and_agreeing_prefers_accounting_detail() -> None:
    verdict = norm.decide(norm.Evidence(attempt_state="running",
                                        queue=JobRow("5_1", "FAILED", "NonZeroExitCode"),
                                        acct=JobRow("5_1", "FAILED", None, 3, 0)))
    assert verdict.source == "sacct" and "(exit 3)" in verdict.reason


# ============================================================================= polling

from synthbatch.control.runs.status.watch import Backoff, watch  # noqa: E402


def test_backoff_grows_to_the_cap_and_resets_on_change() -> None:
    backoff = Backoff(base_s=2, cap_s=30, factor=1.5)
    waits = [backoff.next(changed=False) for _ in range(12)]
    assert waits[:3] == [2, 3, 4.5] and waits[-1] == 30 and waits == sorted(waits)
    assert backoff.next(changed=True) == 2
    assert backoff.next(changed=False, failed=True) == 4  # an error doubles


def test_backoff_never_tight() -> None:
    backoff = Backoff(base_s=0.0001, cap_s=0.001, floor_s=1.0)
    assert all(backoff.next(changed=i % 2 == 0) >= 1.0 for i in range(20))


def test_backoff_floor_grows_with_the_cost_of_a_refresh() -> None:
    backoff = Backoff(base_s=2, cap_s=30)
    assert backoff.next(changed=True, took_s=0.05) == 2
    assert backoff.next(changed=True, took_s=1.5) == 15  # 10x the refresh's own time
    assert backoff.next(changed=False, took_s=6.0) == 60  # above the cap, too


def test_watch_waits_ten_times_a_slow_refresh() -> None:
    now = [0.0]
    snapshots = iter([{"state": "running", "counts": {"running": 1}, "records_done": 1},
                      {"state": "running", "counts": {"running": 1}, "records_done": 2},
                      {"state": "succeeded", "counts": {"succeeded": 1}}])

    def fetch() -> dict:
        now[0] += 4.0  # every refresh takes 4 s (a large run on a slow filesystem)
        return next(snapshots)

    sleeps: list = []
    watch(fetch, lambda _: None, Backoff(base_s=2), clock=lambda: now[0],
          sleep=lambda s: (sleeps.append(s), now.__setitem__(0, now[0] + s)))
    assert sleeps == [40, 40]


def test_watch_refreshes_until_the_run_ends() -> None:
    snapshots = iter([{"state": "running", "counts": {"running": 1}, "records_done": 1},
                      {"state": "running", "counts": {"running": 1}, "records_done": 1},
                      {"state": "running", "counts": {"running": 1}, "records_done": 2,
                       "scheduler_error": "down"},
                      {"state": "succeeded", "counts": {"succeeded": 1}, "records_done": 3}])
    shown, sleeps = [], []
    last = watch(lambda: next(snapshots), shown.append, Backoff(base_s=2), clock=lambda: 0.0,
                 sleep=sleeps.append)
    assert last["state"] == "succeeded" and len(shown) == 4
    assert sleeps == [2, 3, 6]  # first, unchanged (x1.5), scheduler error (x2)


def test_watch_stops_at_max_s() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    last = watch(lambda: {"state": "running", "counts": {}}, lambda _: None, Backoff(),
                 max_s=10, clock=lambda: now[0], sleep=sleep)
    assert last["state"] == "running" and now[0] == pytest.approx(10)


# ----------------------------------------------------------------------------- reconciliation


def ready(layout: RunLayout, index: int) -> None:
    """Readiness ``ready`` with an endpoint, as a live agent publishes it."""
    publish_readiness(layout.attempt(index, 1).readiness_json, index, 1, 1, "starting")
    publish_readiness(layout.attempt(index, 1).readiness_json, index, 1, 1, "ready",
                      endpoints={"tiny": "http://127.0.0.1:9/v1"})


def test_a_job_gone_from_squeue_and_failed_in_sacct_is_recorded_at_once(tmp_path: Path,
                                                                         fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    ready(layout, 0)
    squeue_cmd(fake, "")  # squeue no longer lists the job: no process of it is left
    fake.on("sacct", stdout="500_0|FAILED|0:9\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "failed"
    record = json.loads(layout.attempt(0, 1).attempt_json.read_text())
    assert record["state"] == "failed" and "signal 9" in record["reason"]
    readiness = json.loads(layout.attempt(0, 1).readiness_json.read_text())
    assert (readiness["state"], readiness["revision"], readiness["endpoints"]) == \
        ("failed", 3, {})
    assert "the allocation ended without its agent: job failed" in readiness["reason"]


def test_a_terminal_squeue_row_is_recorded_at_once(tmp_path: Path, fake: FakeSlurm) -> None:
    # MinJobAge keeps the ended job in squeue: its terminal row is the common case
    layout = make_run(tmp_path, [Shard("running"), Shard("submitted")])
    ready(layout, 0)
    squeue_cmd(fake, "500_0|FAILED|NonZeroExitCode\n500_1|CANCELLED|None\n")
    fake.on("sacct", stdout="500_0|FAILED|0:9\n500_1|CANCELLED by 0|0:0\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [s["state"] for s in data["shards"]] == ["failed", "cancelled"]
    states_on_disk = [json.loads(layout.attempt(i, 1).attempt_json.read_text())["state"]
                      for i in (0, 1)]
    assert states_on_disk == ["failed", "cancelled"]  # a submitted attempt too
    assert json.loads(layout.attempt(0, 1).readiness_json.read_text())["state"] == "failed"
    again = observe(layout, Scheduler(runner=fake), now=NOW + 1)  # no conflict, no rewrite
    assert [s["state"] for s in again["shards"]] == ["failed", "cancelled"]
    assert json.loads(layout.attempt(0, 1).readiness_json.read_text())["revision"] == 3


def test_a_completing_job_is_left_to_its_agent(tmp_path: Path, fake: FakeSlurm) -> None:
    # KillWait: sacct may already say CANCELLED/FAILED, squeue lists the job COMPLETING
    # while its processes (the agent recording its own outcome) are still there
    layout = make_run(tmp_path, [Shard("running")])
    ready(layout, 0)
    squeue_cmd(fake, "500_0|COMPLETING|None\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [c[0] for c in fake.calls] == ["squeue"]
    assert (data["shards"][0]["state"], data["shards"][0]["reason"]) == \
        ("running", norm.COMPLETING_REASON)
    assert json.loads(layout.attempt(0, 1).attempt_json.read_text())["state"] == "running"
    assert json.loads(layout.attempt(0, 1).readiness_json.read_text())["state"] == "ready"


def test_status_records_cancelled_for_a_job_cancelled_by_hand(tmp_path: Path,
                                                              fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    squeue_cmd(fake, "")
    fake.on("sacct", stdout="500_0|CANCELLED by 0|0:0\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert data["shards"][0]["state"] == "cancelled"
    assert json.loads(layout.attempt(0, 1).attempt_json.read_text())["state"] == "cancelled"


def test_a_running_attempt_whose_job_completed_is_recorded_failed(tmp_path: Path,
                                                                 fake: FakeSlurm) -> None:
    # the agent exited 0 without an outcome: status says failed, so retry must be able to
    # retry it; the record status writes does not then conflict with Slurm's COMPLETED
    layout = make_run(tmp_path, [Shard("running")])
    squeue_cmd(fake, "500_0|COMPLETED|None\n")
    fake.on("sacct", stdout="500_0|COMPLETED|0:0\n")
    first = observe(layout, Scheduler(runner=fake), now=NOW)
    record = json.loads(layout.attempt(0, 1).attempt_json.read_text())
    assert record["state"] == "failed"
    assert record["reason"] == "job completed before the agent recorded an outcome"
    again = observe(layout, Scheduler(runner=fake), now=NOW + 1)
    assert first["shards"][0]["state"] == again["shards"][0]["state"] == "failed"


def test_an_early_sacct_range_record_does_not_override_running_tasks(tmp_path: Path,
                                                                     fake: FakeSlurm) -> None:
    # Right after `scancel 500_2`, slurmdbd can still hold the array as one range record.
    layout = make_run(tmp_path, [Shard("running"), Shard("running"),
                                 Shard("cancelled", "cancelled by `synthbatch cancel`")])
    squeue_cmd(fake, "500_2|CANCELLED|JobArrayTaskLimit\n500_0|RUNNING|None\n"
                     "500_1|RUNNING|None\n")
    fake.on("sacct", stdout="500_[0-2%2]|CANCELLED by 0|0:0\n")
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [s["state"] for s in data["shards"]] == ["running", "running", "cancelled"]


# ======================================================== reading shards without listing


def listed(layout: RunLayout, count: int) -> list:
    """What the listing path (no submission hint) reads for every shard."""
    return [scan_shard(layout, index) for index in range(count)]


def test_hinted_scan_reads_what_listing_reads(tmp_path: Path) -> None:
    shards = [Shard("winner", progress=10), Shard("running", progress=4), Shard("submitted"),
              Shard("failed", "boom"), Shard("cancelled"), Shard("created")]
    layout = make_run(tmp_path, shards)
    (layout.attempt(2, 1).attempt_json).write_text("{not json")
    hints = expected_lookup(submission_views(layout))
    assert [hints(i).attempt for i in range(len(shards))] == [1] * len(shards)
    assert [scan_shard(layout, i, hints(i)) for i in range(len(shards))] == \
        listed(layout, len(shards))


def test_no_listing_when_the_submission_names_the_latest_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = make_run(tmp_path, [Shard("winner", progress=10), Shard("running", progress=4)])
    monkeypatch.setattr(store.os, "listdir", lambda *a: pytest.fail("listed a folder"))
    views = [scan_shard(layout, i, Expected(1, None, 0.0)) for i in range(2)]
    assert views[0].winner and views[0].attempt.state == "succeeded"
    assert views[1].progress.records_done == 4


def test_a_retry_attempt_no_submission_names_yet_is_found(tmp_path: Path,
                                                          fake: FakeSlurm) -> None:
    # retry created attempt 2 (``created``) and crashed before its submission record
    layout = make_run(tmp_path, [Shard("failed", "boom", updated_at=NOW - 7200),
                                 Shard("winner")])
    ensure_dir(layout.attempt(0, 2).root)
    create_attempt(layout.attempt(0, 2).attempt_json, RUN_ID, 0, 2)
    assert scan_shard(layout, 0, Expected(1, None, 0.0)) == listed(layout, 1)[0]
    data = observe(layout, Scheduler(runner=fake), now=NOW)
    assert (data["shards"][0]["state"], data["shards"][0]["attempt"]) == ("created", 2)


def test_a_missing_hinted_record_falls_back_to_listing(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")])
    third = Expected(3, None, 0.0)  # attempt 3 does not exist
    assert scan_shard(layout, 0, third) == listed(layout, 1)[0]
    assert scan_shard(layout, 0, third).attempt.number == 1


def test_submission_views_and_recovery(tmp_path: Path) -> None:
    layout = make_run(tmp_path, [Shard("running")], released=False)
    (view,) = submission_views(layout)
    assert (view.number, view.job_id, view.attempts, view.released) == (1, "500", {"0": 1},
                                                                         False)
    assert needs_recovery([view], True, NOW) and not needs_recovery([], True, NOW)
    layout.submission_json(1).write_text(json.dumps(
        {"schema_version": 1, "number": 1, "job_id": 5, "attempts": {}, "released": True,
         "submitted_at": 1.0}))
    with pytest.raises(StateError, match="0001.json: job_id have the wrong type"):
        submission_views(layout)


def test_a_plan_over_one_mebibyte_is_read(tmp_path: Path, fake: FakeSlurm) -> None:
    layout = make_run(tmp_path, [Shard("winner")])
    data = json.loads(layout.plan_json.read_text())
    data["padding"] = "x" * (1 << 21)
    layout.plan_json.chmod(0o600)
    layout.plan_json.write_text(json.dumps(data))
    assert load_plan_view(layout).shard_records == (10,)


def test_record_failures_from_progress_reach_status_and_the_watch_frame(
        tmp_path: Path, fake: FakeSlurm) -> None:
    from synthbatch.control.cli.render import frame

    layout = make_run(tmp_path, [Shard("running", progress=4), Shard("running", progress=2)])
    for shard, failures in ((0, {"failures": 3}), (1, {})):  # shard 1: an older client's
        progress = layout.attempt(shard, 1).progress_json
        data = json.loads(progress.read_text())
        del data["failures"]
        write_json_atomic(progress, {**data, **failures})
    squeue_cmd(fake, "500_0|RUNNING|None\n500_1|RUNNING|None\n")
    status = observe(layout, Scheduler(runner=fake), now=NOW)
    assert [s["record_failures"] for s in status["shards"]] == [3, 0]
    assert status["record_failures"] == 3
    assert "record failures 3" in frame(status)[1]
