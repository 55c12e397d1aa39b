"""Retry, resume and merge on the real Slurm testbed (issue 8).

Six shards; the fake server crashes (``--exit-after``) in shards 1 and 4 on their first
start only (a wrapper keeps a marker per array task). Then: status shows 4 succeeded and
2 failed with reasons; merge refuses naming 1 and 4; ``--allow-partial`` merges the 4;
``retry --yes`` submits attempt 2 of shards 1 and 4 (resuming attempt 1's kept output);
all 6 succeed; a request log per array task shows that the records attempt 1 finished were
never requested again; the merge holds every record exactly once, in order.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib.attempts import load_attempt, load_readiness
from synthbatch.agent_stdlib.layout import RunLayout
from tests.integration.runs import (
    cli_json,
    crash_wrapper,
    invoke,
    wait_final,
    wait_until,
    write_profile,
    write_run,
)
from tests.processes import agent_of

pytestmark = pytest.mark.slurm

SHARDS, PER_SHARD, CRASHING = 6, 8, (1, 4)
PROMPT = re.compile(r"Describe item (\d+)\.")


def _files(tmp_path: Path, python: str, model: str) -> Tuple[Path, Path, Path]:
    state = tmp_path / "server-state"
    state.mkdir()
    wrapper = crash_wrapper(tmp_path)
    profile = write_profile(tmp_path, python)
    command = ["{python}", str(wrapper), str(state), ",".join(map(str, CRASHING)),
               "--host", "{host}", "--port", "{port}", "--model", "{served_name}",
               "--token-latency", "0.01"]
    run = tmp_path / "run.toml"
    run.write_text(
        "schema_version = 1\nname = \"retry\"\nmax_attempts = 3\nresume = \"auto\"\n"
        "auto_retry = false\n"  # retried by hand here; test_autoretry_slurm: by the rounds
        f"records = {SHARDS * PER_SHARD}\n[retries]\nin_allocation = 0\n"  # attempts fail
        f"[shards]\ncount = {SHARDS}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 12\ntemperature = 0.0\nconcurrency = 2\nmax_retries = 1\n"
        f'[[deployments]]\nalias = "tiny"\nmodel = "{model}"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    return profile, run, state


def _requests(state: Path, shard: int) -> Counter:
    """Record index -> how many completion requests the shard's servers received for it."""
    counts: Counter = Counter()
    path = state / f"requests-{shard}.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        match = PROMPT.search(json.dumps(json.loads(line).get("prompt")))
        if match:
            counts[int(match.group(1))] += 1
    return counts


def _kept_indices(layout: RunLayout, shard: int) -> List[int]:
    out = layout.attempt(shard, 1).output
    return [json.loads(line)["index"] for path in sorted(out.iterdir())
            for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def scenario(slurm_cluster, tmp_path_factory) -> Dict[str, Any]:
    """Run the whole scenario once; the tests below check its parts."""
    import sys

    tmp_path = tmp_path_factory.mktemp("retry")
    model = f"fake-{secrets.token_hex(4)}"
    profile, run, state = _files(tmp_path, sys.executable, model)
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    first = wait_final(run_id, profile)
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    attempts1 = {s: load_attempt(layout.attempt(s, 1).attempt_json) for s in CRASHING}
    kept = {s: _kept_indices(layout, s) for s in CRASHING}
    refused = invoke("merge", run_id, "--profile", str(profile))
    partial_out = tmp_path / "partial.jsonl"
    partial = cli_json("merge", run_id, "--allow-partial", "--output", str(partial_out),
                   "--profile", str(profile))
    partial_ids = [json.loads(x)["index"] for x in partial_out.read_text().splitlines()]
    retried = cli_json("retry", run_id, "--yes", "--profile", str(profile))
    named_running = invoke("retry", run_id, "--shard", str(CRASHING[0]), "--yes",
                            "--profile", str(profile))
    final = wait_final(run_id, profile)
    merged = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(merged), "--profile", str(profile))
    again = tmp_path / "again.jsonl"
    cli_json("merge", run_id, "--output", str(again), "--profile", str(profile))
    return {"run_id": run_id, "profile": profile, "layout": layout, "state": state,
            "model": model, "first": first, "attempts1": attempts1, "kept": kept,
            "refused": refused, "partial": partial, "partial_ids": partial_ids,
            "retried": retried, "named_running": named_running, "final": final,
            "merged": merged, "again": again, "manifest": manifest}


def test_first_round_fails_two_shards_with_reasons(scenario):
    first = scenario["first"]
    assert first["state"] == "failed"
    assert first["counts"] == {"failed": 2, "succeeded": 4}
    failures = {f["shard"]: f for f in first["failures"]}
    assert sorted(failures) == list(CRASHING)
    for shard in CRASHING:
        assert "exited with status" in failures[shard]["reason"]
        record = scenario["attempts1"][shard]
        assert record.state == "failed"
        # the crash kept the complete records as partial output, in index order
        assert record.partial_records and record.partial_records == len(scenario["kept"][shard])
        assert f"{record.partial_records} of {PER_SHARD} records kept as partial" in record.reason
        offset = shard * PER_SHARD
        assert scenario["kept"][shard] == list(range(offset, offset + record.partial_records))


def test_merge_refuses_then_merges_the_four(scenario):
    refused = scenario["refused"]
    assert refused.exit_code == 4
    assert "shards without a winner: 1, 4" in refused.output
    partial = scenario["partial"]
    assert partial["complete"] is False and partial["missing_shards"] == list(CRASHING)
    assert partial["records"] == 4 * PER_SHARD
    wanted = [i for s in range(SHARDS) if s not in CRASHING
              for i in range(s * PER_SHARD, (s + 1) * PER_SHARD)]
    assert scenario["partial_ids"] == wanted


def test_retry_submits_the_two_as_one_array_resuming(scenario):
    retried = scenario["retried"]
    assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(1, 2), (4, 2)]
    assert len(retried["submissions"]) == 1
    assert retried["submissions"][0]["shards"] == list(CRASHING)
    for item in retried["shards"]:
        assert item["resume_from"] == 1
        assert item["resume_records"] == scenario["attempts1"][item["shard"]].partial_records
        record = load_attempt(scenario["layout"].attempt(item["shard"], 2).attempt_json)
        assert record.resume_from == 1 and record.state == "succeeded"
    named = scenario["named_running"]
    assert named.exit_code == 4, named.output
    assert "shard 1 is" in named.output or "already has a winner" in named.output


def test_all_six_succeed_and_merge_exactly_once_in_order(scenario):
    final = scenario["final"]
    assert final["state"] == "succeeded" and final["counts"] == {"succeeded": SHARDS}
    # the resumed shards count the records they copied from attempt 1 too
    assert final["tokens"] == SHARDS * PER_SHARD * 12
    lines = scenario["merged"].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == list(range(SHARDS * PER_SHARD))
    for record in records:
        assert record["completion"] == expected_completion(scenario["model"],
                                                           record["prompt"], 12)
    manifest = scenario["manifest"]
    assert manifest["records"] == SHARDS * PER_SHARD and manifest["complete"]
    assert [(s["shard"], s["attempt"]) for s in manifest["shards"]] == [
        (s, 2 if s in CRASHING else 1) for s in range(SHARDS)]
    assert len(manifest["plan_sha256"]) == 64
    assert scenario["again"].read_bytes() == scenario["merged"].read_bytes()
    again = cli_json("retry", scenario["run_id"], "--yes", "--profile", str(scenario["profile"]))
    assert again["shards"] == [] and again["submissions"] == []


def test_resumed_shards_did_not_regenerate_finished_records(scenario):
    for shard in CRASHING:
        counts = _requests(scenario["state"], shard)
        kept = scenario["kept"][shard]
        offset = shard * PER_SHARD
        assert kept, "attempt 1 kept nothing: the scenario does not test resume"
        assert all(counts[i] == 1 for i in kept), (shard, kept, dict(counts))
        assert set(counts) == set(range(offset, offset + PER_SHARD))


def test_concurrent_retries_converge_on_one_submission(slurm_cluster, tmp_path):
    import sys

    from synthbatch.control import api

    model = f"fake-{secrets.token_hex(4)}"
    profile, run, state = _files(tmp_path, sys.executable, model)
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    wait_final(run_id, profile)
    results: List[Dict[str, Any]] = []
    errors: List[BaseException] = []

    def one() -> None:
        try:
            results.append(api.retry(run_id, profile=str(profile)))
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(results) == 3
    submitted = [r for r in results if r["submissions"]]
    assert len(submitted) == 1, results
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    assert sorted(p.name for p in layout.submissions.glob("*.json")) == ["0001.json",
                                                                           "0002.json"]
    final = wait_final(run_id, profile)
    assert final["counts"] == {"succeeded": SHARDS}


def test_a_killed_agent_is_failed_by_status_and_retried_at_once(slurm_cluster, tmp_path,
                                                                python_exe):
    """Issue 13 item 4: kill -9 of one shard's agent. Once squeue lists the job ended, no
    process of it can write: status records the attempt failed and closes its readiness at
    once, and retry retries it (before: 120 s of "nothing to retry" and a readiness that
    stayed ``ready``)."""
    profile = str(write_profile(tmp_path, python_exe))
    run_file = write_run(tmp_path, records=40, shards=2, latency=0.1)
    submitted = cli_json("submit", str(run_file), "--profile", profile)
    run_id, job = submitted["run_id"], submitted["job_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    readiness = layout.attempt(1, 1).readiness_json
    wait_until("shard 1 ready", lambda: readiness.exists()
               and load_readiness(readiness).state == "ready")
    served = load_readiness(readiness)
    os.kill(wait_until("the agent of shard 1", lambda: agent_of(layout.root, f"{job}_1")),
            signal.SIGKILL)

    def status() -> Dict[str, Any]:
        return cli_json("status", run_id, "--profile", profile)

    ended = wait_until("status to show shard 1 ended", lambda: (
        lambda s: s if s["shards"][1]["state"] != "running" else None)(status()), 60)
    shard = ended["shards"][1]
    assert shard["state"] == "failed", shard
    assert shard["reason"].endswith("before the agent recorded an outcome")
    record = load_attempt(layout.attempt(1, 1).attempt_json)
    assert record.state == "failed" and record.reason == shard["reason"]
    closed = load_readiness(readiness)
    assert (closed.state, closed.revision, closed.endpoints) == \
        ("failed", served.revision + 1, {})
    assert "the allocation ended without its agent" in closed.reason

    retried = cli_json("retry", run_id, "--yes", "--profile", profile)
    assert [(s["shard"], s["attempt"]) for s in retried["shards"]] == [(1, 2)]
    final = wait_final(run_id, Path(profile))
    assert final["counts"] == {"succeeded": 2}
    assert load_attempt(layout.attempt(1, 2).attempt_json).state == "succeeded"
