"""End to end on the real local Slurm testbed: submit -> agent in allocations -> merge."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import List

import pytest
from click.testing import CliRunner

from fixtures.fake_openai_server import expected_completion
from synthbatch.control.cli.main import cli
from tests.conftest import FAKE_SERVER
from tests.integration.runs import cli_json, wait_final, write_profile
from tests.processes import processes_mentioning

pytestmark = pytest.mark.slurm


def _write_run(tmp_path: Path, model: str, records: int, shards: int,
               server_flags: List[str]) -> Path:
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", *server_flags]
    path = tmp_path / "run.toml"
    path.write_text(
        "schema_version = 1\n"
        'name = "e2e"\n'
        "auto_retry = false\n"  # a failed shard stays failed: no round retries it
        f"records = {records}\n"
        f"[shards]\ncount = {shards}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 12\ntemperature = 0.0\nconcurrency = 3\nmax_retries = 1\n"
        '[[deployments]]\nalias = "tiny"\n'
        f'model = "{model}"\n'
        f"command = {json.dumps(command)}\n"
        "gpus = 1\nstartup_timeout_s = 60\n"
    )
    return path


def _wait_jobs_gone(job_id: str, timeout_s: float = 60) -> None:
    """Winners are published before cleanup: wait for Slurm to see the jobs end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True,
                             text=True, check=False).stdout
        if not out.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"job {job_id} still in squeue after {timeout_s}s")


def test_three_shard_run_succeeds_and_merges_exactly(slurm_cluster, tmp_path, python_exe):
    model = f"fake-{secrets.token_hex(4)}"
    profile = write_profile(tmp_path, python_exe)
    run_file = _write_run(tmp_path, model, records=15, shards=3, server_flags=[])
    started = time.monotonic()
    submitted = cli_json("submit", str(run_file), "--profile", str(profile))
    run_id = submitted["run_id"]
    status = wait_final(run_id, profile)
    wall = time.monotonic() - started
    assert status["state"] == "succeeded", status
    assert status["counts"] == {"succeeded": 3}
    assert status["records_done"] == 15
    assert {s["job_id"] for s in status["shards"]} == {
        f"{submitted['job_id']}_{i}" for i in range(3)}

    output = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(output), "--profile", str(profile))
    lines = output.read_text().splitlines()
    assert len(lines) == 15 == manifest["records"] and manifest["complete"]
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == list(range(15))
    for record in records:
        assert record["prompt"] == f"Describe item {record['index']}."
        assert record["completion"] == expected_completion(model, record["prompt"], 12)
    again = tmp_path / "again.jsonl"
    cli_json("merge", run_id, "--output", str(again), "--profile", str(profile))
    assert again.read_bytes() == output.read_bytes()

    _wait_jobs_gone(submitted["job_id"])
    assert not processes_mentioning(run_id, model), "processes of the run were left behind"
    print(f"e2e 3-shard wall time: {wall:.1f}s")


def test_crashing_server_fails_the_shard_with_a_reason(slurm_cluster, tmp_path, python_exe):
    model = f"fake-{secrets.token_hex(4)}"
    profile = write_profile(tmp_path, python_exe)
    run_file = _write_run(tmp_path, model, records=6, shards=1,
                          server_flags=["--exit-after", "1"])
    submitted = cli_json("submit", str(run_file), "--profile", str(profile))
    run_id = submitted["run_id"]
    status = wait_final(run_id, profile)
    assert status["state"] == "failed"
    shard = status["shards"][0]
    assert shard["state"] == "failed"
    assert "exited with status" in shard["reason"]
    # Each start of the server answers exactly one request (--exit-after 1): the two
    # restarts the allocation allows by default cannot finish 6 records.
    assert "after 2 restart(s) in the allocation" in shard["reason"], shard["reason"]
    result = CliRunner().invoke(cli, ["merge", run_id, "--profile", str(profile)])
    assert result.exit_code == 4 and "shards without a winner: 0" in result.output
    _wait_jobs_gone(submitted["job_id"])
    assert not processes_mentioning(run_id, model)


def test_a_client_failing_on_http_errors_shows_the_cause_in_status(slurm_cluster, tmp_path,
                                                                   python_exe):
    """Every request answers HTTP 500: status, status --json, the API, wait and status
    --shard all show the status and the server's message, not only the client's banner
    (issue 28.1: the reason was cut to its first 300 characters, the cause at its end)."""
    from synthbatch.control import api

    model = f"fake-{secrets.token_hex(4)}"
    profile = write_profile(tmp_path, python_exe)
    run_file = _write_run(tmp_path, model, records=20, shards=1,
                          server_flags=["--fail-every", "1"])
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile)
    assert status["state"] == "failed", status
    cause = "injected failure (--fail-every)"
    reason = status["failures"][0]["reason"]
    assert reason.startswith("client exited with status 1: ") and "HTTP 500" in reason
    assert cause in reason
    text = CliRunner().invoke(cli, ["status", run_id, "--profile", str(profile)])
    assert "HTTP 500" in text.stdout and cause in text.stdout, text.stdout
    assert cause in (api.status(run_id, str(profile)).failures[0].reason or "")
    waited = CliRunner().invoke(cli, ["wait", run_id, "--profile", str(profile)])
    assert waited.exit_code == 6 and cause in waited.output, waited.output
    shard = CliRunner().invoke(cli, ["status", run_id, "--profile", str(profile),
                                     "--shard", "0"])
    assert shard.exit_code == 0 and f"reason: {reason}" in shard.stdout, shard.stdout
    # HTTP 500 from a live server: the client was restarted in the allocation ([retries]
    # in_allocation = 2), and the reason names the last client's log
    assert "client.restart-2.log (last " in shard.stdout, shard.stdout
    assert "generate: records 0..19" in shard.stdout
    assert "restarts: client 2" in shard.stdout
    assert "after 2 restart(s) in the allocation (client 2)" in reason
