"""Harness of the allocation tests on the real Slurm testbed: stage a run directory by hand
(plan, staged agent, submission, attempt), submit its rendered batch script as a held
one-task array, and check what the job left behind.
"""

from __future__ import annotations

import dataclasses
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from synthbatch.agent_stdlib.attempts import (
    advance_attempt,
    load_attempt,
    load_readiness,
)
from synthbatch.agent_stdlib.contracts import Plan, ReadinessRecord, SubmissionRecord, sha256_bytes
from synthbatch.agent_stdlib.layout import AttemptLayout, RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable, write_json_atomic
from synthbatch.control.slurm.renderer import BatchScript, render_batch_script
from tests.agent_runs import local_plan
from tests.conftest import FAKE_SERVER
from tests.fakes import create_attempt
from tests.processes import processes_mentioning


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
        resources=resources, signal_lead_s=lead, max_requeues=max_requeues,
        export=plan.job_env())))
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
