"""Reusing LLM cells of an earlier run in the generator (issue 31), on the fake server,
which logs every request it answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client.generate import Shard, run_shard
from synthbatch.agent_stdlib.client.output import Output
from synthbatch.agent_stdlib.client.progress import Progress
from synthbatch.agent_stdlib.client.reuse import Cells, run_files
from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan
from synthbatch.agent_stdlib.resume import KeptRecords
from tests.agent_runs import recipe_plan

RECORDS = 24


def columns(last: str = "Judge {c}.") -> Tuple[ColumnSpec, ...]:
    return (ColumnSpec("topic", "category", {"values": ["tides", "moons", "stars"]}),
            ColumnSpec("a", "llm-text", {"model": "gen", "prompt": "Ask about {topic}.",
                                         "max_tokens": 4}),
            ColumnSpec("b", "llm-text", {"model": "gen", "prompt": "Answer {a}.",
                                         "max_tokens": 4}),
            ColumnSpec("c", "llm-text", {"model": "gen", "prompt": "Improve {b}.",
                                         "max_tokens": 4}),
            ColumnSpec("d", "llm-text", {"model": "gen", "prompt": last, "max_tokens": 4}))


def run(plan: Plan, url: str, folder: Path, shards: int,
        reuse: Optional[Cells] = None) -> List[Dict[str, Any]]:
    per = -(-RECORDS // shards)
    for first in range(0, RECORDS, per):
        count = min(per, RECORDS - first)
        out = folder / f"shard-{first}"
        out.mkdir(parents=True)
        run_shard(plan, {"gen": url}, Shard(first, count, Output(out, first),
                                             Progress(folder / f"p{first}.json", count),
                                             KeptRecords()), reuse=reuse)
    return [json.loads(line) for path in sorted(folder.glob("shard-*/records-*.jsonl"))
            for line in path.read_text().splitlines()]


def cells_of(folder: Path, first: int, count: int) -> Cells:
    cells = Cells()
    cells.add_run("run-1", sorted(folder.glob("shard-*/records-*.jsonl")), first, count)
    return cells


def requests(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _rerun(tmp_path: Path, changed: ColumnSpec, position: int) -> Tuple[int, list, list]:
    log = tmp_path / "requests.log"
    with serve_in_thread(model="fake-model", request_log=str(log)) as server:
        first = run(recipe_plan(columns(), records=RECORDS), server.url, tmp_path / "one", 4)
        assert requests(log) == 4 * RECORDS
        cols = list(columns())
        cols[position] = changed
        second = run(recipe_plan(tuple(cols), records=RECORDS), server.url,
                     tmp_path / "two", 7, cells_of(tmp_path / "one", 0, RECORDS))
    return requests(log) - 4 * RECORDS, first, second


def test_changing_the_last_column_regenerates_only_it_in_another_shard_layout(
        tmp_path: Path) -> None:
    sent, first, second = _rerun(tmp_path, columns("Judge  {c}.")[4], 4)
    assert sent == RECORDS
    by_index = {r["index"]: r for r in first}
    for record in sorted(second, key=lambda r: r["index"]):
        old = by_index[record["index"]]
        assert [record[k] for k in "abc"] == [old[k] for k in "abc"]
        assert [record["_meta"]["columns"][k]["reused_from"] for k in "abc"] == ["run-1"] * 3
        assert "reused_from" not in record["_meta"]["columns"]["d"]


def test_progress_counts_reused_cells_apart(tmp_path: Path) -> None:
    _rerun(tmp_path, columns("Judge  {c}.")[4], 4)
    progress = [json.loads(p.read_text()) for p in (tmp_path / "two").glob("p*.json")]
    assert sum(p["cells_reused"] for p in progress) == 3 * RECORDS
    assert sum(p["cells_generated"] for p in progress) == RECORDS
    assert sum(p["records_reused"] for p in progress) == 0  # each record sent one request
    assert sum(p["tokens"] for p in progress) == sum(  # the generated column's tokens only
        r["_meta"]["columns"]["d"]["usage"]["completion_tokens"]
        for path in (tmp_path / "two").glob("shard-*/records-*.jsonl")
        for r in map(json.loads, path.read_text().splitlines()))


def test_a_rerun_of_the_same_recipe_sends_nothing_and_writes_the_same_records(
        tmp_path: Path) -> None:
    """Every LLM cell reused: each record is built at once (``Engine.reused``)."""
    sent, first, second = _rerun(tmp_path, columns()[4], 4)
    assert sent == 0
    strip = [{**r, "_meta": {**r["_meta"], "columns": {
        k: {x: y for x, y in m.items() if x != "reused_from"}
        for k, m in r["_meta"]["columns"].items()}}} for r in second]
    assert sorted(strip, key=lambda r: r["index"]) == sorted(first, key=lambda r: r["index"])
    progress = [json.loads(p.read_text()) for p in (tmp_path / "two").glob("p*.json")]
    assert sum(p["records_reused"] for p in progress) == RECORDS
    assert sum(p["cells_generated"] for p in progress) == 0


def test_the_rate_leaves_out_records_whose_every_cell_was_reused() -> None:
    progress = Progress(None, 10)
    for reused, generated in ((2, 0), (2, 0), (1, 1)):
        progress.settled()
        progress.cells(reused, generated)
    assert (progress.reused, progress.generated, progress.records_reused) == (5, 1, 2)
    assert progress.rate(progress.started + 2.0) == 0.5  # one generated record in 2 s
    assert "reused 5 of 6 cells" in progress.line(progress.started + 2.0)


def test_changing_the_first_column_regenerates_everything(tmp_path: Path) -> None:
    changed = ColumnSpec("a", "llm-text", {"model": "gen", "prompt": "Ask about {topic}!",
                                           "max_tokens": 4})
    sent, _, second = _rerun(tmp_path, changed, 1)
    assert sent == 4 * RECORDS
    assert not any("reused_from" in m for r in second for m in r["_meta"]["columns"].values())


def test_damaged_and_out_of_range_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    good = {"index": 3, "a": "x", "_meta": {"columns": {"a": {"request_digest": "sha256:1"}}}}
    path.write_text("{not json\n" + json.dumps(good) + "\n"
                    + json.dumps({**good, "index": 99}) + "\n")
    cells = Cells()
    cells.add_run("r", [path, tmp_path / "gone.jsonl"], 0, 10)  # one damaged, one missing
    assert cells.damaged == 1 and list(cells.cells) == [(3, "a")]
    assert cells.problems == [
        f"r: {path}: 1 damaged line(s) skipped, their cells are generated",
        f"r: {tmp_path / 'gone.jsonl'}: unreadable (No such file or directory): skipped, "
        "its cells are generated"]
    assert cells.take(3, "a", "sha256:2") is None
    assert cells.take(3, "a", "sha256:1") == ("x", {"request_digest": "sha256:1",
                                                    "reused_from": "r"})


def test_run_files_takes_the_winner_else_the_latest_attempt(tmp_path: Path) -> None:
    for shard, attempts in (("shard-00000", (1, 2)), ("shard-00001", (1, 2))):
        for n in attempts:
            out = tmp_path / "shards" / shard / "attempts" / f"attempt-{n:04d}" / "output"
            out.mkdir(parents=True)
            (out / "records-000000000000.jsonl").write_text("")
    (tmp_path / "shards" / "shard-00000" / "winner.json").write_text('{"attempt": 1}')
    got = [p.relative_to(tmp_path / "shards").parts[:3] for p in run_files(tmp_path)]
    assert got == [("shard-00000", "attempts", "attempt-0001"),
                   ("shard-00001", "attempts", "attempt-0002")]
    # a winner record planted as a symlink is not followed (statefile's one reader)
    planted = tmp_path / "planted.json"
    planted.write_text('{"attempt": 1}')
    (tmp_path / "shards" / "shard-00001" / "winner.json").symlink_to(planted)
    got = [p.relative_to(tmp_path / "shards").parts[:3] for p in run_files(tmp_path)]
    assert got[1] == ("shard-00001", "attempts", "attempt-0002")


def test_a_shard_reads_only_the_earlier_records_of_its_own_range(tmp_path: Path) -> None:
    """Issue 31's "reads each reused record once": only the earlier run's shards that
    overlap the new shard's range, and within a file from about where the range starts
    (a bisection) to where it ends."""
    import dataclasses

    from synthbatch.agent_stdlib.client import reuse as reuse_module
    from synthbatch.agent_stdlib.contracts import ShardSpec
    from synthbatch.agent_stdlib.layout import RunLayout

    layout = RunLayout(tmp_path)
    plan = recipe_plan(columns(), records=40_000)
    specs = (ShardSpec(0, 0, 20_000), ShardSpec(1, 20_000, 20_000))
    layout.plan_json.write_text(dataclasses.replace(plan, shards=specs).to_json())
    for spec in specs:
        out = layout.attempt(spec.index, 1).output
        out.mkdir(parents=True)
        (out / f"records-{spec.record_offset:012d}.jsonl").write_text("".join(
            json.dumps({"index": i, "a": f"x{i}", "_meta": {"columns": {
                "a": {"request_digest": f"d{i}"}}}}) + "\n"
            for i in range(spec.record_offset, spec.record_offset + spec.num_records)))
    files = run_files(tmp_path, 25_000, 100)
    assert [p.relative_to(tmp_path).parts[1] for p in files] == ["shard-00001"]
    assert len(run_files(tmp_path, 19_990, 100)) == 2 and len(run_files(tmp_path)) == 2
    seen: List[int] = []

    class Counted(Cells):
        def _add_line(self, *args: Any) -> Optional[int]:
            index = super()._add_line(*args)
            seen.append(-1 if index is None else index)
            return index

    cells = Counted()
    cells.add_run("r", files, 25_000, 100)
    assert sorted(i for (i, _) in cells.cells) == list(range(25_000, 25_100))
    assert cells.take(25_050, "a", "d25050") == ("x25050", {"request_digest": "d25050",
                                                            "reused_from": "r"})
    assert max(seen) == 25_100 and len(seen) < 100 + reuse_module.SCAN_BYTES // 50


AT_ONCE = (
    ColumnSpec("kind", "category", {"values": ["a", "b"]}),
    ColumnSpec("sub", "subcategory", {"category": "kind", "values": {"a": ["x"], "b": ["y"]},
                                      "skip_when": "index % 4 == 1"}),
    ColumnSpec("n", "uniform", {"low": 1, "high": 9, "skip_when": "index % 3 == 0"}),
    ColumnSpec("leaf", "subcategory", {"category": "sub", "values": {"x": [1], "y": [2]}}),
    ColumnSpec("code", "llm-code", {"model": "gen", "prompt": "Code {kind} #{index}",
                                    "max_tokens": 8}),
    ColumnSpec("digits", "validation", {"validator": "regex", "target": "code",
                                        "pattern": "^[0-9]+$"}),
)


@pytest.mark.parametrize("shards", [4, 5])
def test_a_record_every_cell_of_which_is_reused_is_the_record_the_first_run_made(
        tmp_path: Path, shards: int) -> None:
    """Built at once (``Engine.reused``): skip_when holds for samplers too, a validation
    column is checked (not rendered as an expression), and a cell that fails (a
    subcategory of a skipped category) is the record's ``_error``, as the first run
    wrote it, not the shard's crash."""
    log = tmp_path / "requests.log"
    plan = recipe_plan(AT_ONCE, records=RECORDS, on_error="keep")
    with serve_in_thread(model="fake-model", request_log=str(log)) as server:
        first = run(plan, server.url, tmp_path / "one", 4)
        second = run(plan, server.url, tmp_path / "two", shards,
                     cells_of(tmp_path / "one", 0, RECORDS))
    assert requests(log) == RECORDS + RECORDS // 4  # a record with an error: generated
    first, second = (sorted(rs, key=lambda r: r["index"]) for rs in (first, second))
    strip = [{k: v for k, v in r.items() if k != "_meta"} for r in second]
    assert strip == [{k: v for k, v in r.items() if k != "_meta"} for r in first]
    assert [r["n"] is None for r in second[:4]] == [True, False, False, True]
    assert second[1]["_error"] == {"column": "leaf", "message": "no values for ''"}
    assert isinstance(second[0]["digits"], dict) and "valid" in second[0]["digits"]
