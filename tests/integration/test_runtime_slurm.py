"""The allocation runtime on the real Slurm testbed: preflight, supervision, signals,
requeue and cleanup.

Each test stages a run directory by hand (plan, staged agent, submission, attempt),
submits the rendered batch script as a held one-task array, drives the scenario, and
asserts the final durable state plus that no process or step of the run is left.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import time
from typing import Any, Callable, List, Optional, Tuple

import pytest

from synthbatch.agent_stdlib.allocation.preflight import assign_ports
from synthbatch.agent_stdlib.publish import complete_winner, load_winner
from synthbatch.agent_stdlib.statefile import read_json
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.status.reconcile import mark_ended
from synthbatch.control.runs.status.refresh import SchedulerView, gone
from synthbatch.control.slurm.parsers import index_rows
from synthbatch.control.slurm.scheduler import Scheduler
from tests.integration.allocations import (
    Job,
    assert_failed_in_preflight,
    assert_stopped_and_clean,
    make_plan,
    submit,
    wait_no_leftovers,
)
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm


@pytest.fixture
def launch(slurm_cluster, tmp_path, agent_pyz, python_exe) -> Callable[..., Job]:
    """``launch(flags, **plan_and_submit_options)`` -> a submitted Job; cancelled at teardown."""
    jobs: List[Job] = []
    plan_keys = {"records", "gpus", "startup_timeout_s", "max_retries", "model_path"}

    def start(flags: List[str], **options: Any) -> Job:
        model = f"fake-{secrets.token_hex(4)}"
        plan_opts = {k: v for k, v in options.items() if k in plan_keys}
        submit_opts = {k: v for k, v in options.items() if k not in plan_keys}
        plan = make_plan(python_exe, model, flags, **plan_opts)
        job = submit(slurm_cluster, tmp_path, agent_pyz, python_exe, plan, model,
                     **submit_opts)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        slurm_cluster.run("scancel", job.array_id, check=False)


def test_scancel_while_pending_leaves_the_attempt_unstarted(launch, slurm_cluster):
    job = launch([], hold=True)
    assert slurm_cluster.job_states(job.array_id) == ["PENDING"]
    slurm_cluster.run("scancel", job.array_id)
    assert job.wait_done(30) == ["CANCELLED"]
    assert job.attempt().state == "submitted"
    assert job.readiness() is None and not job.paths.logs.exists()
    # never "lost": the table calls a job cancelled while pending cancelled
    (row,) = Scheduler().queue([job.key])
    verdict = norm.decide(norm.Evidence(attempt_state="submitted", queue=row))
    assert verdict.state == "cancelled"
    wait_no_leftovers(job)


def test_scancel_while_servers_boot_cancels_and_cleans_up(launch, slurm_cluster):
    job = launch(["--startup-delay", "60"], startup_timeout_s=120)
    job.wait_readiness("starting")
    slurm_cluster.wait_for(lambda: any("|server-tiny-0" in s for s in job.steps()),
                           what="server step")
    slurm_cluster.run("scancel", job.array_id)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "cancelled")
    assert "SIGTERM" in attempt.reason


def test_scancel_while_ready_cancels_and_cleans_up(launch, slurm_cluster):
    job = launch(["--token-latency", "0.2"], records=12)
    job.wait_readiness("ready")
    slurm_cluster.run("scancel", job.array_id)
    job.wait_done()
    assert_stopped_and_clean(job, "cancelled")
    assert load_winner(job.layout, 0) is None


def test_scancel_during_the_client_keeps_partial_output(launch, slurm_cluster):
    job = launch(["--token-latency", "0.05"], records=40)
    slurm_cluster.wait_for(lambda: (read_json(job.paths.progress_json) or {})
                           .get("records_done", 0) >= 2, what="client progress")
    slurm_cluster.run("scancel", job.array_id)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "cancelled")
    assert attempt.partial_records is None or 0 < attempt.partial_records < 40


# ----------------------------------------------------------------------------- USR1 / requeue


def readiness_history(job: Job, until: Callable[[], bool],
                      timeout: float) -> List[Tuple[int, int, str]]:
    """Poll readiness until ``until()``; (revision, execution, state) of every change."""
    seen: List[Tuple[int, int, str]] = []
    deadline = time.monotonic() + timeout
    while not until():
        record = job.readiness()
        if record and (not seen or seen[-1][0] != record.revision):
            seen.append((record.revision, record.execution, record.state))
        if time.monotonic() > deadline:
            pytest.fail(f"timed out; readiness so far {seen}")
        time.sleep(0.05)
    return seen


def test_usr1_stops_gracefully_requeues_and_resumes(launch, slurm_cluster):
    job = launch(["--token-latency", "0.03"], records=30, max_requeues=1)
    slurm_cluster.wait_for(lambda: (read_json(job.paths.progress_json) or {})
                           .get("records_done", 0) >= 3, what="client progress")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job.key)
    history = readiness_history(job, lambda: job.attempt().state in ("succeeded", "failed"),
                                timeout=90)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "succeeded")
    assert attempt.restarts == 1
    assert ("restarting" in [s for _, e, s in history if e == 2]), history
    revisions = [r for r, _, _ in history]
    assert revisions == sorted(set(revisions)), history
    winner = load_winner(job.layout, 0)
    assert winner is not None and winner.records == 30
    lines = (job.paths.output / winner.files[0].path).read_text().splitlines()
    assert [int(line.split('"index": ')[1].split(",")[0]) for line in lines] == list(range(30))
    tokens = sum(json.loads(line)["usage"]["completion_tokens"] for line in lines)
    progress = read_json(job.paths.progress_json)  # the requeued execution's counters
    assert progress["records_done"] == 30 and progress["tokens"] == tokens == 30 * 8
    first_client = (job.paths.execution_logs(1) / "client.log").read_text()
    assert "stopped by a signal; kept" in first_client


def test_time_limit_with_usr1_lead_fails_with_partial_kept(launch, slurm_cluster):
    # slurmctld sends lead signals and enforces time limits in one periodic pass (~30 s,
    # slower under load), and sends a lead signal up to 60 s early (sbatch(1), --signal).
    # A 3-minute limit with a 60 s lead puts the signal 60-120 s in: records are written
    # by then (they complete every fraction of a second once the server is up, seconds
    # in), the run is far from finished (20,000 records), and at least 60 s, two passes,
    # remain before the limit. (A 110 s lead in 2 minutes let the signal come at the first
    # pass after the start, before any record; a 55 s window before the limit once held no
    # pass at all, and the job got only SIGTERM.)
    job = launch(["--token-latency", "0.02"], records=20000, time_limit="00:03:00", lead=60)
    job.wait_done(timeout=300)
    attempt = assert_stopped_and_clean(job, "failed")
    assert "SIGUSR1" in attempt.reason and "kept as partial" in attempt.reason, attempt
    assert attempt.partial_records and 0 < attempt.partial_records < 20000


def test_scontrol_requeue_while_ready_restarts_and_succeeds(launch, slurm_cluster):
    job = launch(["--token-latency", "0.05"], records=12)
    job.wait_readiness("ready")
    slurm_cluster.run("scontrol", "requeue", job.key)
    history = readiness_history(job, lambda: job.attempt().state == "succeeded", timeout=90)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "succeeded")
    assert attempt.restarts == 1
    revisions = [r for r, _, _ in history]
    assert revisions == sorted(set(revisions)), history
    second = [s for _, e, s in history if e == 2]
    assert second[:1] == ["restarting"] and "ready" in second, history
    assert load_winner(job.layout, 0).records == 12


# ----------------------------------------------------------------------------- failures


def test_server_crash_mid_run_fails_at_once(launch):
    job = launch(["--exit-after", "3"], records=12, max_retries=4)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "failed")
    assert "server-tiny-0 exited with status" in attempt.reason, attempt.reason
    assert load_winner(job.layout, 0) is None


def test_client_crash_fails_the_attempt(launch):
    job = launch(["--fail-every", "1"], max_retries=0)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "failed")
    assert "client exited with status 1" in attempt.reason, attempt.reason


def test_readiness_timeout_fails_with_the_log_tail(launch):
    job = launch(["--startup-delay", "60"], startup_timeout_s=2)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "failed")
    assert "not ready after 2s" in attempt.reason and "listening on" in attempt.reason


def test_preflight_missing_model_path(launch, slurm_cluster, tmp_path):
    job = launch([], model_path=str(tmp_path / "no-such-model"))
    assert_failed_in_preflight(job, slurm_cluster, "no-such-model is missing")


def test_preflight_port_taken(launch, slurm_cluster):
    job = launch([], hold=True)
    port = assign_ports(job.plan.runtime.port_base, job.array_id, 1)[0]  # 1 task: raw id
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        job.release()
        assert_failed_in_preflight(job, slurm_cluster, f"127.0.0.1:{port} is already in use")


def test_preflight_wrong_gpu_count(launch, slurm_cluster):
    job = launch([], gpus=2, job_gpus=1)
    assert_failed_in_preflight(job, slurm_cluster, "needs 2 GPU(s), the allocation has 1")


# ----------------------------------------------------------------------------- agent death


def agent_pid(job: Job) -> Optional[int]:
    for line in processes_mentioning(str(job.root)):
        pid, cmd = line.split(": ", 1)
        if " allocation " in cmd and "srun" not in cmd:
            return int(pid)
    return None


def test_kill9_of_the_agent_ends_the_job_and_reconcile_records_it(launch, slurm_cluster):
    job = launch(["--token-latency", "0.2"], records=12)
    job.wait_readiness("ready")
    os.kill(slurm_cluster.wait_for(lambda: agent_pid(job), what="agent pid"), signal.SIGKILL)
    job.wait_done()
    wait_no_leftovers(job)
    assert not job.steps()
    assert job.attempt().state == "running"  # the agent recorded nothing
    view = SchedulerView(queue=index_rows(Scheduler().queue([job.key])), asked={job.key})
    assert gone(view, job.key)  # squeue's row is terminal: no process of the job is left
    marked = mark_ended(job.layout, 0, 1, "failed", "job failed before the agent recorded "
                                                    "an outcome")
    assert marked.state == "failed" and job.readiness().state == "failed"
    assert mark_ended(job.layout, 0, 1, "failed", "again") == marked  # terminal stays


def test_death_between_success_and_winner_is_completed_by_reconcile(launch):
    job = launch([], records=6)
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "succeeded")
    original = load_winner(job.layout, 0)
    job.layout.winner_json(0).unlink()  # the durable state of a death right before winner
    done = complete_winner(job.layout, 0, attempt.attempt)
    assert done.replace(created_at=0) == original.replace(created_at=0)
    again = complete_winner(job.layout, 0, attempt.attempt)
    assert again == done  # first writer won; never a second winner
