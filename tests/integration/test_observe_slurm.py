"""Observation on the real Slurm testbeds: status, watch, logs and cancel of live runs."""

from __future__ import annotations

import subprocess
from typing import Any, Dict, List

import pytest

from tests.integration.runs import cli_json, invoke, wait_until, write_profile, write_run

pytestmark = pytest.mark.slurm


def shard_states(status: Dict[str, Any]) -> List[str]:
    return [s["state"] for s in status["shards"]]


def test_status_cancel_and_hand_scancel_of_a_live_run(slurm_cluster, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe, array_throttle=2))
    run_file = write_run(tmp_path, records=12, shards=3, latency=0.4)
    submitted = cli_json("submit", str(run_file), "--profile", profile)
    run_id, job = submitted["run_id"], submitted["job_id"]

    def status() -> Dict[str, Any]:
        return cli_json("status", run_id, "--profile", profile)

    # pending: the throttle keeps shard 2 queued while 0 and 1 run
    first = wait_until("shards 0 and 1 running with progress", lambda: (
        lambda s: s if shard_states(s)[:2] == ["running", "running"]
        and s["shards"][0]["records_done"] > 0 else None)(status()))
    assert first["shards"][2]["state"] == "pending"
    assert first["shards"][2]["reason"] == "JobArrayTaskLimit"
    assert first["state"] == "running" and first["rate"] > 0 and first["eta_s"] is not None

    # cancel one (pending) shard: only its task is scancelled; it converges to cancelled
    cancelled = cli_json("cancel", run_id, "--shard", "2", "--profile", profile)
    assert cancelled["scancelled"] == [f"{job}_2"] and cancelled["converged"]
    assert cancelled["states"] == {"2": "cancelled"}
    again = cli_json("cancel", run_id, "--shard", "2", "--profile", profile)
    assert again["scancelled"] == [] and again["states"] == {"2": "cancelled"}
    assert status()["shards"][0]["state"] == "running"

    # a job killed by hand, outside synthbatch, shows cancelled with Slurm's reason
    subprocess.run(["scancel", f"{job}_1"], check=True, timeout=30)
    by_hand = wait_until("shard 1 cancelled", lambda: (
        lambda s: s if s["shards"][1]["state"] == "cancelled"
        and "agent:" in (s["shards"][1]["reason"] or "") else None)(status()), 60)
    assert by_hand["shards"][1]["reason"].startswith(
        "job cancelled by uid 0 outside synthbatch; agent: received SIGTERM")
    assert by_hand["shards"][2]["reason"].startswith("cancelled by `synthbatch cancel`")

    # --watch (not a terminal): plain lines until the run ends
    watched = invoke("status", run_id, "--watch", "--interval", "1", "--profile", profile)
    assert watched.exit_code == 0, watched.output
    lines = watched.stdout.strip().splitlines()
    assert lines and "\x1b[" not in watched.stdout
    assert f"run {run_id}: cancelled" in lines[-1]

    final = status()
    assert shard_states(final) == ["succeeded", "cancelled", "cancelled"]
    assert final["records_done"] >= 4 and final["counts"] == {"cancelled": 2, "succeeded": 1}
    assert {f["shard"] for f in final["failures"]} == {1, 2}

    logs = invoke("logs", run_id, "--shard", "0", "--profile", profile)
    assert logs.exit_code == 0 and "client.log" in logs.stderr
    slurm_log = cli_json("logs", run_id, "--shard", "1", "--step", "slurm", "--profile", profile)
    assert slurm_log["path"].endswith(f"logs/slurm-{job}_1.out")
    assert "CANCELLED" in slurm_log["text"]
    runs = cli_json("runs", "--profile", profile)["runs"]
    assert runs[0]["run_id"] == run_id and runs[0]["state"] == "cancelled"


def test_run_on_a_cluster_without_accounting(slurm_cluster_noacct, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=8, shards=2, latency=0.25)
    submitted = cli_json("submit", str(run_file), "--profile", profile)
    run_id, job = submitted["run_id"], submitted["job_id"]

    def status() -> Dict[str, Any]:
        return cli_json("status", run_id, "--profile", profile)

    # squeue says RUNNING as soon as the batch script starts; the agent's own record exists
    # only once it runs, so wait for shard 0's first record (a scancel before that is
    # recorded by status as 'job cancelled outside synthbatch': the agent never ran)
    running = wait_until("both shards running, shard 0 generating", lambda: (
        lambda s: s if shard_states(s) == ["running", "running"]
        and s["shards"][0]["records_done"] > 0 else None)(status()))
    assert running["scheduler_error"] is None
    # shard 0, not the last task: that one's raw job id is the array id, and the agent's
    # step control (agent_stdlib/allocation/steps.py) then also lists its siblings' steps
    subprocess.run(["scancel", f"{job}_0"], check=True, timeout=30)
    final = wait_until("the run to end", lambda: (
        lambda s: s if s["state"] not in ("pending", "running") else None)(status()), 90)
    assert shard_states(final) == ["cancelled", "succeeded"], final
    assert final["accounting"] is False  # sacct was asked about the ended job and refused
    assert final["scheduler_error"] is None
    assert "SIGTERM" in final["shards"][0]["reason"]  # the agent's own record
    text = invoke("status", run_id, "--profile", profile)
    assert text.exit_code == 0 and text.stdout.startswith(f"run {run_id}: cancelled")
    assert "accounting is disabled" in text.stdout
