"""Column logic in the generator (issue 35): typed expressions, conditional parameters,
constraints met by redrawing, skip conditions (no request sent), all the same in every
shard layout, and a cell whose logic fails going through ``on_error``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.client.records import GenerateError
from synthbatch.agent_stdlib.contracts import ColumnSpec
from tests.agent_runs import logged, produce, recipe_plan, records

LOGIC = (
    ColumnSpec("category", "category", {"values": ["books", "games"]}),
    ColumnSpec("price", "uniform", {"low": 1.0, "high": 100.0, "decimals": 2,
                                    "conditional_params": {
                                        "category == 'books'": {"low": 5.0, "high": 30.0}}}),
    ColumnSpec("start", "integer", {"low": 0, "high": 9}),
    ColumnSpec("end", "integer", {"low": 0, "high": 10, "constraints": ["end > start"]}),
    ColumnSpec("span", "expression", {"expr": "end - start", "dtype": "int"}),
    ColumnSpec("n", "expression", {"template": "{start}", "dtype": "int"}),
    ColumnSpec("label", "expression", {
        "expr": "concat(upper(category), ':', 'cheap' if price < 20 else 'dear')"}),
    ColumnSpec("review", "llm-text", {"model": "gen", "prompt": "Review a {category} item.",
                                      "max_tokens": 3, "skip_when": "category == 'games'"}),
    ColumnSpec("echo", "expression", {"template": "[{review}]"}),
)


def run(tmp_path: Path, name: str, columns=LOGIC, records_: int = 40, offset: int = 0,
        count: Any = None, **client: Any) -> List[Dict[str, Any]]:
    plan = recipe_plan(columns, records=records_, **client)
    with serve_in_thread(model="fake-model", request_log=str(tmp_path / f"{name}.log")) as s:
        produce(plan, {"gen": s.url, "judge": s.url}, tmp_path / name, offset, count)
    return records(tmp_path / name)


def test_logic_gives_typed_conditional_constrained_and_skipped_values(tmp_path: Path) -> None:
    rows = run(tmp_path, "out")
    assert {r["category"] for r in rows} == {"books", "games"}
    for r in rows:
        assert r["end"] > r["start"]  # the constraint, met by redrawing
        assert r["span"] == r["end"] - r["start"] and isinstance(r["span"], int)
        assert r["n"] == r["start"] and isinstance(r["n"], int)  # "{start}" as an int
        assert r["label"] == f"{r['category'].upper()}:" + ("cheap" if r["price"] < 20
                                                            else "dear")
        if r["category"] == "books":
            assert 5 <= r["price"] < 30 and isinstance(r["review"], str)
            assert r["echo"] == f"[{r['review']}]" and "review" in r["_meta"]["columns"]
        else:
            assert r["review"] is None and r["echo"] == "[]"  # null renders as nothing
            assert "review" not in r["_meta"]["columns"]
    assert any(r["category"] == "games" and not 5 <= r["price"] < 30 for r in rows)
    sent = logged(tmp_path / "out.log")
    assert len(sent) == sum(r["category"] == "books" for r in rows)  # skipped: no request


def test_the_same_records_in_every_shard_layout(tmp_path: Path) -> None:
    whole = run(tmp_path, "whole")
    split = run(tmp_path, "split", count=13) + run(tmp_path, "split2", offset=13, count=27)
    for row in whole + split:
        for cell in row["_meta"]["columns"].values():
            cell.pop("latency_ms")
    assert split == whole
    other = run(tmp_path, "other", seed=8)
    assert [(r["start"], r["end"]) for r in other] != [(r["start"], r["end"]) for r in whole]


RUNTIME_FAIL = (
    ColumnSpec("start", "integer", {"low": 0, "high": 10}),
    ColumnSpec("end", "integer", {"low": 0, "high": 10, "constraints": ["end > start"]}),
    ColumnSpec("after", "expression", {"template": "{end}!"}),
)


def test_a_constraint_no_draw_meets_goes_through_on_error(tmp_path: Path) -> None:
    """start = 10 leaves no end above it: those records fail after 100 draws."""
    rows = run(tmp_path, "keep", RUNTIME_FAIL, records_=60, on_error="keep")
    failed = [r for r in rows if "_error" in r]
    assert failed and all(r["start"] == 10 for r in failed)
    assert all(r["start"] < 10 for r in rows if "_error" not in r)
    assert failed[0]["_error"] == {"column": "end", "message": "no value met the constraint "
                                   "'end > start' in 100 draws"}
    assert failed[0]["end"] is None and failed[0]["after"] is None
    with pytest.raises(GenerateError, match=r"record \d+: column end: no value met the "
                                            r"constraint 'end > start' in 100 draws"):
        run(tmp_path, "fail", RUNTIME_FAIL, records_=60)


def test_a_value_the_declared_type_cannot_hold_fails_the_cell(tmp_path: Path) -> None:
    columns = (ColumnSpec("x", "uniform", {"low": 0.0, "high": 1.0}),
               ColumnSpec("half", "expression", {"expr": "x / 2", "dtype": "int"}))
    rows = run(tmp_path, "out", columns, records_=3, on_error="keep")
    assert all(r["half"] is None and r["_error"]["column"] == "half" for r in rows)
    assert "dtype int: " in rows[0]["_error"]["message"]
    assert "is not an int (use round() or int())" in rows[0]["_error"]["message"]


def test_a_subcategory_of_a_skipped_category_fails_the_cell(tmp_path: Path) -> None:
    columns = (ColumnSpec("kind", "category", {"values": ["a", "b"]}),
               ColumnSpec("sub", "subcategory", {"category": "kind", "values": {
                   "a": ["x"], "b": ["y"]}, "skip_when": "index == 1"}),
               ColumnSpec("leaf", "subcategory", {"category": "sub", "values": {
                   "x": [1], "y": [2]}}))
    rows = run(tmp_path, "out", columns, records_=3, on_error="keep")
    assert [r.get("_error") for r in rows] == [
        None, {"column": "leaf", "message": "no values for ''"}, None]
    assert rows[1]["sub"] is None and rows[0]["leaf"] == {"x": 1, "y": 2}[rows[0]["sub"]]


def test_a_continuation_of_a_skipped_column_is_skipped(tmp_path: Path) -> None:
    columns = (ColumnSpec("draft", "llm-text", {"model": "gen", "prompt": "Draft {index}.",
                                                "max_tokens": 3,
                                                "skip_when": "index % 2 == 1"}),
               ColumnSpec("edit", "llm-text", {"model": "gen", "prompt": "Shorter.",
                                               "max_tokens": 3, "continue_from": "draft"}))
    rows = run(tmp_path, "out", columns, records_=4)
    assert [r["draft"] is None for r in rows] == [False, True, False, True]
    assert [r["edit"] is None for r in rows] == [False, True, False, True]
    assert len(logged(tmp_path / "out.log")) == 4  # two records, two requests each
