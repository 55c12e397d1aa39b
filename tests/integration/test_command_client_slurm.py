"""The command-client contract on the real Slurm testbed: examples/clients/chat_client.py,
a plain-Python client that knows only the SYNTHBATCH_* variables, runs as each shard's
client and its records merge exactly (issue 16)."""

from __future__ import annotations

import json

import pytest

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import read_json
from tests.conftest import REPO
from tests.integration.runs import cli_json, wait_final, write_profile

pytestmark = pytest.mark.slurm
EXAMPLE = REPO / "examples" / "clients" / "run.toml"


def test_the_example_client_runs_every_shard_and_merges(slurm_cluster, tmp_path, python_exe):
    profile = write_profile(tmp_path, python_exe)
    run_id = cli_json("submit", str(EXAMPLE), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile)
    assert status["state"] == "succeeded", status
    assert status["records_done"] == 12
    out = tmp_path / "merged.jsonl"
    cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(12))
    for record in records:
        assert record["prompt"] == f"Write one sentence about the number {record['index']}."
        assert record["completion"] == expected_completion("fake-model", record["prompt"], 16)
        assert record["model"] == "tiny"
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    for shard in (0, 1):
        progress = read_json(layout.attempt(shard, 1).progress_json)
        assert progress is not None and progress["records_done"] == 6
