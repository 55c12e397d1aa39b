"""The allocation runtime on the real Slurm testbed: preflight, supervision, signals,
requeue and cleanup.

Each test stages a run directory by hand (plan, staged agent, submission, attempt),
submits the rendered batch script as a held one-task array, drives the scenario, and
asserts the final durable state plus that no process or step of the run is left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pytest

from agent_stdlib.allocation.preflight import assign_ports
from agent_stdlib.attempts import advance_attempt, create_attempt, load_attempt, load_readiness
from agent_stdlib.contracts import Plan, ReadinessRecord, SubmissionRecord, sha256_bytes
from agent_stdlib.layout import AttemptLayout, RunLayout
from agent_stdlib.publish import load_winner
from agent_stdlib.statefile import ensure_dir, publish_immutable, read_json, write_json_atomic
from control.runs import normalize as norm
from control.runs.reconcile import complete_missing_winner, mark_ended
from control.runs.status import SchedulerView, gone
from control.slurm.parsers import index_rows
from control.slurm.renderer import BatchScript, render_batch_script
from control.slurm.scheduler import Scheduler
from tests.agent_runs import local_plan
from tests.conftest import FAKE_SERVER
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm


@dataclass
class Job:
    """One staged run and its single array task."""

    root: Path
    plan: Plan
    array_id: str
    model: str
    cluster: Any

    @property
    def key(self) -> str:
        return f"{self.array_id}_0"

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.root)

    @property
    def paths(self) -> AttemptLayout:
        return self.layout.attempt(0, 1)

    def attempt(self):  # type: ignore[no-untyped-def]
        return load_attempt(self.paths.attempt_json)

    def readiness(self) -> Optional[ReadinessRecord]:
        try:
            return load_readiness(self.paths.readiness_json)
        except Exception:  # noqa: BLE001 - a half-written record is simply "not yet"
            return None

    def release(self) -> None:
        self.cluster.run("scontrol", "release", self.array_id)

    def wait_readiness(self, state: str, timeout: float = 40) -> ReadinessRecord:
        return self.cluster.wait_for(
            lambda: (r := self.readiness()) is not None and r.state == state and r,
            timeout=timeout, what=f"readiness {state}")

    def wait_done(self, timeout: float = 90) -> List[str]:
        states = self.cluster.wait_job(self.array_id, timeout=timeout)
        self.cluster.wait_for(lambda: not self.steps(), timeout=20, what="steps gone")
        return states

    def steps(self) -> List[str]:
        out = self.cluster.run("squeue", "-h", "-s", "-j", self.key, "-o", "%i|%j",
                               check=False).stdout
        return out.split()

    def leftovers(self) -> List[str]:
        return processes_mentioning(str(self.root), self.model)





def wait_no_leftovers(job: Job, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while job.leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job.leftovers(), f"processes of the run were left behind: {job.leftovers()}"


def make_plan(python: str, model: str, flags: List[str], records: int = 6, gpus: int = 1,
              startup_timeout_s: float = 30.0, max_retries: int = 2,
              model_path: Optional[str] = None) -> Plan:
    command = [python, str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", model, *flags]
    plan = local_plan(python, command, records=records, startup_timeout_s=startup_timeout_s,
                      run_id=f"rt-{secrets.token_hex(4)}")
    dep = dataclasses.replace(plan.deployments[0], gpus_per_replica=gpus, served_name=model,
                              model=model_path or model)
    client = dataclasses.replace(plan.client, max_retries=max_retries)
    resources = dataclasses.replace(plan.resources, gpus=gpus, partition="debug", mem_mb=512)
    runtime = dataclasses.replace(plan.runtime, launcher="srun", step_mem_mb=128, grace_s=3.0,
                                  port_base=21000)
    return plan.replace(deployments=(dep,), client=client, resources=resources,
                        runtime=runtime)


def submit(cluster: Any, tmp_path: Path, agent_pyz: Path, python: str, plan: Plan,
           model: str, time_limit: str = "00:05:00", lead: int = 30, max_requeues: int = 0,
           job_gpus: Optional[int] = None, hold: bool = False) -> Job:
    """Stage the run, ``sbatch --hold --array=0`` the rendered script, record, release."""
    root = ensure_dir(tmp_path / "run")
    layout = RunLayout(root)
    payload = plan.to_json().encode("utf-8")
    publish_immutable(layout.plan_json, payload)
    shutil.copyfile(agent_pyz, root / "agent.pyz")
    for folder in (layout.submissions, layout.slurm_logs, layout.attempt(0, 1).root):
        ensure_dir(folder)
    create_attempt(layout.attempt(0, 1).attempt_json, plan.run_id, 0, 1)
    resources = dataclasses.replace(plan.resources, time_limit=time_limit,
                                    gpus=plan.resources.gpus if job_gpus is None else job_gpus)
    script = layout.submission_script(1)
    script.write_text(render_batch_script(BatchScript(
        job_name=f"synthbatch-{plan.run_id}", run_dir=str(root), agent_pyz="agent.pyz",
        agent_sha256=sha256_bytes((root / "agent.pyz").read_bytes()),
        plan_sha256=sha256_bytes(payload), submission=1, python=python,
        resources=resources, signal_lead_s=lead, max_requeues=max_requeues)))
    array_id = cluster.sbatch("--hold", "--array=0", str(script))
    record = SubmissionRecord(number=1, argv=(), job_id=array_id, attempts={"0": 1},
                              submitted_at=time.time(), released=not hold)
    write_json_atomic(layout.submission_json(1), record.to_dict())
    advance_attempt(layout.attempt(0, 1).attempt_json, "submitted", job_id=f"{array_id}_0",
                    submission=1)
    job = Job(root=root, plan=plan, array_id=array_id, model=model, cluster=cluster)
    if not hold:
        job.release()
    return job


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


def slurm_log(job: Job) -> str:
    return "".join(p.read_text(errors="replace") for p in job.layout.slurm_logs.glob("*.out"))


def assert_stopped_and_clean(job: Job, state: str) -> Any:
    """The attempt is ``state``, readiness ``stopped``, no step and no process is left."""
    attempt = job.attempt()
    assert attempt.state == state, (attempt, slurm_log(job))
    assert job.readiness().state == "stopped", job.readiness()
    assert not job.steps()
    wait_no_leftovers(job)
    return attempt


# ----------------------------------------------------------------------------- cancel


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
    # Records complete every fraction of a second, so whenever Slurm sends the lead signal
    # (it may come as early as 5 s in) some are done and the run is far from finished.
    job = launch(["--token-latency", "0.02"], records=2000, time_limit="00:01:00", lead=55)
    job.wait_done(timeout=150)
    attempt = assert_stopped_and_clean(job, "failed")
    assert "SIGUSR1" in attempt.reason and "kept as partial" in attempt.reason, attempt
    assert attempt.partial_records and 0 < attempt.partial_records < 2000


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


def job_steps_in_accounting(cluster: Any, key: str) -> List[str]:
    out = cluster.run("sacct", "-n", "-P", "-j", key, "--format=JobID,JobName",
                      check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def assert_failed_in_preflight(job: Job, cluster: Any, needle: str) -> None:
    job.wait_done()
    attempt = assert_stopped_and_clean(job, "failed")
    assert attempt.reason.startswith("preflight: ") and needle in attempt.reason, attempt
    assert not list(job.paths.execution_logs(1).glob("server-*"))
    if cluster.accounting:
        rows = cluster.wait_for(lambda: job_steps_in_accounting(cluster, job.key),
                                what="sacct rows")
        assert not any("server-" in row for row in rows), rows


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
    done = complete_missing_winner(job.layout, 0, attempt.attempt)
    assert done.replace(created_at=0) == original.replace(created_at=0)
    again = complete_missing_winner(job.layout, 0, attempt.attempt)
    assert again == done  # first writer won; never a second winner
