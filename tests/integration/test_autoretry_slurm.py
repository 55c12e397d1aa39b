"""Automatic retries on the real Slurm testbed (issue 34, part).

Six shards; shard 2's server exits after 3 requests on its first start only. With
``auto_retry = true`` and ``max_attempts = 3`` no command runs after ``submit``: the round
job Slurm starts after the array submits attempt 2 of shard 2 and its own successor; the
run ends with every shard won, attempt 2 recorded for shard 2, no record requested twice,
and no round job left in the queue.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.runs import autoretry
from tests.integration.runs import cli_json, crash_wrapper, invoke, wait_until, write_profile

pytestmark = pytest.mark.slurm

SHARDS, PER_SHARD, CRASHING = 6, 6, 2
PROMPT = re.compile(r"Describe item (\d+)\.")


def test_a_failed_shard_is_retried_by_the_cluster_alone(slurm_cluster, tmp_path: Path) -> None:
    state = tmp_path / "server-state"
    state.mkdir()
    profile = write_profile(tmp_path, sys.executable)
    command = ["{python}", str(crash_wrapper(tmp_path)), str(state), str(CRASHING),
               "--host", "{host}", "--port", "{port}", "--model", "{served_name}",
               "--token-latency", "0.01"]
    run = tmp_path / "run.toml"
    run.write_text(
        "schema_version = 1\nname = \"auto\"\nmax_attempts = 3\nauto_retry = true\n"
        f"records = {SHARDS * PER_SHARD}\n[retries]\nin_allocation = 0\n"  # attempts fail
        f"[shards]\ncount = {SHARDS}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        f'[[deployments]]\nalias = "tiny"\nmodel = "fake-{secrets.token_hex(4)}"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    assert autoretry.load_pending(layout) is not None  # the first round waits for the array
    # `wait` alone: the run looks failed after attempt 1, but the pending round keeps it
    # waiting until the round's attempt 2 has won
    waited = invoke("wait", run_id, "--json", "--timeout", "300", "--profile", str(profile))
    assert waited.exit_code == 0, waited.output
    assert all(layout.winner_json(s).exists() for s in range(SHARDS))
    first = load_attempt(layout.attempt(CRASHING, 1).attempt_json)
    second = load_attempt(layout.attempt(CRASHING, 2).attempt_json)
    assert first.state == "failed" and second.state == "succeeded"
    assert not layout.attempt(CRASHING, 3).root.exists()
    for shard in set(range(SHARDS)) - {CRASHING}:
        assert not layout.attempt(shard, 2).root.exists()
    # the chain ends by itself: the last round finds the run over and submits nothing
    name = autoretry.round_job_name(run_id)

    def no_round() -> bool:
        out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                             text=True, check=True).stdout
        return not out.strip()

    wait_until("no round job left", no_round, timeout_s=120)
    assert autoretry.load_pending(layout) is None
    counts: Counter = Counter()
    for line in (state / f"requests-{CRASHING}.log").read_text().splitlines():
        match = PROMPT.search(json.dumps(json.loads(line).get("prompt")))
        if match:
            counts[int(match.group(1))] += 1
    assert counts and max(counts.values()) == 1  # attempt 2 resumed: nothing asked twice
    status = cli_json("status", run_id, "--profile", str(profile))
    assert status["state"] == "succeeded"


def test_a_shard_that_always_fails_ends_failed_after_exactly_max_attempts(
        slurm_cluster, tmp_path: Path) -> None:
    from tests.conftest import FAKE_SERVER

    profile = write_profile(tmp_path, sys.executable)
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", "--token-latency", "0.01", "--exit-after", "2"]
    run = tmp_path / "run.toml"
    run.write_text(
        "schema_version = 1\nname = \"always\"\nmax_attempts = 3\nauto_retry = true\n"
        "records = 8\n[retries]\nin_allocation = 0\n[shards]\ncount = 1\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        f'[[deployments]]\nalias = "tiny"\nmodel = "fake-{secrets.token_hex(4)}"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    waited = invoke("wait", run_id, "--json", "--timeout", "400", "--profile", str(profile))
    assert waited.exit_code == 6, waited.output  # failed, once the last round is over
    assert json.JSONDecoder().raw_decode(waited.output)[0]["auto_retry"] is None
    for number in (1, 2, 3):
        assert load_attempt(layout.attempt(0, number).attempt_json).state == "failed"
    assert not layout.attempt(0, 4).root.exists()
    assert autoretry.load_pending(layout) is None


def test_cancel_with_a_round_pending_submits_nothing_further(slurm_cluster,
                                                            tmp_path: Path) -> None:
    from tests.conftest import FAKE_SERVER

    profile = write_profile(tmp_path, sys.executable)
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", "--token-latency", "0.5"]
    run = tmp_path / "run.toml"
    run.write_text(
        "schema_version = 1\nname = \"cancel\"\nmax_attempts = 3\nauto_retry = true\n"
        "records = 40\n[shards]\ncount = 2\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        f'[[deployments]]\nalias = "tiny"\nmodel = "fake-{secrets.token_hex(4)}"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    pending = autoretry.load_pending(layout)
    assert pending is not None
    cancelled = cli_json("cancel", run_id, "--profile", str(profile))
    assert pending["job_id"] in cancelled["scancelled"]
    name = autoretry.round_job_name(run_id)

    def no_round() -> bool:
        out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                             text=True, check=True).stdout
        return not out.strip()

    wait_until("the round job gone", no_round, timeout_s=60)
    waited = invoke("wait", run_id, "--json", "--timeout", "120", "--profile", str(profile))
    assert waited.exit_code == 7, waited.output  # cancelled
    assert sorted(p.name for p in layout.submissions.glob("*.json")) == ["0001.json"]
    assert not any(layout.attempt(s, 2).root.exists() for s in range(2))
