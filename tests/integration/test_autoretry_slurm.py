"""Automatic retries and merge on completion on the real Slurm testbed (issue 34).

Six shards; shard 2's server exits after 3 requests on its first two starts. With the
defaults (automatic retries on), ``max_attempts = 3`` and ``--merge-to``, no command runs
after ``submit`` (the test only reads the records until the merge job has recorded its
outcome): the round jobs Slurm starts after the arrays submit attempts 2 and 3 of shard 2,
the last round submits the merge job, and the run ends with every shard won, attempts
1..3 recorded for shard 2, no record requested twice, one automatic job at a time (each
submitted by the one before while it ran, started after it ended), and the merged file
exact. A shard that always fails, and cancel while a round is pending, too.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import List, Tuple

import pytest

from synthbatch.agent_stdlib.attempts import load_attempt
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.control.runs import automerge, autoretry
from tests.integration.runs import cli_json, crash_wrapper, invoke, wait_until, write_profile

pytestmark = pytest.mark.slurm

SHARDS, PER_SHARD, CRASHING = 6, 12, 2  # 3 + 3 records kept: attempt 3 finishes
PROMPT = re.compile(r"Describe item (\d+)\.")


def _run_file(tmp_path: Path, name: str, shards: int, per_shard: int, command: List[str],
              extra: str = "") -> Path:
    run = tmp_path / "run.toml"
    run.write_text(
        f"schema_version = 1\nname = \"{name}\"\nmax_attempts = 3\n{extra}"
        f"records = {shards * per_shard}\n[retries]\nin_allocation = 0\n"  # attempts fail
        f"[shards]\ncount = {shards}\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        "max_tokens = 8\ntemperature = 0.0\nconcurrency = 1\nmax_retries = 1\n"
        f'[[deployments]]\nalias = "tiny"\nmodel = "fake-{secrets.token_hex(4)}"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n")
    return run


def _crashing(tmp_path: Path, state: Path, crashing: str) -> List[str]:
    return ["{python}", str(crash_wrapper(tmp_path)), str(state), crashing,
            "--host", "{host}", "--port", "{port}", "--model", "{served_name}",
            "--token-latency", "0.01"]


class AutoJobs:
    """Watches squeue for the run's automatic jobs while the test waits: the most that
    were pending, and running, at one time."""

    def __init__(self, run_id: str) -> None:
        self.name = autoretry.round_job_name(run_id)
        self.most: Counter = Counter()
        self.seen: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.3):
            out = subprocess.run(["squeue", "-h", "-n", self.name, "-o", "%i|%T"],
                                 capture_output=True, text=True).stdout
            rows = [line.split("|") for line in out.split()]
            self.seen.update(job for job, _ in rows)
            now = Counter(state for _, state in rows)
            for state, n in now.items():
                self.most[state] = max(self.most[state], n)

    def __enter__(self) -> AutoJobs:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _history(name: str) -> List[Tuple[str, str, str, str, str]]:
    """sacct's rows of the automatic jobs: id, state, start, end, submit."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-S", "now-2hours", f"--name={name}",
                          "--format=JobID,State,Start,End,Submit"], capture_output=True,
                         text=True, check=True).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line]  # type: ignore[misc]


def _ended(history: List[Tuple[str, str, str, str, str]], count: int) -> bool:
    """At least ``count`` rows, none still pending or running in accounting."""
    return len(history) >= count and all(row[1] not in ("PENDING", "RUNNING")
                                         for row in history)


def _over(layout: RunLayout) -> bool:
    """The records alone (no synthbatch command): the merge job recorded its outcome and
    no automatic job is pending any more."""
    result = automerge.load_result(layout)
    return bool(result and result.get("state") != "waiting") and \
        autoretry.load_pending(layout) is None


def _no_round(name: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                         text=True, check=True).stdout
    return not out.strip()


def _indices(path: Path) -> List[int]:
    return [json.loads(line)["index"] for line in path.read_text().splitlines()]


def test_a_failed_shard_is_retried_and_merged_by_the_cluster_alone(
        slurm_cluster, tmp_path: Path) -> None:
    state = tmp_path / "server-state"
    state.mkdir()
    profile = write_profile(tmp_path, sys.executable)
    run = _run_file(tmp_path, "auto", SHARDS, PER_SHARD,
                    _crashing(tmp_path, state, f"{CRASHING}x2"))  # retries: the default
    merged = tmp_path / "out" / "data.jsonl"
    merged.parent.mkdir()
    run_id = cli_json("submit", str(run), "--profile", str(profile),
                      "--merge-to", str(merged))["run_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    assert autoretry.load_pending(layout) is not None  # the first round waits for the array
    # no command after submit: the test only reads the run's records (and squeue) until
    # the merge job has recorded its outcome
    with AutoJobs(run_id) as jobs:
        wait_until("the merge job's outcome", lambda: _over(layout), timeout_s=500)
    assert automerge.load_result(layout)["state"] == "merged"
    assert all(layout.winner_json(s).exists() for s in range(SHARDS))
    for number, ended in ((1, "failed"), (2, "failed"), (3, "succeeded")):
        assert load_attempt(layout.attempt(CRASHING, number).attempt_json).state == ended
    assert not layout.attempt(CRASHING, 4).root.exists()
    for shard in set(range(SHARDS)) - {CRASHING}:
        assert not layout.attempt(shard, 2).root.exists()
    # never two automatic jobs waiting, nor two running, at one time; the chain ends
    assert jobs.most["PENDING"] <= 1 and jobs.most["RUNNING"] <= 1, jobs.most
    name = autoretry.round_job_name(run_id)
    wait_until("no round job left", lambda: _no_round(name), timeout_s=120)
    assert autoretry.load_pending(layout) is None
    # rounds after attempts 1, 2 and 3, and the merge job: a chain of single jobs, each
    # submitted by the one before while it ran, started only after it had ended (slurmdbd
    # records a job that has just ended a moment later: wait for the four rows)
    wait_until("sacct's rows of the 3 rounds and the merge job, ended",
               lambda: _ended(_history(name), 4), timeout_s=60)
    history = sorted(_history(name), key=lambda row: (row[4], int(row[0])))
    assert all(state == "COMPLETED" for _, state, *_ in history), history
    for before, after in zip(history, history[1:]):
        assert after[4] <= before[3] <= after[2], history
    # the merged file is exact: every index once, in order
    assert _indices(merged) == list(range(SHARDS * PER_SHARD))
    counts: Counter = Counter()
    for line in (state / f"requests-{CRASHING}.log").read_text().splitlines():
        match = PROMPT.search(json.dumps(json.loads(line).get("prompt")))
        if match:
            counts[int(match.group(1))] += 1
    assert counts and max(counts.values()) == 1  # attempts 2 and 3 resumed: nothing twice
    status = cli_json("status", run_id, "--profile", str(profile))
    assert status["state"] == "succeeded" and status["auto_retry"] is None
    assert status["merge"]["state"] == "merged" and status["merge"]["to"] == str(merged)
    assert status["max_attempts"] == 3


def test_a_shard_that_always_fails_ends_failed_and_the_rest_is_merged(
        slurm_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    state = tmp_path / "server-state"
    state.mkdir()
    profile = write_profile(tmp_path, sys.executable)
    # shard 1's server dies after 3 records on every start: 3 attempts keep 9 of 20
    run = _run_file(tmp_path, "always", 2, 20, _crashing(tmp_path, state, "1x99"))
    run_id = cli_json("submit", str(run), "--profile", str(profile), "--merge-to",
                      "partial.jsonl", "--allow-partial")["run_id"]  # relative: to the cwd
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    waited = invoke("wait", run_id, "--json", "--timeout", "500", "--profile", str(profile))
    assert waited.exit_code == 6, waited.output  # failed, once the last round is over
    assert json.JSONDecoder().raw_decode(waited.output)[0]["auto_retry"] is None
    for number in (1, 2, 3):
        assert load_attempt(layout.attempt(1, number).attempt_json).state == "failed"
    assert not layout.attempt(1, 4).root.exists()
    assert autoretry.load_pending(layout) is None
    status = cli_json("status", run_id, "--profile", str(profile))
    merge = status["merge"]
    assert merge["state"] == "partial" and merge["missing_shards"] == [1], merge
    assert _indices(Path(merge["output"])) == list(range(20))  # shard 0's records only
    text = invoke("status", run_id, "--profile", str(profile)).output
    assert "partial; missing shards: 1" in text and "attempt 3 of 3" in text
    said = "".join(p.read_text() for p in layout.auto.glob("merge-*.out"))
    assert "partial" in said and "missing shards: 1" in said, said  # the merge job's log


def test_cancel_during_the_automatic_retry_submits_nothing_further(
        slurm_cluster, tmp_path: Path) -> None:
    state = tmp_path / "server-state"
    state.mkdir()
    profile = write_profile(tmp_path, sys.executable)
    command = _crashing(tmp_path, state, "1")
    command[-1] = "0.5"  # attempt 2 takes a while: the next round waits for it
    run = _run_file(tmp_path, "cancel", 2, 20, command)
    merged = tmp_path / "never.jsonl"
    run_id = cli_json("submit", str(run), "--profile", str(profile), "--merge-to",
                      str(merged))["run_id"]
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)

    def second_round() -> bool:  # the first round retried shard 1 and submitted its successor
        pending = autoretry.load_pending(layout)
        return bool(pending and pending.get("round", 0) >= 2)

    wait_until("the first round's successor", second_round, timeout_s=240)
    pending = autoretry.load_pending(layout)
    assert pending is not None and pending["attempt"] == 2
    # `runs` (records only) tells the story while attempt 2 runs and its round waits
    listed = invoke("runs", "--profile", str(profile))
    assert listed.exit_code == 0 and "retrying (attempt 2 of 3)" in listed.output, \
        listed.output
    shown = cli_json("status", run_id, "--profile", str(profile))  # asks Slurm too
    assert shown["auto_retry"]["job_id"] == pending["job_id"], shown["auto_retry"]
    assert shown["auto_retry"]["story"] == "retrying (attempt 2 of 3)"
    cancelled = cli_json("cancel", run_id, "--profile", str(profile))
    assert pending["job_id"] in cancelled["scancelled"]
    name = autoretry.round_job_name(run_id)
    wait_until("the round job gone", lambda: _no_round(name), timeout_s=60)
    waited = invoke("wait", run_id, "--json", "--timeout", "120", "--profile", str(profile))
    assert waited.exit_code == 7, waited.output  # cancelled
    assert sorted(p.name for p in layout.submissions.glob("*.json")) == ["0001.json",
                                                                          "0002.json"]
    assert not layout.attempt(1, 3).root.exists()
    assert not merged.exists() and not (layout.root / "auto" / "merge.json").exists()
    # nothing after the cancelled round (sacct may not list a job cancelled while pending)
    assert all(int(job) <= int(pending["job_id"]) for job, *_ in _history(name))


def test_cancel_with_a_round_pending_submits_nothing_further(slurm_cluster,
                                                            tmp_path: Path) -> None:
    from tests.conftest import FAKE_SERVER

    profile = write_profile(tmp_path, sys.executable)
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", "--token-latency", "0.5"]
    run = tmp_path / "run.toml"
    run.write_text(
        "schema_version = 1\nname = \"cancel\"\nmax_attempts = 3\n"
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
