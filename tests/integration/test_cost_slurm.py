"""What records cost on the real testbed (issue 32): a finished run's ``status --json``
has GPU-hours and cost per 1,000 records that agree with sacct's ElapsedRaw x GPUs."""

from __future__ import annotations

import re
import subprocess

import pytest

from synthbatch.control import api
from synthbatch.control.runs.store import run_layout
from tests.integration.runs import cli_json, invoke, wait_until, write_profile, write_run

pytestmark = pytest.mark.slurm


def sacct_gpu_hours(job_ids: list) -> float:
    """sacct asked directly: every execution's ElapsedRaw x the gres/gpu of AllocTRES."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids),
                          "--format=JobID,ElapsedRaw,AllocTRES"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    used = 0
    for line in out.splitlines():
        _, elapsed, tres = line.split("|")
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        used += int(elapsed) * (int(gpus.group(1)) if gpus else 0)
    return used / 3600.0


def test_a_finished_runs_cost_per_1000_records_is_saccts(slurm_cluster, tmp_path, python_exe):
    profile = write_profile(tmp_path, python_exe)
    profile.write_text(profile.read_text() + "[pricing]\nper_gpu_hour = 2.0\n"
                       "[pricing.partitions.debug]\nper_gpu_hour = 3.0\n")
    run = api.submit(write_run(tmp_path, records=6, shards=2, latency=0.05), str(profile))
    assert run.wait(timeout_s=240, interval_s=1).succeeded
    layout = run_layout(tmp_path / "workspace", run.run_id)
    cost = wait_until("cost counted from accounting", lambda: (
        lambda c: c if (layout.root / "cost.json").exists() else None)(
        cli_json("status", run.run_id, "--profile", str(profile))["cost"]), 60)
    jobs = sorted({j.split("_")[0] for j in [s["job_id"] for s in api.status(
        run.run_id, str(profile)).data["shards"]]})
    hours = sacct_gpu_hours(jobs)
    assert hours > 0  # the testbed accounts gres/gpu (AccountingStorageTRES)
    assert cost["gpu_hours"] == round(hours, 4) and cost["records"] == 6
    assert cost["price_per_gpu_hour"] == 3.0  # the partition's price
    assert cost["per_1000_records"]["gpu_hours"] == round(hours * 1000 / 6, 4)
    assert cost["per_1000_records"]["cost"] == round(hours * 3.0 * 1000 / 6, 4)
    assert cost["wasted"]["gpu_hours"] == 0.0  # no retry, no requeue
    assert cost["per_1000_records"]["tokens_out"] > 0  # the fake engine's usage
    ((alias, part),) = cost["aliases"].items()
    assert alias == "tiny" and part["gpu_hours"] == cost["gpu_hours"]
    ((column, share),) = cost["columns"].items()  # the one column has the alias's time
    assert share["alias"] == "tiny" and share["gpu_hours"] == cost["gpu_hours"]
    text = invoke("status", run.run_id, "--profile", str(profile)).stdout
    assert f"per 1,000 records: {cost['per_1000_records']['gpu_hours']:g} GPU-hours, $" in text
    (listed,) = api.runs(str(profile))
    assert listed.gpu_hours is not None and listed.cost is not None
