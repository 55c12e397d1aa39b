"""The built-in generator's recipe through real Slurm: seed data, samplers and a
question -> answer -> judge chain over two deployments (fake servers, 3 shards, exact
merge), and the same chain once on the real llama.cpp model (``examples/qa-dataset.toml``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.agent_stdlib.recipe.schema import validate
from tests.conftest import REPO
from tests.integration.runs import cli_json, require_llamacpp, wait_final, write_profile

pytestmark = pytest.mark.slurm
EXAMPLES = REPO / "examples"
TOPICS = [json.loads(line) for line in (EXAMPLES / "data" / "topics.jsonl").read_text()
          .splitlines()]


def _copy_example(tmp_path: Path, name: str, **replace: str) -> Path:
    """An example run file next to its seed data's copy (``{config_dir}`` is tmp_path)."""
    text = (EXAMPLES / name).read_text()
    text = text.replace("{config_dir}/../", f"{REPO}/")
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "topics.jsonl").write_text(
        (EXAMPLES / "data" / "topics.jsonl").read_text())
    path = tmp_path / name
    path.write_text(text)
    return path


def _merged(tmp_path: Path, run_id: str, profile: Path) -> List[Dict[str, Any]]:
    out = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    assert manifest["complete"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == manifest["records"]
    return records


def _logs(tmp_path: Path, run_id: str, name: str) -> str:
    runs = tmp_path / "workspace" / "runs" / run_id
    return "\n".join(p.read_text(errors="replace") for p in runs.rglob(name))


def test_a_recipe_over_two_deployments_in_three_shards(slurm_cluster, tmp_path, python_exe):
    run_file = _copy_example(tmp_path, "qa-fake.toml")
    profile = write_profile(tmp_path, python_exe, cpus_per_task=2, mem_mb=1024)
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, timeout_s=300)
    assert status["state"] == "succeeded", status
    assert status["counts"] == {"succeeded": 3} and status["records_done"] == 30
    records = _merged(tmp_path, run_id, profile)
    assert [r["index"] for r in records] == list(range(30))  # exact: every record, in order
    by_topic = {t["topic"]: t for t in TOPICS}
    for record in records:
        seed = by_topic[record["topic"]]
        assert record["subject"] == seed["subject"]  # the unused seed field is carried
        assert record["level"] in ("beginner", "expert") and 5 <= record["minutes"] <= 30
        assert len(record["question"].split()) == 12  # the fake server's text, max_tokens
        assert isinstance(record["answer"]["answer"], str)
        assert record["grade"]["correct"]["score"] in (0, 1)
        columns = record["_meta"]["columns"]
        assert (columns["question"]["model"], columns["answer"]["model"],
                columns["grade"]["model"]) == ("gen", "gen", "judge")
        assert columns["grade"]["served_model"] == "fake-judge"
    # shuffle: each pass over the 20 topics uses every topic once (records 0-19)
    assert sorted(r["topic"] for r in records[:20]) == sorted(by_topic)
    # the same samplers and seed rows as the generator makes on the login node
    preview = cli_json("preview", str(run_file), "-n", "4", "--profile", str(profile))
    assert [(p["topic"], p["level"], p["minutes"]) for p in preview["records"]] == \
        [(r["topic"], r["level"], r["minutes"]) for r in records[:4]]
    client_logs = _logs(tmp_path, run_id, "client.log")
    assert "gen 128 in flight, adaptive up to 1024; judge 128 in flight, adaptive up to 1024" \
        in client_logs
    assert "generate: wrote 10 records" in client_logs
    _parquet_and_card(tmp_path, run_id, profile, records)


def _parquet_and_card(tmp_path: Path, run_id: str, profile: Path,
                      records: List[Dict[str, Any]]) -> None:
    """merge --format parquet of the same run: the plan's types, the same records, and a
    card naming the run's plan digest, models and judge histogram."""
    pq = pytest.importorskip("pyarrow.parquet")
    import hashlib

    manifest = cli_json("merge", run_id, "--format", "parquet", "--profile", str(profile))
    merged = tmp_path / "workspace" / "runs" / run_id / "merged"
    table = pq.read_table(merged / "data")
    assert str(table.schema.field("minutes").type) == "int64"
    assert str(table.schema.field("grade").type) == \
        "struct<correct: struct<score: int64, reasoning: string>>"
    assert table.to_pylist() == [as_parquet(r) for r in records]
    card = json.loads((merged / "card.json").read_text())
    plan = (tmp_path / "workspace" / "runs" / run_id / "plan.json").read_bytes()
    assert card["plan_sha256"] == manifest["plan_sha256"] == hashlib.sha256(plan).hexdigest()
    assert [m["alias"] for m in card["models"]] == ["gen", "judge"]
    scores = card["statistics"]["grade"]["scores"]["correct"]
    assert sum(scores.values()) == 30
    assert all(s["attempts"] == 1 for s in card["shards"])


def as_parquet(record: dict) -> dict:
    """A JSONL record as Parquet reads it back: a field the record omits is null there
    (the optional ``answer.steps``; a cell's ``reused_from``, ``retries``, ``language``)."""
    meta = record["_meta"]
    cells = {name: {"reused_from": None, "retries": None, "language": None, **cell}
             for name, cell in meta["columns"].items()}
    return {**record, "answer": {"steps": None, **record["answer"]},
            "_meta": {**meta, "columns": cells}}


def test_the_qa_recipe_on_the_real_llamacpp_model(slurm_cluster, tmp_path, python_exe):
    require_llamacpp()
    run_file = _copy_example(tmp_path, "qa-dataset.toml", **{  # greedy: no luck involved
        "records = 16\n": "records = 4\n", "[shards]\ncount = 2": "[shards]\ncount = 1",
        "temperature = 0.8\n": "temperature = 0.0\n",
        "temperature = 0.3\n": "temperature = 0.0\n"})
    profile = write_profile(tmp_path, python_exe, mem_mb=1024, cpus_per_task=2,
                            default_time_limit="00:20:00", grace_s=10)
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, timeout_s=900, interval_s=3.0)
    assert status["state"] == "succeeded", status
    records = _merged(tmp_path, run_id, profile)
    dropped = json.loads((tmp_path / "workspace" / "runs" / run_id / "merged" /
                          "manifest.json").read_text())["dropped"]
    assert len(records) + dropped == 4 and records, dropped  # every record accounted for
    schema = {"type": "object", "required": ["answer"],
              "properties": {"answer": {"type": "string", "maxLength": 160},
                             "steps": {"type": "array", "maxItems": 2,
                                       "items": {"type": "string", "maxLength": 60}}}}
    for record in records:
        assert record["topic"] in {t["topic"] for t in TOPICS}
        assert isinstance(record["question"], str) and record["question"].strip(), record
        assert validate(record["answer"], schema) is None
        assert record["grade"]["correct"]["score"] in (0, 1)
        for cell in record["_meta"]["columns"].values():
            assert cell["usage"]["completion_tokens"] > 0 and cell["model"] == "smol"
    assert "serve-llamacpp: listening" in _logs(tmp_path, run_id, "server-*.log")
