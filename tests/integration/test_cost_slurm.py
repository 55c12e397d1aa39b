"""What records cost on the real testbed (issue 32): a finished run's ``status --json``
has GPU-hours and cost per 1,000 records that agree with sacct's ElapsedRaw x GPUs; a run
with a Slurm requeue and a retry is priced live while it runs, and at its end as computed
by hand from sacct's rows."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt, load_readiness
from synthbatch.agent_stdlib.publish import load_winner
from synthbatch.control import api
from synthbatch.control.runs.store import run_layout
from tests.integration.runs import (
    cli_json,
    crash_wrapper,
    invoke,
    wait_final,
    wait_until,
    write_profile,
    write_run,
)

pytestmark = pytest.mark.slurm


def sacct_rows(job_ids: list) -> List[Tuple[str, int, int]]:
    """sacct asked directly: (job id, ElapsedRaw, gres/gpu of AllocTRES) of every execution
    (``-D``: a requeued job has a row per execution)."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", ",".join(job_ids),
                          "--format=JobID,ElapsedRaw,AllocTRES"], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    rows = []
    for line in out.splitlines():
        job, elapsed, tres = line.split("|")
        gpus = re.search(r"gres/gpu=(\d+)", tres)
        rows.append((job, int(elapsed), int(gpus.group(1)) if gpus else 0))
    return rows


def gpu_hours(rows: List[Tuple[str, int, int]]) -> float:
    """ElapsedRaw x GPUs of ``rows``, in hours."""
    return sum(elapsed * gpus for _, elapsed, gpus in rows) / 3600.0


def sacct_gpu_hours(job_ids: list) -> float:
    """Every execution's ElapsedRaw x the gres/gpu of AllocTRES, in hours."""
    return gpu_hours(sacct_rows(job_ids))


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


PRICE, PER_SHARD = 2.0, 8


def _retried_run(tmp_path: Path) -> Path:
    """Two shards of 8 records on the fake server (one GPU each): shard 1's server crashes
    on its first start (attempt 1 fails: no restart in the allocation, no automatic round),
    shard 0's is slow enough (~16 s of generation) to be requeued while it serves."""
    state = tmp_path / "server-state"
    state.mkdir()
    command = ["{python}", str(crash_wrapper(tmp_path)), str(state), "1",
               "--host", "{host}", "--port", "{port}", "--model", "{served_name}",
               "--token-latency", "0.25"]
    run = tmp_path / "run.toml"
    run.write_text(
        'schema_version = 1\nname = "cost"\nmax_attempts = 2\nresume = "auto"\n'
        f"auto_retry = false\nrecords = {2 * PER_SHARD}\n[retries]\nin_allocation = 0\n"
        "[shards]\ncount = 2\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        '[[deployments]]\nalias = "tiny"\nmodel = "fake-cost"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    return run


def test_a_run_with_a_requeue_and_a_retry_costs_what_sacct_says_by_hand(
        slurm_cluster, tmp_path):
    """Issue 32's proof: cost per 1,000 records of a run with a retry AND a requeue equals
    the figure computed by hand from sacct's rows; GPU-hours and cost are there (not null)
    while it runs; the requeued execution and the failed attempt are its wasted line."""
    profile = write_profile(tmp_path, sys.executable)
    profile.write_text(profile.read_text() + f"[pricing]\nper_gpu_hour = {PRICE}\n")
    run_id = cli_json("submit", str(_retried_run(tmp_path)), "--profile", str(profile))["run_id"]
    layout = run_layout(tmp_path / "workspace", run_id)

    def status() -> Dict[str, Any]:
        return cli_json("status", run_id, "--profile", str(profile))

    readiness = layout.attempt(0, 1).readiness_json
    wait_until("shard 0 serving", lambda: readiness.exists()
               and load_readiness(readiness).state == "ready")
    job0 = load_attempt(layout.attempt(0, 1).attempt_json).job_id
    live = wait_until("GPU-hours so far", lambda: (lambda s: s if s["state"] == "running"
                      and (s["cost"].get("gpu_hours") or 0) > 0 else None)(status()), 60)
    so_far = live["cost"]  # both rounded to 4 digits, from the same unrounded hours
    assert so_far["cost"] == pytest.approx(so_far["gpu_hours"] * PRICE, abs=2e-4), so_far
    assert "cost: GPU-hours " in invoke("status", run_id, "--profile", str(profile)).stdout
    slurm_cluster.run("scontrol", "requeue", job0)  # Slurm requeues shard 0's job
    first = wait_final(run_id, profile, timeout_s=300)
    assert first["counts"] == {"succeeded": 1, "failed": 1}, first["counts"]
    retried = cli_json("retry", run_id, "--yes", "--profile", str(profile))
    assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(1, 2)]
    assert wait_final(run_id, profile, timeout_s=240)["counts"] == {"succeeded": 2}
    cost = wait_until("cost counted from accounting", lambda: (
        lambda c: c if (layout.root / "cost.json").exists() else None)(status()["cost"]), 60)

    # both are really in it: shard 0's one attempt ran twice (a requeue, two sacct rows),
    # shard 1's attempt 1 failed and attempt 2 (another job) won
    (won0, won1) = (load_winner(layout, 0), load_winner(layout, 1))
    assert (won0.attempt, won1.attempt) == (1, 2)
    assert load_attempt(layout.attempt(0, 1).attempt_json).restarts == 1
    failed = load_attempt(layout.attempt(1, 1).attempt_json)
    assert failed.state == "failed", failed
    job1_failed = failed.job_id
    job1_won = load_attempt(layout.attempt(1, 2).attempt_json).job_id
    arrays = sorted({j.split("_")[0] for j in (job0, job1_failed, job1_won)})
    rows = sacct_rows(arrays)
    assert [r[0] for r in rows].count(job0) == 2, rows
    assert len(arrays) == 2 and all(gpus == 1 for _, _, gpus in rows), rows

    # by hand: every row's ElapsedRaw x 1 GPU; wasted = shard 0's first execution (the
    # requeued one) + the failed attempt's execution; 16 records
    total = gpu_hours(rows)
    requeued = gpu_hours([next(r for r in rows if r[0] == job0)])
    wasted = requeued + gpu_hours([r for r in rows if r[0] == job1_failed])
    records = 2 * PER_SHARD
    assert cost["records"] == records == won0.records + won1.records
    assert cost["gpu_hours"] == round(total, 4)
    assert cost["cost"] == round(total * PRICE, 4)
    assert cost["per_1000_records"]["gpu_hours"] == round(total * 1000 / records, 4)
    assert cost["per_1000_records"]["cost"] == round(total * PRICE * 1000 / records, 4)
    assert cost["wasted"] == {"gpu_hours": round(wasted, 4),
                              "cost": round(wasted * PRICE, 4),
                              "requeued_gpu_hours": round(requeued, 4)}
    assert 0 < requeued < wasted < total
    text = invoke("status", run_id, "--profile", str(profile)).stdout
    assert f"wasted on failed attempts and requeues: {round(wasted, 4)} GPU-hours" in text
    # the same figures in the Python API, in runs (GPU-HOURS, COST) and in the dataset card
    assert api.status(run_id, str(profile)).cost["per_1000_records"] == \
        cost["per_1000_records"]
    (listed,) = api.runs(str(profile))
    assert listed.gpu_hours == cost["gpu_hours"]
    assert listed.cost == pytest.approx(total * PRICE, abs=0.01)  # shown to the cent
    cli_json("merge", run_id, "--profile", str(profile))
    card = json.loads((layout.merged / "card.json").read_text())["cost"]["figures"]
    assert {k: card[k] for k in ("gpu_hours", "cost", "per_1000_records", "wasted")} == \
        {k: cost[k] for k in ("gpu_hours", "cost", "per_1000_records", "wasted")}
