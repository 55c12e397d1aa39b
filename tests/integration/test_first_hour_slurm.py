"""The first hour on a cluster, on the real testbed: mistakes caught before the queue, why a
run can never start, exit statuses scripts can trust, logs --follow right after submit,
overrides, and a finished run's numbers from accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.control import api
from synthbatch.control.runs.store import load_run, run_layout
from tests.conftest import REPO
from tests.integration.runs import cli_json, invoke, wait_until, write_profile, write_run

pytestmark = pytest.mark.slurm
MULTIGPU = REPO / "examples" / "vllm-multigpu.toml"


def synthbatch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The installed console script, as a user's shell script runs it."""
    exe = Path(sys.executable).parent / "synthbatch"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ), check=False)


def test_plan_and_submit_refuse_what_no_node_can_hold(slurm_cluster, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    result = invoke("plan", str(MULTIGPU), "--profile", profile, "--json")
    assert result.exit_code == 2, result.output
    errors = [c for c in json.loads(result.stdout)["checks"] if c["level"] == "error"]
    assert [(c["field"], c["message"].split(", but")[0]) for c in errors] == [
        (f"{MULTIGPU}: resources.cpus", "16 CPUs per node"),
        (f"{MULTIGPU}: resources.mem_mb", "131072 MB per node")]
    for check in errors:  # the partition's biggest node, as sinfo reports it
        assert "biggest node of partition debug has" in check["message"]
        assert "(node1: 8 CPUs, 4096 MB, 4 GPUs)" in check["message"]
    submitted = invoke("submit", str(MULTIGPU), "--profile", profile)
    assert submitted.exit_code == 2
    assert "submit refused: " in submitted.stderr and "resources.cpus" in submitted.stderr
    assert not (tmp_path / "workspace" / "runs").exists()  # nothing staged or queued


def test_a_run_that_can_never_start_says_so_and_wait_says_how_it_ended(
        slurm_cluster, tmp_path, python_exe):
    profile = write_profile(tmp_path, python_exe)
    run_file = write_run(tmp_path, records=4, shards=2, latency=0.0)
    run_file.write_text(run_file.read_text() + "[resources]\ncpus = 16\n")
    assert invoke("plan", str(run_file), "--profile", str(profile)).exit_code == 2
    run = api.submit(run_file, profile, checks=False)  # as Slurm alone would take it
    try:
        status = wait_until("Slurm's pending reason", lambda: (
            lambda s: s if s.data.get("blocked") else None)(run.status()), 60)
        assert status.state == "running"  # the job exists and is pending...
        (group,) = status.data["blocked"]
        assert (group["reason"], group["shards"], group["never"]) == ("BadConstraints",
                                                                      [0, 1], True)
        text = invoke("status", run.run_id, "--profile", str(profile)).stdout
        assert "can never start: shard(s) 0-1 pending BadConstraints: no node of the " \
               "partition has the CPUs, memory, GPUs or features asked for" in text
        # wait ends at once (before: "1 pending" lines until --timeout, exit 8)
        stuck = synthbatch("wait", run.run_id, "--timeout", "120", "--profile", str(profile))
        assert stuck.returncode == 9, stuck.stderr
        assert "pending: 2 BadConstraints (can never start)" in stuck.stderr.splitlines()[0]
        assert f"run {run.run_id} can never finish: 2 of 2 shard(s) pending with a reason " \
               "Slurm keeps (shard 0: BadConstraints: no node of the partition" in stuck.stderr
        assert synthbatch("status", run.run_id, "--exit-status", "--profile",
                          str(profile)).returncode == 9
    finally:
        run.cancel()
    done = synthbatch("wait", run.run_id, "--interval", "1", "--profile", str(profile))
    assert done.returncode == 7, done.stderr
    assert f"run {run.run_id} was cancelled: 2 of 2 shard(s) cancelled" in done.stderr


def test_submit_wait_exits_0_follows_logs_and_keeps_the_numbers(slurm_cluster, tmp_path,
                                                                python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=6, shards=2, latency=0.05)
    exe = Path(sys.executable).parent / "synthbatch"
    waiting = subprocess.Popen([str(exe), "submit", str(run_file), "--profile", profile,
                                "--wait", "--interval", "1", "-p", "debug", "-t", "00:07:00"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert waiting.stdout is not None
    run_id = waiting.stdout.readline().strip()  # printed first, before the wait
    follow = synthbatch("logs", run_id, "--follow", "--profile", profile)  # right after submit
    out, err = waiting.communicate(timeout=240)
    assert waiting.returncode == 0, err
    assert out.startswith(f"run {run_id}: succeeded")
    assert follow.returncode == 0, follow.stderr  # was exit 3 "no log" before the job ran
    assert "==> shard 0 attempt 1 execution 1: client (" in follow.stderr
    assert follow.stdout.strip()  # the client's own log, printed as it grew

    layout = run_layout(tmp_path / "workspace", run_id)
    record = load_run(layout)
    assert record.overrides == {"partition": "debug", "time_limit": "00:07:00"}
    plan = json.loads(layout.plan_json.read_text())
    assert plan["resources"]["time_limit"] == "00:07:00"

    def counted() -> Dict[str, Any]:
        totals = cli_json("status", run_id, "--profile", profile)["totals"]
        return totals if (layout.root / "totals.json").exists() else {}

    totals = wait_until("GPU-hours from accounting", counted, 60)
    assert totals["gpu_hours_from"] == "accounting (sacct)"
    assert 0 < totals["gpu_hours"] < 0.2  # two 1-GPU shards for some seconds each
    assert totals["elapsed_s"] > 0 and totals["records_per_s"] > 0
    typed = api.run(run_id, profile).status()
    assert typed.succeeded and typed.gpu_hours == totals["gpu_hours"]


def test_wait_of_a_failed_run_exits_6(slurm_cluster, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=2, shards=1, latency=0.0)
    text = run_file.read_text()
    start = text.index("command = ")
    end = text.index("\n", start)
    run_file.write_text(text[:start] + 'command = ["/bin/sh", "-c", "exit 3", "{port}"]' +
                        text[end:])  # the server dies at once: the shard fails
    result = synthbatch("submit", str(run_file), "--profile", profile, "--wait", "--interval",
                        "1", "--json")
    assert result.returncode == 6, result.stderr
    data = json.loads(result.stdout)
    assert data["status"]["state"] == "failed" and data["run_id"]
    error = json.loads(result.stderr.strip().splitlines()[-1])["error"]
    assert error["code"] == "run_failed"
    assert error["message"].startswith(f"run {data['run_id']} failed: 1 of 1 shard(s) failed "
                                       f"(shard 0: ")


def test_gpu_hours_without_accounting(slurm_cluster_noacct, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=2, shards=1, latency=0.0)
    result = synthbatch("submit", str(run_file), "--profile", profile, "--wait", "--interval",
                        "1", "--json")
    assert result.returncode == 0, result.stderr
    totals = json.loads(result.stdout)["status"]["totals"]
    assert totals["gpu_hours"] is None
    assert totals["gpu_hours_from"] == "no accounting on this cluster"
    assert totals["elapsed_s"] > 0


def test_status_and_logs_default_to_the_latest_run(slurm_cluster, tmp_path, python_exe):
    profile = str(write_profile(tmp_path, python_exe))
    first = cli_json("submit", str(write_run(tmp_path, 2, 1, 0.0)), "--profile", profile)
    time.sleep(1.1)  # run.json times order the runs
    second = cli_json("submit", str(write_run(tmp_path, 2, 1, 0.0)), "--profile", profile)
    assert cli_json("status", "--profile", profile)["run_id"] == second["run_id"]
    assert synthbatch("wait", "--profile", profile, "--quiet").returncode == 0
    assert synthbatch("wait", first["run_id"], "--profile", profile, "--quiet").returncode == 0
    logs = synthbatch("logs", "--profile", profile)
    assert logs.returncode == 0 and second["run_id"] in logs.stderr
