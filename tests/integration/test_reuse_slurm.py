"""Reusing an earlier run's LLM cells through real Slurm (issue 31), on the fake server,
which logs every request it answers: 2,000 records, 4 LLM columns in a chain. Changing
the last column's prompt sends exactly 2,000 requests (in 4 shards or 7) and leaves
every other column byte-identical; changing the first sends all 8,000 again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from tests.conftest import FAKE_SERVER
from tests.integration.runs import cli_json, wait_final, write_profile

pytestmark = pytest.mark.slurm
RECORDS = 2000
CHAIN = ("a", "b", "c", "d")
PROMPTS = {"a": "Ask about {topic}.", "b": "Answer {a}.", "c": "Improve {b}.",
           "d": "Judge {c}."}


def _run_file(folder: Path, name: str, log: Path, shards: int, **prompts: str) -> Path:
    """The chain's run file; every run's deployment is the same (same server argv, so
    the same model identity), its request log shared."""
    columns = "".join(
        f'[[client.columns]]\nname = "{col}"\ntype = "llm-text"\nmodel = "gen"\n'
        f"prompt = {json.dumps(prompts.get(col, PROMPTS[col]))}\nmax_tokens = 2\n\n"
        for col in CHAIN)
    command = ["{python}", str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "{served_name}", "--request-log", str(log)]
    path = folder / f"{name}.toml"
    path.write_text(
        f'schema_version = 1\nname = "reuse-chain"\nrecords = {RECORDS}\n'
        f"[shards]\ncount = {shards}\n"
        '[client]\nseed = 7\non_error = "fail"\n\n'
        '[[client.columns]]\nname = "topic"\ntype = "category"\n'
        'values = ["tides", "moons", "stars", "comets"]\n\n' + columns +
        '[[deployments]]\nalias = "gen"\nengine = "openai"\nmodel = "fake-model"\n'
        f"command = {json.dumps(command)}\ngpus = 1\nstartup_timeout_s = 60\n\n"
        '[resources]\ntime_limit = "00:10:00"\ncpus = 2\nmem_mb = 1024\n')
    return path


def _requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _submit(run_file: Path, profile: Path, log: Path, *reuse: str
            ) -> Tuple[str, int, Dict[str, Any]]:
    """Submit, wait, and say how many requests the fake servers answered meanwhile."""
    before = _requests(log)
    args = [a for r in reuse for a in ("--reuse", r)]
    run_id = cli_json("submit", str(run_file), "--profile", str(profile), *args)["run_id"]
    status = wait_final(run_id, profile, timeout_s=600, interval_s=2.0)
    assert status["state"] == "succeeded", status
    return run_id, _requests(log) - before, status


def _merged(tmp_path: Path, run_id: str, profile: Path) -> List[Dict[str, Any]]:
    out = tmp_path / f"{run_id}.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    assert manifest["complete"] and manifest["records"] == RECORDS
    return [json.loads(line) for line in out.read_text().splitlines()]


def _same(first: List[Dict[str, Any]], again: List[Dict[str, Any]], columns: str,
          run_id: str) -> None:
    """``columns`` of ``again`` are byte-identical to ``first``'s, taken from ``run_id``."""
    for old, new in zip(first, again):
        assert old["index"] == new["index"]
        for col in columns:
            assert json.dumps(new[col]) == json.dumps(old[col]), (new["index"], col)
            cell = dict(new["_meta"]["columns"][col])
            assert cell.pop("reused_from") == run_id
            assert cell == old["_meta"]["columns"][col]


def test_a_rerun_sends_only_the_changed_column(slurm_cluster, tmp_path, python_exe) -> None:
    log = tmp_path / "requests.jsonl"
    profile = write_profile(tmp_path, python_exe, cpus_per_task=2, mem_mb=1024)
    first_id, sent, _ = _submit(_run_file(tmp_path, "first", log, 4), profile, log)
    assert sent == 4 * RECORDS
    first = _merged(tmp_path, first_id, profile)

    last = _run_file(tmp_path, "last", log, 4, d="Judge  {c}.")  # whitespace counts
    plan = cli_json("plan", str(last), "--profile", str(profile), "--reuse", first_id)
    assert f"reuse: 3 of 4 LLM columns (a, b, c); regenerate: d (from {first_id})" \
        in plan["summary"]
    again_id, sent, status = _submit(last, profile, log, first_id)
    assert sent == RECORDS
    assert status["reuse"] == {"cells_reused": 3 * RECORDS, "cells": 4 * RECORDS,
                               "records_reused": 0}
    again = _merged(tmp_path, again_id, profile)
    _same(first, again, "abc", first_id)
    assert all("reused_from" not in r["_meta"]["columns"]["d"] for r in again)

    seven_id, sent, _ = _submit(_run_file(tmp_path, "seven", log, 7, d="Judge  {c}."),
                                profile, log, first_id)
    assert sent == RECORDS  # another shard layout: records match by index
    _same(first, _merged(tmp_path, seven_id, profile), "abc", first_id)

    _, sent, status = _submit(_run_file(tmp_path, "head", log, 4, a="Ask about {topic}!"),
                              profile, log, first_id)
    assert sent == 4 * RECORDS  # the first column changed: every dependant is new text
    assert status["reuse"]["cells_reused"] == 0

    same_id, sent, status = _submit(_run_file(tmp_path, "same", log, 3), profile, log,
                                    first_id)
    assert sent == 0  # the same recipe: every record taken whole (client/wholereuse.py)
    assert status["reuse"] == {"cells_reused": 4 * RECORDS, "cells": 4 * RECORDS,
                               "records_reused": RECORDS}
    _same(first, _merged(tmp_path, same_id, profile), "abcd", first_id)
    logs = sorted((tmp_path / "workspace" / "runs" / same_id).glob(
        "shards/*/attempts/*/logs/*/client.log"))
    assert len(logs) == 3 and all(
        f"records of {first_id} taken whole" in p.read_text() for p in logs)
