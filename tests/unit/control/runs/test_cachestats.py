"""``status --shard N`` shows a running shard's prefix-cache reuse and affinity (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from synthbatch.agent_stdlib.statefile import write_json_atomic
from synthbatch.control.cli.render import shard_text
from synthbatch.control.runs.status.refresh import observe
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import NOW, FakeSlurm, Shard, make_run

FIGURES = {"requests": 10, "tokens_in": 1000, "tokens_out": 80, "concurrency": 64,
           "in_flight": 60, "errors": {},
           "cache": {"prompt_tokens_cached": 580, "affinity_hits": 120,
                     "affinity_fallbacks": 3,
                     "replica_hit_rate": {"http://127.0.0.1:8001": 0.94}}}


def _observe(tmp_path: Path, figures: dict, shards: int = 1) -> dict:
    layout = make_run(tmp_path, [Shard("running", progress=4) for _ in range(shards)])
    for shard in range(shards):
        path = layout.attempt(shard, 1).progress_json
        write_json_atomic(path, {**json.loads(path.read_text()), "aliases": {"gen": figures}})
    fake = FakeSlurm()
    fake.on("squeue", stdout=f"500_[0-{shards - 1}]|RUNNING|None\n")
    return observe(layout, Scheduler(runner=fake), now=NOW)


def test_status_shard_shows_cache_hit_rate_and_affinity(tmp_path: Path) -> None:
    data = _observe(tmp_path, FIGURES, shards=2)
    row = data["shards"][0]
    assert row["aliases"]["gen"]["cache"] == FIGURES["cache"]
    text = shard_text({"run_id": data["run_id"], "shard": row, "log": None})
    assert ("  model gen: prefix cache 58.0% of 1,000 prompt tokens; affinity 120 hits, "
            "3 load-bound fallbacks; replica hit rate http://127.0.0.1:8001 0.94") in text
    assert data["aliases"]["gen"]["cache"]["affinity_hits"] == 240  # added over shards


def test_a_generator_without_cache_figures_shows_no_cache_line(tmp_path: Path) -> None:
    figures = {k: v for k, v in FIGURES.items() if k != "cache"}
    data = _observe(tmp_path, figures)
    assert "prefix cache" not in shard_text({"run_id": data["run_id"],
                                             "shard": data["shards"][0], "log": None})


@pytest.mark.parametrize("cache, field", [
    ("x", "cache"), ({"affinity_hits": "7"}, "cache.affinity_hits"),
    ({"replica_hit_rate": {"u": "high"}}, "cache.replica_hit_rate")])
def test_damaged_cache_figures_are_named(tmp_path: Path, cache: object, field: str) -> None:
    data = _observe(tmp_path, {**FIGURES, "cache": cache})
    assert f"field 'aliases.gen.{field}' has the wrong type" in data["shards"][0]["reason"]
    assert data["shards"][0]["state"] == "running"
