"""merge --format parquet on real-shaped data: one schema for every shard (the plan's for the
built-in generator, unified for other clients), several files for large runs, the dataset
card, and loading the merged folder with Hugging Face ``datasets`` (offline)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.agent_stdlib.candidate import build_manifest, dropped_name
from synthbatch.agent_stdlib.contracts import (
    ColumnSpec,
    CommandClientSpec,
    GenerateSpec,
    Plan,
    WinnerRecord,
    sha256_bytes,
)
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable, publish_json_immutable
from synthbatch.control.errors import Conflict
from synthbatch.control.runs.merge import merge_run
from tests.fakes import make_plan_for

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

COMMAND = CommandClientSpec(argv=("python3", "client.py"), env={})


def command_plan(records: int, shards: int) -> Plan:
    return replace(make_plan_for(records, shards), client=None, client_command=COMMAND)


def build(root: Path, plan: Plan, shards: List[List[Dict[str, Any]]],
          dropped: Dict[int, List[int]] = None) -> RunLayout:
    """A run whose shard ``i`` holds the records ``shards[i]`` (as JSON lines)."""
    layout = RunLayout(ensure_dir(root))
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    for spec, records in zip(plan.shards, shards):
        out = ensure_dir(layout.attempt(spec.index, 1).output)
        (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        for index in (dropped or {}).get(spec.index, []):
            with open(out / dropped_name("0"), "a") as handle:
                handle.write(json.dumps({"index": index, "column": "q", "error": "x"}) + "\n")
        manifest = build_manifest(out, spec.index, 1, spec.num_records)
        result = manifest.to_json().encode()
        publish_immutable(layout.attempt(spec.index, 1).result_json, result)
        winner = WinnerRecord(shard=spec.index, attempt=1, records=manifest.records,
                              result_sha256=sha256_bytes(result), files=manifest.files,
                              created_at=1.0, dropped=manifest.dropped)
        assert publish_json_immutable(layout.winner_json(spec.index), winner.to_dict())
    return layout


def table(layout: RunLayout) -> Any:
    return pq.read_table(layout.merged / "data")


# ----------------------------------------------------------------------------- the cases


def test_a_field_only_in_a_later_shard_becomes_a_nullable_column(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "q": "a"}, {"index": 1, "q": "b"}],
        [{"index": 2, "q": "c", "hint": {"lang": "en"}}, {"index": 3, "q": "d"}]])
    merge_run(layout, None, False, fmt="parquet")
    got = table(layout)
    assert got.schema.field("hint").type == pa.struct([("lang", pa.string())])
    assert got.column("hint").to_pylist() == [None, None, {"lang": "en"}, None]


def test_an_int_in_one_shard_and_a_float_in_another_is_a_float(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "x": 1}, {"index": 1, "x": 2}],
        [{"index": 2, "x": 2.5}, {"index": 3, "x": 3}]])
    merge_run(layout, None, False, fmt="parquet")
    got = table(layout)
    assert got.schema.field("x").type == pa.float64()
    assert got.column("x").to_pylist() == [1.0, 2.0, 2.5, 3.0]


def test_a_column_all_null_in_the_first_shard_takes_the_later_type(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "q": None}, {"index": 1, "q": None}],
        [{"index": 2, "q": "text"}, {"index": 3, "q": None}]])
    merge_run(layout, None, False, fmt="parquet")
    got = table(layout)
    assert got.schema.field("q").type == pa.string()
    assert got.column("q").to_pylist() == [None, None, "text", None]


def test_a_true_conflict_names_shard_record_and_field(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "m": {"n": 1}}, {"index": 1, "m": {"n": 2}}],
        [{"index": 2, "m": {"n": 3}}, {"index": 3, "m": {"n": "three"}}]])
    with pytest.raises(Conflict) as info:
        merge_run(layout, None, False, fmt="parquet")
    text = info.value.message
    assert text.startswith("shard 1: ") and "record 3" in text and "field m.n" in text
    assert not (layout.merged / "data").exists()  # nothing half-written is left


def test_a_conflict_inside_one_shard_names_the_record(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(3, 1), [
        [{"index": 0, "v": 1}, {"index": 1, "v": "one"}, {"index": 2, "v": 2}]])
    with pytest.raises(Conflict, match=r"shard 0: .*record 1: .*field v"):
        merge_run(layout, None, False, fmt="parquet")


# ----------------------------------------------------------------------------- generator schema


def generator_plan(records: int, shards: int) -> Plan:
    columns = (
        ColumnSpec("level", "category", {"values": ["beginner", "expert"]}),
        ColumnSpec("minutes", "integer", {"low": 5, "high": 30}),
        ColumnSpec("weight", "uniform", {"low": 0, "high": 2}),
        ColumnSpec("question", "llm-text", {"model": "tiny", "prompt": "Ask about {level}"}),
        ColumnSpec("answer", "llm-structured", {
            "model": "tiny", "prompt": "{question}",
            "schema": {"type": "object", "required": ["answer"],
                       "properties": {"answer": {"type": "string"},
                                      "steps": {"type": "array",
                                                "items": {"type": "string"}}}}}),
        ColumnSpec("grade", "llm-judge", {"model": "tiny", "prompt": "{answer.answer}",
                                          "scores": [{"name": "correct",
                                                      "options": {"1": "yes", "0": "no"}}]}),
    )
    spec = GenerateSpec(columns=columns, on_error="keep")
    return replace(make_plan_for(records, shards), client=spec)


def cell(tokens: int) -> Dict[str, Any]:
    return {"model": "tiny", "served_model": "m", "finish_reason": "stop", "attempts": 1,
            "latency_ms": 3.5, "usage": {"prompt_tokens": 10, "completion_tokens": tokens,
                                         "total_tokens": 10 + tokens}}


def generated(index: int, ok: bool) -> Dict[str, Any]:
    record: Dict[str, Any] = {"index": index, "topic": "tides", "level": "expert",
                              "minutes": 7, "weight": 1 if index % 2 else 0.5,
                              "question": "Why?" if ok else None}
    record["answer"] = {"answer": "Because."} if ok else None
    record["grade"] = {"correct": {"score": 1, "reasoning": "fine"}} if ok else None
    record["_meta"] = {"index": index, "columns": {"question": cell(5), "answer": cell(7),
                                                   "grade": cell(2)} if ok else {}}
    if not ok:
        record["_error"] = {"column": "question", "message": "HTTP 500"}
    return record


def test_the_generator_s_records_take_the_plan_s_schema(tmp_path: Path) -> None:
    """Shard 0 has every LLM column null (on_error = keep) and ints where the plan says
    float: the parquet types are still the plan's, not shard 0's."""
    layout = build(tmp_path / "run", generator_plan(4, 2), [
        [generated(0, False), generated(1, False)], [generated(2, True), generated(3, True)]])
    manifest = merge_run(layout, None, False, fmt="parquet")
    schema = table(layout).schema
    assert schema.field("weight").type == pa.float64()
    assert schema.field("minutes").type == pa.int64()
    assert schema.field("question").type == pa.string()
    assert schema.field("answer").type == pa.struct([("answer", pa.string()),
                                                     ("steps", pa.list_(pa.string()))])
    judge = schema.field("grade").type
    assert judge == pa.struct([("correct", pa.struct([("score", pa.int64()),
                                                      ("reasoning", pa.string())]))])
    assert schema.field("topic").type == pa.string()  # a seed field: inferred
    assert table(layout).column("answer").to_pylist()[2] == {"answer": "Because.",
                                                             "steps": None}
    card = json.loads((layout.merged / "card.json").read_text())
    assert card["tokens"]["answer"] == {"prompt_tokens": 20, "completion_tokens": 14}
    assert card["statistics"]["grade"]["scores"] == {"correct": {"1": 2}}
    assert card["statistics"]["question"]["nulls"] == 2
    assert card["statistics"]["level"]["values"] == {"expert": 4}
    assert card["records"] == manifest["records"] == 4


# ----------------------------------------------------------------------------- large runs


def test_a_large_run_is_several_files_of_bounded_row_groups(tmp_path: Path,
                                                            monkeypatch) -> None:
    from synthbatch.control.runs import parquet

    monkeypatch.setattr(parquet, "CHUNK", 4096)
    monkeypatch.setattr(parquet, "FILE_BYTES", 8192)
    rows = [[{"index": s * 500 + i, "text": "x" * (i % 40), "n": i} for i in range(500)]
            for s in range(4)]
    layout = build(tmp_path / "run", command_plan(2000, 4), rows)
    manifest = merge_run(layout, None, False, fmt="parquet")
    parts = manifest["parquet_files"]
    assert len(parts) > 2 and sum(p["records"] for p in parts) == 2000
    names = sorted(p.name for p in (layout.merged / "data").iterdir())
    assert names == [p["path"] for p in parts]
    assert names[0] == f"train-00000-of-{len(parts):05d}.parquet"
    assert table(layout).column("index").to_pylist() == list(range(2000))
    for part in parts:
        meta = pq.ParquetFile(layout.merged / "data" / part["path"]).metadata
        assert all(meta.row_group(g).num_rows <= 500 for g in range(meta.num_row_groups))


# ----------------------------------------------------------------------------- card, dropped


def test_the_card_says_what_was_dropped_and_where(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "q": "a"}], [{"index": 2, "q": "b"}, {"index": 3, "q": "c"}]],
        dropped={0: [1]})
    manifest = merge_run(layout, None, False)
    assert manifest["dropped"] == 1
    [where] = manifest["dropped_files"]
    assert where["shard"] == 0 and where["records"] == 1
    assert where["path"] == [str(layout.attempt(0, 1).output / ".dropped-0.jsonl")]
    readme = (layout.merged / "README.md").read_text()
    assert "records: 3 (1 dropped by the client)" in readme
    assert "data_files:" in readme and '"records.jsonl"' in readme


def test_yaml_features_are_what_datasets_writes(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from synthbatch.control.runs.card import feature

    schema = pa.schema([("index", pa.int64()), ("w", pa.float64()), ("b", pa.bool_()),
                        ("n", pa.null()), ("tags", pa.list_(pa.string())),
                        ("a", pa.struct([("x", pa.string()),
                                         ("ys", pa.list_(pa.struct([("k", pa.int64())])))]))])
    ours = [{"name": f.name, **feature(f.type)} for f in schema]
    theirs = datasets.Features.from_arrow_schema(schema)._to_yaml_list()
    assert ours == theirs


LOAD = textwrap.dedent("""
    import json, sys
    from datasets import load_dataset
    folder = sys.argv[1]
    one = load_dataset("parquet", data_dir=folder + "/data", split="train")
    two = load_dataset(folder, split="train")
    import pandas
    frame = pandas.read_parquet(folder + "/data")
    print(json.dumps({"one": one.to_list(), "two": two.to_list(),
                      "pandas": frame["x"].tolist(),
                      "features": str(two.features), "cols": one.column_names}))
""")


def test_datasets_loads_the_merged_folder_offline(tmp_path: Path) -> None:
    """Both ``load_dataset("parquet", data_dir=...)`` and ``load_dataset(<merged>)`` (the
    card's YAML) give the records with their types, with no network at all; pandas reads
    the folder too."""
    pytest.importorskip("datasets")
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "x": 1, "q": None}, {"index": 1, "x": 2, "q": None}],
        [{"index": 2, "x": 2.5, "q": "t", "extra": [1]}, {"index": 3, "x": 3, "q": "u"}]])
    merge_run(layout, None, False, fmt="parquet")
    merge_run(layout, None, False)  # records.jsonl beside data/: the card's config decides
    merge_run(layout, None, False, fmt="parquet")
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_PROXY": "*"}
    done = subprocess.run([sys.executable, "-c", LOAD, str(layout.merged)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["one"] == got["two"]
    assert [r["x"] for r in got["one"]] == [1.0, 2.0, 2.5, 3.0]
    assert [r["q"] for r in got["one"]] == [None, None, "t", "u"]
    assert [r["extra"] for r in got["one"]] == [None, None, [1], None]
    assert "'x': Value('float64')" in got["features"]
    assert got["pandas"] == [1.0, 2.0, 2.5, 3.0]


def test_data_designer_profiles_go_into_the_card(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0}, {"index": 1}], [{"index": 2}, {"index": 3}]])
    (layout.attempt(0, 1).output / ".dd-profile-000000000000.json").write_text(
        json.dumps({"passes": [{"pass": 1, "records": 2, "profile": {"num_records": 2}}]}))
    (layout.attempt(1, 1).output / ".dd-profile-000000000002.json").write_text("{")
    merge_run(layout, None, False)  # the profiles are not records: the merge is unchanged
    card = json.loads((layout.merged / "card.json").read_text())
    profiles = card["data_designer_profiles"]
    assert profiles["0"]["passes"][0]["profile"] == {"num_records": 2}
    assert ".dd-profile-000000000002.json" in profiles["1"]["error"]
    assert card["records"] == 4


def test_records_that_fit_the_first_chunk_s_schema_are_parsed_once(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """No widening after the first chunk (later nulls, ints where floats were, missing
    struct fields): one pass, no schema pass; a widening later falls back to two."""
    from synthbatch.control.runs import parquet

    def no_second_pass(*_: Any) -> None:
        raise AssertionError("the schema pass ran")

    monkeypatch.setattr(parquet, "infer", no_second_pass)
    layout = build(tmp_path / "run", command_plan(4, 2), [
        [{"index": 0, "x": 1.5, "s": {"a": 1, "b": "t"}, "l": [{"k": 1}]},
         {"index": 1, "x": 2.5, "s": None, "l": []}],
        [{"index": 2, "x": 3, "s": {"a": 2}, "l": None}, {"index": 3, "x": None}]])
    merge_run(layout, None, False, fmt="parquet")
    got = table(layout)
    assert got.column("x").to_pylist() == [1.5, 2.5, 3.0, None]
    assert got.column("s").to_pylist() == [{"a": 1, "b": "t"}, None, {"a": 2, "b": None},
                                           None]
    assert got.column("l").to_pylist() == [[{"k": 1}], [], None, None]


def test_text_that_looks_like_a_timestamp_stays_the_text_it_was(tmp_path: Path) -> None:
    """pyarrow's JSON reader infers ISO dates as timestamps: the record had text, and the
    parquet column keeps exactly that text (the two-pass path parses it as a string)."""
    layout = build(tmp_path / "run", command_plan(3, 1), [
        [{"index": 0, "day": "2024-01-03"}, {"index": 1, "day": "2024-02-29T10:00:00"},
         {"index": 2, "day": None}]])
    merge_run(layout, None, False, fmt="parquet")
    got = table(layout)
    assert got.schema.field("day").type == pa.string()
    assert got.column("day").to_pylist() == ["2024-01-03", "2024-02-29T10:00:00", None]



def test_small_shards_share_a_row_group(tmp_path: Path) -> None:
    layout = build(tmp_path / "run", command_plan(50, 10),
                   [[{"index": s * 5 + i, "v": i} for i in range(5)] for s in range(10)])
    manifest = merge_run(layout, None, False, fmt="parquet")
    [part] = manifest["parquet_files"]
    meta = pq.ParquetFile(layout.merged / "data" / part["path"]).metadata
    assert (meta.num_row_groups, meta.num_rows) == (1, 50)


def test_the_card_shows_record_values_as_untrusted_text(tmp_path: Path) -> None:
    evil = "\x1b[2Jred|x"
    layout = build(tmp_path / "run", command_plan(8, 1), [
        [{"index": i, "tag": evil if i % 2 else "ok"} for i in range(8)]])
    merge_run(layout, None, False)
    readme = (layout.merged / "README.md").read_text()
    assert "\x1b" not in readme
    assert "\\x1b[2Jred\\|x: 4" in readme
    assert json.loads((layout.merged / "card.json").read_text())["statistics"]["tag"][
        "values"] == {"ok": 4, evil: 4}


def test_identity_validation_and_llm_code_columns_take_the_plan_s_schema(
        tmp_path: Path) -> None:
    """Issue 35's new kinds: an identity and a validation value are structs, llm-code and
    timedelta text, and an llm-code cell's ``_meta`` keeps the language it found."""
    columns = (
        ColumnSpec("who", "identity", {"locale": "en_US"}),
        ColumnSpec("code", "llm-code", {"model": "tiny", "prompt": "{who.first_name}"}),
        ColumnSpec("ok", "validation", {"validator": "python", "target": "code"}),
    )
    plan = replace(make_plan_for(2, 1), client=GenerateSpec(columns=columns))
    who = {"first_name": "Ada", "last_name": "L", "sex": "female", "age": 36,
           "locale": "en_US", "city": "Austin", "state": "TX", "email": "ada.l1@example.com"}
    records = [{"index": i, "who": who, "code": "x = 1", "ok": {"valid": True, "errors": []},
                "_meta": {"index": i, "columns": {"code": dict(cell(3), language="python")}}}
               for i in range(2)]
    layout = build(tmp_path / "run", plan, [records])
    merge_run(layout, None, False, fmt="parquet")
    data = table(layout)
    assert data.schema.field("who").type.field("age").type == pa.int64()
    assert data.schema.field("ok").type == pa.struct([("valid", pa.bool_()),
                                                      ("errors", pa.list_(pa.string()))])
    assert data.column("code").to_pylist() == ["x = 1", "x = 1"]
    assert data.column("who").to_pylist()[0] == who
    meta = data.column("_meta").to_pylist()[0]["columns"]["code"]
    assert meta["language"] == "python"
