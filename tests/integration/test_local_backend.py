"""The local backend end to end (no Slurm): the same runs, commands and state files.

Every test drives the CLI as a user would, with a local profile shaped like the testbed's
(4 GPUs as indices). Each shard's allocation is the real agent started by the run's
supervisor from the rendered batch script; servers are the fake OpenAI server.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.backends.local.jobs import Table
from tests.conftest import FAKE_SERVER, REPO
from tests.integration.runs import (
    cli_json,
    crash_wrapper,
    invoke,
    wait_final,
    wait_until,
    write_local_profile,
    write_profile,
)
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slow  # each a few to ~25 s of real processes; `make test` runs them

EXAMPLE = REPO / "examples" / "fake-server.toml"
PROMPT = re.compile(r"Describe item (\d+)\.")


def write_run(tmp_path: Path, records: int, shards: int, command: List[str], name: str = "lb",
              max_tokens: int = 12, concurrency: int = 3, extra: str = "",
              deployment: str = "gpus = 1\n", auto_retry: bool = False) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(  # auto_retry off unless asked: most tests retry by hand
        f'schema_version = 1\nname = "{name}"\nmax_attempts = 3\nresume = "auto"\n'
        f"auto_retry = {str(auto_retry).lower()}\n"
        f"records = {records}\n[retries]\nin_allocation = 0\n"  # crashes fail the attempt
        f"[shards]\ncount = {shards}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        f"max_tokens = {max_tokens}\ntemperature = 0.0\nconcurrency = {concurrency}\n"
        'max_retries = 1\n[[deployments]]\nalias = "tiny"\n'
        f'model = "fake-{secrets.token_hex(4)}"\ncommand = {json.dumps(command)}\n'
        f"{deployment}startup_timeout_s = 60\n{extra}")
    return path


def fake(*flags: str) -> List[str]:
    return ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}", "--model",
            "{served_name}", *flags]


def model_of(run_file: Path) -> str:
    return re.search(r'model = "(fake-[0-9a-f]+)"', run_file.read_text()).group(1)


def layout_of(tmp_path: Path, run_id: str) -> RunLayout:
    return RunLayout(tmp_path / "workspace" / "runs" / run_id)


def supervisors(status: Dict[str, Any]) -> List[Dict[str, Any]]:
    assert status["backend"]["name"] == "local", status["backend"]
    return status["backend"]["supervisors"]


def wait_no_leftovers(*needles: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while processes_mentioning(*needles) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_mentioning(*needles), processes_mentioning(*needles)


def wait_supervisors_stopped(run_id: str, profile: Path) -> List[Dict[str, Any]]:
    return wait_until("the supervisors to stop", lambda: (lambda found: found if all(
        not s["alive"] for s in found) else None)(supervisors(cli_json(
            "status", run_id, "--profile", str(profile)))), timeout_s=30)


def test_three_shards_run_locally_and_merge_exactly(tmp_path, python_exe):
    profile = write_local_profile(tmp_path, python_exe)
    run_file = write_run(tmp_path, 15, 3, fake())
    model = model_of(run_file)
    submitted = cli_json("submit", str(run_file), "--profile", str(profile))
    run_id = submitted["run_id"]
    running = cli_json("status", run_id, "--profile", str(profile))
    assert supervisors(running)[0]["job_id"] == submitted["job_id"]
    status = wait_final(run_id, profile, interval_s=0.5)
    assert status["state"] == "succeeded" and status["counts"] == {"succeeded": 3}, status
    assert {s["job_id"] for s in status["shards"]} == {
        f"{submitted['job_id']}_{i}" for i in range(3)}
    output = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(output), "--profile", str(profile))
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert manifest["complete"] and [r["index"] for r in records] == list(range(15))
    for record in records:
        assert record["completion"] == expected_completion(model, record["prompt"], 12)
    text = invoke("status", run_id, "--profile", str(profile)).output
    assert f"backend local: job {submitted['job_id']} supervisor pid " in text
    logs = cli_json("logs", run_id, "--shard", "0", "--step", "client", "--profile",
                    str(profile))
    assert Path(logs["path"]).is_file() and "slurm" in logs["steps"]
    wait_supervisors_stopped(run_id, profile)
    wait_no_leftovers(run_id, model)


def test_the_supervisor_retries_and_merges_by_itself(tmp_path, python_exe):
    """Issue 34 on the local backend: no command but ``wait`` after ``submit``."""
    shards, per_shard = 3, 8  # 8: attempt 2 resumes 3 and crashes at 6, attempt 3 ends it
    state = tmp_path / "server-state"
    state.mkdir()
    profile = write_local_profile(tmp_path, python_exe,
                                  env_allow=["SYNTHBATCH_LOCAL_ARRAY_TASK_ID"])
    command = ["{python}", str(crash_wrapper(tmp_path)), str(state), "1x2", "--host",
               "{host}", "--port", "{port}", "--model", "{served_name}", "--token-latency",
               "0.01"]
    run_file = write_run(tmp_path, shards * per_shard, shards, command, concurrency=1,
                         auto_retry=True)
    merged = tmp_path / "merged.jsonl"
    run_id = cli_json("submit", str(run_file), "--profile", str(profile), "--merge-to",
                      str(merged))["run_id"]
    waited = invoke("wait", run_id, "--json", "--timeout", "240", "--profile", str(profile))
    assert waited.exit_code == 0, waited.output
    layout = layout_of(tmp_path, run_id)
    for number, ended in ((1, "failed"), (2, "failed"), (3, "succeeded")):
        assert load_attempt(layout.attempt(1, number).attempt_json).state == ended
    assert not layout.attempt(1, 4).root.exists()
    assert [json.loads(x)["index"] for x in merged.read_text().splitlines()] == \
        list(range(shards * per_shard))
    status = cli_json("status", run_id, "--profile", str(profile))
    assert status["merge"]["state"] == "merged" and status["auto_retry"] is None, status
    wait_supervisors_stopped(run_id, profile)


def test_retry_resumes_the_failed_shards_and_merge_holds_every_record_once(tmp_path,
                                                                           python_exe):
    shards, per_shard, crashing = 4, 8, ("1", "3")
    state = tmp_path / "server-state"
    state.mkdir()
    wrapper = crash_wrapper(tmp_path)
    # the task id reaches the servers because the profile lets it through, as any variable
    profile = write_local_profile(tmp_path, python_exe,
                                  env_allow=["SYNTHBATCH_LOCAL_ARRAY_TASK_ID"])
    command = ["{python}", str(wrapper), str(state), ",".join(crashing), "--host", "{host}",
               "--port", "{port}", "--model", "{served_name}", "--token-latency", "0.01"]
    run_file = write_run(tmp_path, shards * per_shard, shards, command, concurrency=2)
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    first = wait_final(run_id, profile, interval_s=0.5)
    assert first["counts"] == {"failed": 2, "succeeded": 2}, first
    assert sorted(f["shard"] for f in first["failures"]) == [1, 3]
    refused = invoke("merge", run_id, "--profile", str(profile))
    assert refused.exit_code == 4 and "shards without a winner: 1, 3" in refused.output
    layout = layout_of(tmp_path, run_id)
    kept = {s: load_attempt(layout.attempt(s, 1).attempt_json).partial_records for s in (1, 3)}
    assert all(kept.values()), kept
    retried = cli_json("retry", run_id, "--yes", "--profile", str(profile))
    assert [(s["shard"], s["attempt"], s["resume_from"]) for s in retried["shards"]] == [
        (1, 2, 1), (3, 2, 1)]
    final = wait_final(run_id, profile, interval_s=0.5)
    assert final["state"] == "succeeded", final
    merged = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(merged), "--profile", str(profile))
    assert [json.loads(x)["index"] for x in merged.read_text().splitlines()] == \
        list(range(shards * per_shard))
    assert [(s["shard"], s["attempt"]) for s in manifest["shards"]] == [
        (0, 1), (1, 2), (2, 1), (3, 2)]
    for shard in (1, 3):  # what attempt 1 kept was never asked for again
        counts: Counter = Counter()
        for line in (state / f"requests-{shard}.log").read_text().splitlines():
            match = PROMPT.search(json.dumps(json.loads(line).get("prompt")))
            if match:
                counts[int(match.group(1))] += 1
        offset = shard * per_shard
        assert all(counts[i] == 1 for i in range(offset, offset + kept[shard])), counts
    assert cli_json("retry", run_id, "--yes", "--profile", str(profile))["shards"] == []
    wait_supervisors_stopped(run_id, profile)


def slow_run(tmp_path: Path, python: str, records: int = 300):  # type: ignore[no-untyped-def]
    """Two shards that take ``records`` x 0.2 s each; returns once both make progress."""
    profile = write_local_profile(tmp_path, python)
    run_file = write_run(tmp_path, records, 2, fake("--token-latency", "0.05"), max_tokens=4,
                         concurrency=1)
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    layout = layout_of(tmp_path, run_id)
    wait_until("progress in both shards", lambda: all(
        (json.loads(layout.attempt(s, 1).progress_json.read_text()).get("records_done", 0)
         if layout.attempt(s, 1).progress_json.exists() else 0) >= 1 for s in (0, 1)))
    return profile, run_file, run_id, layout


def test_cancel_stops_every_process_and_records_cancelled(tmp_path, python_exe):
    profile, run_file, run_id, layout = slow_run(tmp_path, python_exe)
    done = cli_json("cancel", run_id, "--profile", str(profile))
    assert done["converged"] and done["states"] == {"0": "cancelled", "1": "cancelled"}, done
    status = cli_json("status", run_id, "--profile", str(profile))
    assert status["state"] == "cancelled", status
    for shard in status["shards"]:
        assert "by `synthbatch cancel`" in shard["reason"], shard
        assert "kept as partial" in shard["reason"]
    wait_supervisors_stopped(run_id, profile)
    wait_no_leftovers(run_id, model_of(run_file), timeout_s=5)
    assert cli_json("cancel", run_id, "--profile", str(profile))["scancelled"] == []


def test_kill_9_of_the_supervisor_converges_and_retry_works(tmp_path, python_exe):
    profile, run_file, run_id, layout = slow_run(tmp_path, python_exe, records=40)
    pid = supervisors(cli_json("status", run_id, "--profile", str(profile)))[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    status = wait_final(run_id, profile, interval_s=0.5)
    assert status["state"] == "failed" and status["counts"] == {"failed": 2}, status
    for shard in status["shards"]:
        assert f"its local supervisor (pid {pid} on " in shard["reason"], shard
        assert "NODE_FAIL" in shard["reason"]
        assert load_attempt(layout.attempt(shard["index"], 1).attempt_json).state == "failed"
    wait_no_leftovers(run_id, model_of(run_file), timeout_s=10)
    retried = cli_json("retry", run_id, "--yes", "--resume", "always", "--profile",
                       str(profile))
    assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(0, 2), (1, 2)]
    final = wait_final(run_id, profile, interval_s=0.5)
    assert final["state"] == "succeeded", final
    merged = tmp_path / "merged.jsonl"
    cli_json("merge", run_id, "--output", str(merged), "--profile", str(profile))
    assert [json.loads(x)["index"] for x in merged.read_text().splitlines()] == list(range(40))
    wait_supervisors_stopped(run_id, profile)


def test_a_time_limit_sends_usr1_at_the_lead_requeues_then_fails_keeping_records(
        tmp_path, python_exe):
    # each execution gets lead seconds before USR1; on a loaded 2-core machine the agent and
    # its server take several of them to start (4 s left no record to keep at load 15)
    profile = write_local_profile(tmp_path, python_exe, signal_lead_s=7)
    run_file = write_run(tmp_path, 300, 1, fake("--token-latency", "0.05"), max_tokens=8,
                         concurrency=1, extra='[resources]\ntime_limit = "00:00:14"\n')
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, interval_s=0.5, timeout_s=90)
    shard = status["shards"][0]
    assert shard["state"] == "failed", status
    assert "received SIGUSR1 (time limit or preemption soon): stopped early, no requeue " \
           "left" in shard["reason"] and "kept as partial" in shard["reason"]
    attempt = load_attempt(layout_of(tmp_path, run_id).attempt(0, 1).attempt_json)
    assert attempt.restarts == 1 and attempt.partial_records
    log = Path(shard["log"]).read_text()
    assert "requeued (restart 1 of 1)" in log and "REQUEUED" in log
    wait_supervisors_stopped(run_id, profile)


def test_each_replica_gets_its_plan_gpus_out_of_its_allocations(tmp_path, python_exe):
    profile = write_local_profile(tmp_path, python_exe, local={"gpus": [4, 5, 6, 7]})
    run_file = write_run(tmp_path, 8, 2, fake(), deployment="gpus = 1\nreplicas = 2\n")
    submitted = cli_json("submit", str(run_file), "--profile", str(profile))
    status = wait_final(submitted["run_id"], profile, interval_s=0.5)
    assert status["state"] == "succeeded", status
    layout = layout_of(tmp_path, submitted["run_id"])
    table = Table(tmp_path / "workspace" / "local")
    tasks = table.load_job(submitted["job_id"]).tasks
    for shard in (0, 1):
        given = tasks[shard].gpus  # the allocation's CUDA_VISIBLE_DEVICES
        assert len(given) == 2 and set(given) <= {"4", "5", "6", "7"}
        bound = []
        for replica in (0, 1):
            text = (layout.attempt(shard, 1).execution_logs(1) /
                    f"server-tiny-{replica}.log").read_text()
            match = re.search(rf"serve: replica server-tiny-{replica}: plan GPUs (\d) -> "
                              r"CUDA_VISIBLE_DEVICES=(\d)", text)
            assert match, text
            assert match.group(2) == given[int(match.group(1))]
            bound.append(match.group(2))
        assert sorted(bound) == sorted(given)  # the two replicas: disjoint, both used
    wait_supervisors_stopped(submitted["run_id"], profile)


def test_the_same_example_runs_on_the_testbed_unchanged_but_for_the_profile(
        slurm_cluster, tmp_path, python_exe):
    """examples/fake-server.toml as it is, once with a testbed profile and once with a local
    one that differs only in ``backend`` (and its ``[local]`` table): the same records."""
    merged = {}
    for backend, write in (("slurm", write_profile), ("local", write_local_profile)):
        folder = tmp_path / backend
        folder.mkdir()
        profile = write(folder, python_exe)
        run_id = cli_json("submit", str(EXAMPLE), "--profile", str(profile))["run_id"]
        status = wait_final(run_id, profile)
        assert status["state"] == "succeeded", status
        assert status["backend"]["name"] == backend
        out = folder / "merged.jsonl"
        cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
        merged[backend] = [_timeless(json.loads(line)) for line in out.read_bytes().splitlines()]
    assert merged["slurm"] == merged["local"] and len(merged["local"]) == 30


def _timeless(record: dict) -> dict:
    """A record without what differs between two runs of it: each request's latency."""
    return {key: value for key, value in record.items() if key != "latency_ms"}
