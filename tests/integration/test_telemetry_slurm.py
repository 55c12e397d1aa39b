"""Serving telemetry on the real Slurm testbed (issue 32): a run with one starved and one
idle deployment; ``status`` of the run names both, ``status --shard 0`` shows each
replica's last values, where the shard's time went and each LLM column's latency split."""

from __future__ import annotations

import json
import time
from typing import List

import pytest

from tests.conftest import FAKE_SERVER
from tests.integration.runs import invoke, wait_final, write_profile

pytestmark = pytest.mark.slurm


def _run(tmp_path, records: int) -> str:
    """One shard: ``gen`` (its fake engine runs one request at a time) writes a question,
    ``judge`` (a fake engine without a limit) grades it."""
    def command(*flags: str) -> str:
        return json.dumps(["{python}", str(FAKE_SERVER), "--host", "{host}", "--port",
                           "{port}", "--model", "{served_name}", *flags])

    path = tmp_path / "run.toml"
    path.write_text(
        f'schema_version = 1\nname = "telemetry"\nrecords = {records}\nauto_retry = false\n'
        "[shards]\ncount = 1\n[client]\nseed = 1\n"
        '[[client.columns]]\nname = "level"\ntype = "category"\n'
        'values = ["beginner", "expert"]\n'
        '[[client.columns]]\nname = "question"\ntype = "llm-text"\nmodel = "gen"\n'
        'prompt = "Write a {level} question."\nmax_tokens = 6\n'
        '[[client.columns]]\nname = "grade"\ntype = "llm-judge"\nmodel = "judge"\n'
        'prompt = "Question: {question}"\nmax_tokens = 6\n'
        'scores = [{ name = "clear", options = { "1" = "clear", "0" = "unclear" } }]\n'
        '[[deployments]]\nalias = "gen"\nmodel = "fake-gen"\n'
        f'command = {command("--max-concurrency", "1", "--token-latency", "0.02")}\n'
        "gpus = 1\nstartup_timeout_s = 60\n"
        '[[deployments]]\nalias = "judge"\nmodel = "fake-judge"\n'
        f"command = {command()}\ngpus = 1\nstartup_timeout_s = 60\n"
        "[resources]\ncpus = 2\nmem_mb = 1024\n")
    return str(path)


def _serving(text: str) -> List[str]:
    return [line.strip()[len("serving: "):] for line in text.splitlines()
            if line.strip().startswith("serving: ")]


def test_status_names_the_starved_and_the_idle_deployment(slurm_cluster, tmp_path, python_exe,
                                                          monkeypatch):
    # sampled every 0.3 s (the profile lets the variable through sbatch --export)
    monkeypatch.setenv("SYNTHBATCH_TELEMETRY_S", "0.3")
    profile = str(write_profile(tmp_path, python_exe, env_allow=["SYNTHBATCH_TELEMETRY_S"],
                                cpus_per_task=2, mem_mb=1024))
    submitted = invoke("submit", _run(tmp_path, records=200), "--profile", profile, "--json")
    assert submitted.exit_code == 0, submitted.output
    run_id = json.loads(submitted.stdout)["run_id"]
    flags: List[str] = []
    shard_text = ""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        text = invoke("status", run_id, "--profile", profile).stdout
        if "running" not in text.splitlines()[0]:
            break
        flags = _serving(text)
        if [f.split(":")[0] for f in flags] == ["gen", "judge"] and \
                "add replicas" in flags[0]:
            shard_text = invoke("status", run_id, "--shard", "0", "--profile", profile).stdout
            break
        time.sleep(0.5)
    assert len(flags) == 2, (flags, text)
    assert flags[0].startswith("gen: ") and flags[0].endswith(" waiting — add replicas")
    assert flags[1].startswith("judge: 1 replica, ") and flags[1].endswith(
        " busy, 0 waiting — over-provisioned")
    # status --shard 0: the last values of each replica, where the time went so far
    assert "serving (last sample):" in shard_text, shard_text
    replicas = [line.strip() for line in shard_text.splitlines()
                if line.strip().startswith(("gen http", "judge http"))]
    assert [r.split()[0] for r in replicas] == ["gen", "judge"], shard_text
    assert " running, " in replicas[0] and " waiting, KV " in replicas[0]
    assert "time: queue " in shard_text and "servers ready " in shard_text
    # per LLM column, the mean latency split into the proxy's queue and the engine's time
    latency = [line.strip() for line in shard_text.splitlines()
               if line.strip().startswith(("question (gen): ", "grade (judge): "))]
    assert len(latency) == 2 and all(" = proxy queue " in x and " ms + engine " in x
                                     for x in latency), shard_text
    assert wait_final(run_id, tmp_path / "profile.toml", 240)["state"] == "succeeded"
