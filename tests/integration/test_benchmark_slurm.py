"""``synthbatch benchmark`` through real Slurm with the fake server: two cases that differ
only in the server's capacity (``--max-concurrency``), swept over client concurrency. The
analysis from a fresh process ranks the case with more capacity first and finds each
case's knee at its capacity; resubmitting submits nothing; the report's charts have a
series per case."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from typing import Dict

import pytest

from tests.conftest import REPO
from tests.integration.runs import (
    LLAMACPP_SERVING,
    cli_json,
    require_llamacpp,
    wait_final,
    wait_until,
    write_profile,
)

pytestmark = pytest.mark.slurm
FAKE = REPO / "fixtures" / "fake_openai_server.py"

BASE_RUN = f"""
schema_version = 1
name = "base"
records = 1
[shards]
count = 1
[client]
seed = 7
[[client.columns]]
name = "text"
type = "llm-text"
model = "gen"
prompt = "Say something about {{topic}}."
max_tokens = 8
[[client.columns]]
name = "topic"
type = "category"
values = ["tides", "stars"]
[[deployments]]
alias = "gen"
engine = "openai"
model = "fake-model"
command = ["{{python}}", "{FAKE}", "--host", "{{host}}", "--port", "{{port}}",
           "--model", "{{served_name}}", "--token-latency", "0.06", "--max-concurrency", "1"]
gpus = 1
startup_timeout_s = 60
[resources]
time_limit = "00:10:00"
cpus = 2
mem_mb = 1024
"""


def _command(capacity: int) -> str:
    # 0.06 s a token (0.48 s a request): the per-request overhead of a loaded 2-core CI
    # machine stays small beside it and the knee is found at the capacity (with 0.02 a
    # loaded CI run once found it at 8)
    return json.dumps(["{python}", str(FAKE), "--host", "{host}", "--port", "{port}",
                       "--model", "{served_name}", "--token-latency", "0.06",
                       "--max-concurrency", str(capacity)])


BENCH = f"""
schema_version = 1
name = "cap"
run = "base.toml"
concurrency = [1, 2, 4, 8]
[records]
per_concurrency = 8
[targets]
records = 100000
deadline_hours = 2
[[cases]]
name = "small"
deployments.gen.command = {_command(2)}
[[cases]]
name = "big"
deployments.gen.command = {_command(4)}
"""


def test_the_case_with_more_capacity_wins_and_the_knee_is_at_capacity(
        slurm_cluster, tmp_path, python_exe):
    (tmp_path / "base.toml").write_text(BASE_RUN)
    bench = tmp_path / "bench.toml"
    bench.write_text(BENCH)
    profile = write_profile(tmp_path, python_exe, cpus_per_task=2, mem_mb=1024)
    first = cli_json("benchmark", "run", str(bench), "--profile", str(profile))
    assert [c["submitted"] for c in first["cases"]] == [True, True]
    # the two cases have one shape: one Slurm array, tasks 0-3 are small's, 4-7 big's
    arrays = {j.split("_")[0] for c in first["cases"] for j in c["job_ids"]}
    assert len(arrays) == 1, first
    small, big = (c["run_id"] for c in first["cases"])
    assert first["cases"][0]["shared_with"] == [big]
    bench_id = first["benchmark_id"]
    partial = cli_json("benchmark", "analyze", bench_id, "--profile", str(profile))
    assert partial["benchmark_id"] == bench_id
    for case in first["cases"]:
        final = wait_final(case["run_id"], profile, timeout_s=400)
        assert final["state"] == "succeeded"
        tasks = [0, 1, 2, 3] if case["run_id"] == small else [4, 5, 6, 7]
        assert [row["job_id"] for row in final["shards"]] == [
            f"{job}_{t}" for job in arrays for t in tasks]
    sacct = subprocess.run(["sacct", "-n", "-P", "-X", "-j", arrays.pop(), "--format=JobID"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert sorted(sacct, key=lambda j: int(j.split("_")[1])) == [
        f"{first['cases'][0]['job_ids'][0].split('_')[0]}_{t}" for t in range(8)]
    again = cli_json("benchmark", "run", str(bench), "--profile", str(profile))
    assert again["benchmark_id"] == bench_id
    assert [(c["run_id"], c["submitted"]) for c in again["cases"]] == [
        (c["run_id"], False) for c in first["cases"]]

    data = cli_json("benchmark", "analyze", bench_id, "--profile", str(profile))
    assert data["complete"] and data["missing"] == []
    assert data["ranking"] == ["big", "small"]
    knees = {c["case"]: c["knee_concurrency"] for c in data["cases"]}
    assert knees == {"small": 2, "big": 4}
    for row in data["points"]:
        assert row["state"] == "done" and row["records"] == 8 * row["concurrency"]
        assert row["latency_ms"]["requests"] == row["records"]
        assert row["latency_ms"]["p50"] <= row["latency_ms"]["p95"] <= row["latency_ms"]["p99"]
        assert row["output_tokens_per_s"] > 0 and row["error_rate"] == 0.0
        assert row["gpu_hours_per_1000"] > 0 and row["boot_s"] is not None
        # the testbed keeps accounting: sacct's start -> ready, GPU-hours of the whole job
        assert row["job_boot_s"] > 0 and row["gpu_hours_from"] == "sacct", row
        assert row["job_wall_s"] >= row["wall_s"]
    assert {p["case"] for p in data["pareto"]} == {"big"}
    best = data["recommendation"]["best"]
    assert best["case"] == "big" and best["feasible"] and best["jobs"] >= 1

    out = tmp_path / "report"
    made = cli_json("benchmark", "report", bench_id, "--output", str(out),
                    "--profile", str(profile))
    assert made["complete"]
    for name in ("throughput.svg", "latency.svg", "pareto.svg"):
        root = ET.fromstring((out / name).read_text())  # well-formed
        names = {g.get("data-series") for g in root.iter("{http://www.w3.org/2000/svg}g")}
        assert {"small", "big"} <= {n.split(" ")[0] for n in names if n}, (name, names)
    assert "![throughput](throughput.svg)" in (out / "README.md").read_text()


def _squeue(job: str) -> Dict[str, str]:
    """``task job id -> state`` of the array ``job`` (pending ranges expanded)."""
    from synthbatch.control.slurm.parsers import index_rows, parse_squeue
    from synthbatch.control.slurm.scheduler import SQUEUE_FORMAT

    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", SQUEUE_FORMAT],
                         capture_output=True, text=True, check=True).stdout
    return {k: row.state for k, row in index_rows(parse_squeue(out)).items() if "_" in k}


SLOW = BENCH.replace('"0.06"', '"0.5"').replace("per_concurrency = 8", "fixed = 6").replace(
    "concurrency = [1, 2, 4, 8]", "concurrency = [1, 2]")


def test_cancel_and_retry_of_one_case_leave_the_other_case_s_tasks_alone(
        slurm_cluster, tmp_path, python_exe):
    (tmp_path / "base.toml").write_text(BASE_RUN)
    bench = tmp_path / "bench.toml"
    bench.write_text(SLOW)  # 6 records at 4 s a request: the tasks run long enough to cancel
    profile = write_profile(tmp_path, python_exe, cpus_per_task=2, mem_mb=1024)
    first = cli_json("benchmark", "run", str(bench), "--profile", str(profile))
    (small, small_jobs), (big, big_jobs) = ((c["run_id"], c["job_ids"]) for c in first["cases"])
    job = small_jobs[0].split("_")[0]
    assert big_jobs == [job]  # one array: small is tasks 0-1, big tasks 2-3
    wait_until("every task started", lambda: set(_squeue(job).values()) == {"RUNNING"}
               and len(_squeue(job)) == 4, timeout_s=120)
    done = cli_json("cancel", small, "--profile", str(profile))
    assert done["scancelled"] == [f"{job}_0", f"{job}_1"] and done["converged"], done
    queue = _squeue(job)
    assert [queue[f"{job}_{t}"] for t in (2, 3)] == ["RUNNING", "RUNNING"], queue
    assert {s["state"] for s in cli_json("status", big, "--profile", str(profile))["shards"]} \
        == {"running"}
    assert {s["state"] for s in cli_json("status", small, "--profile", str(profile))[
        "shards"]} == {"cancelled"}
    retried = cli_json("retry", small, "--yes", "--profile", str(profile))
    new, = (r["job_id"] for r in retried["submissions"])
    assert new != job and retried["submissions"][0]["shards"] == [0, 1]  # its own array,
    assert sorted(_squeue(new)) == [f"{new}_0", f"{new}_1"]  # at its own task ids
    for run_id in (small, big):
        final = wait_final(run_id, profile, timeout_s=400)
        assert final["state"] == "succeeded", final
    assert [s["job_id"] for s in cli_json("status", big, "--profile", str(profile))[
        "shards"]] == [f"{job}_2", f"{job}_3"]
    data = cli_json("benchmark", "analyze", first["benchmark_id"], "--profile", str(profile))
    assert data["complete"] and {p["state"] for p in data["points"]} == {"done"}


SERVING = LLAMACPP_SERVING

LLAMA_RUN = f"""
schema_version = 1
name = "smol"
records = 1
[shards]
count = 1
[client]
seed = 3
[[client.columns]]
name = "topic"
type = "category"
values = ["tides", "stars", "bees"]
[[client.columns]]
name = "line"
type = "llm-text"
model = "smol"
prompt = "Write one sentence about {{topic}}."
max_tokens = 12
temperature = 0.0
[[deployments]]
alias = "smol"
engine = "llamacpp"
model = "{SERVING}/model.gguf"
python = "{SERVING}/venv/bin/python"
served_name = "smollm2"
extra_args = ["-t", "1", "-np", "1", "-c", "1024"]
startup_timeout_s = 120
[resources]
time_limit = "00:20:00"
cpus = 1
mem_mb = 1024
"""

LLAMA_BENCH = """
schema_version = 1
name = "smol"
run = "run.toml"
concurrency = [1, 2]
[records]
fixed = 4
[targets]
records = 1000
deadline_hours = 1
[[cases]]
name = "slots1"
[[cases]]
name = "slots2"
deployments.smol.extra_args = ["-t", "1", "-np", "2", "-c", "2048"]
"""


def test_a_two_by_two_sweep_on_the_real_llamacpp_model(slurm_cluster, tmp_path, python_exe):
    require_llamacpp()
    (tmp_path / "run.toml").write_text(LLAMA_RUN)
    bench = tmp_path / "bench.toml"
    bench.write_text(LLAMA_BENCH)
    profile = write_profile(tmp_path, python_exe, mem_mb=1024, cpus_per_task=1,
                            default_time_limit="00:20:00", grace_s=10)
    first = cli_json("benchmark", "run", str(bench), "--profile", str(profile))
    assert len({j for c in first["cases"] for j in c["job_ids"]}) == 1  # one shape: one array
    for case in first["cases"]:
        status = wait_final(case["run_id"], profile, timeout_s=900, interval_s=3.0)
        assert status["state"] == "succeeded", status
    data = cli_json("benchmark", "analyze", first["benchmark_id"], "--profile", str(profile))
    assert data["complete"], data["missing"]
    assert sorted((r["case"], r["concurrency"]) for r in data["points"]) == [
        ("slots1", 1), ("slots1", 2), ("slots2", 1), ("slots2", 2)]
    for row in data["points"]:  # real engine figures: tokens counted, every request timed
        assert row["records"] == 4 and row["records_per_s"] > 0
        assert row["output_tokens_per_s"] > 0 and row["latency_ms"]["requests"] == 4
        assert row["error_rate"] == 0.0 and row["boot_s"] > 0
    assert data["recommendation"]["best"]["feasible"]
    assert data["pareto"]
    made = cli_json("benchmark", "report", first["benchmark_id"], "--output",
                    str(tmp_path / "report"), "--profile", str(profile))
    assert made["complete"]
    print(json.dumps({"points": data["points"], "recommendation": data["recommendation"]},
                     indent=1))
