"""The Data Designer adapter's pure rules: model aliases, seed rows, renumbering, JSON."""

from __future__ import annotations

import datetime
import decimal
import json
import math

import pytest

from synthbatch.agent_stdlib.client.ddshard import (
    INDEX_COLUMN,
    batch_targets,
    missing,
    plain,
    record_line,
    reserved_columns,
    resolve_models,
    row_ranges,
    selected_range,
    shard_seed_rows,
)

USED = {"writer": ["story"], "critic": ["review", "score"]}


def test_aliases_keep_their_name_or_follow_the_mapping() -> None:
    targets, problems = resolve_models(["writer", "critic"], USED, {"critic": "judge"},
                                       ["writer", "judge"])
    assert targets == {"writer": "writer", "critic": "judge"} and problems == []


def test_an_alias_no_deployment_serves_is_named_with_its_columns() -> None:
    targets, problems = resolve_models(["writer", "critic"], USED, {}, ["writer", "judge"])
    assert targets == {"writer": "writer"}
    assert problems[0].startswith("model alias 'critic' (column(s) review, score) is served "
                                  "by no deployment (deployments: judge, writer)")
    assert '[client.models] critic = "<deployment>"' in problems[0]
    assert problems[1] == ("deployment 'judge' is used by no column of the Data Designer "
                           "config (model aliases used: critic, writer)")
    assert len(problems) == 2


def test_a_deployment_no_column_uses_is_a_problem() -> None:
    _, problems = resolve_models(["writer", "spare"], {"writer": ["story"]}, {},
                                 ["writer", "extra"])
    assert problems == ["deployment 'extra' is used by no column of the Data Designer config "
                        "(model aliases used: writer)"]


def test_a_mapping_for_an_undefined_alias_and_an_undefined_used_alias() -> None:
    _, problems = resolve_models(["writer"], {"writer": ["a"], "ghost": ["b"]},
                                 {"typo": "writer"}, ["writer"])
    assert problems == [
        "client.models.typo: the Data Designer config defines no model alias 'typo' "
        "(it has: writer)",
        "column(s) b use model alias 'ghost', which the Data Designer config does not "
        "define (model_configs: writer)",
    ]


def test_two_aliases_may_share_one_deployment() -> None:
    targets, problems = resolve_models(["a", "b"], {"a": ["x"], "b": ["y"]},
                                       {"a": "smol", "b": "smol"}, ["smol"])
    assert targets == {"a": "smol", "b": "smol"} and problems == []


def test_reserved_column_names() -> None:
    assert reserved_columns(["topic", "index", INDEX_COLUMN], "column") == [
        "column 'index': the name is reserved for synthbatch's record index",
        f"column '{INDEX_COLUMN}': the name is reserved for synthbatch's record index"]


def test_ordered_seed_rows_are_the_unsharded_runs_rows() -> None:
    whole = shard_seed_rows(0, 23, 0, 6, shuffle=False)  # 23 records, 7 seed rows: wraps
    assert whole[:9] == [0, 1, 2, 3, 4, 5, 6, 0, 1]
    shards = [(0, 8), (8, 8), (16, 7)]
    assert sum((shard_seed_rows(o, n, 0, 6, False) for o, n in shards), []) == whole


def test_seed_rows_stay_inside_the_selection() -> None:
    assert shard_seed_rows(3, 5, 10, 12, shuffle=False) == [10, 11, 12, 10, 11]
    assert shard_seed_rows(0, 2, 4, 4, shuffle=False) == [4, 4]


def test_shuffled_seed_rows_are_a_deterministic_permutation_of_the_shards_rows() -> None:
    ordered = shard_seed_rows(40, 20, 0, 99, shuffle=False)
    first = shard_seed_rows(40, 20, 0, 99, shuffle=True)
    assert first == shard_seed_rows(40, 20, 0, 99, shuffle=True)  # repeatable on resume
    assert sorted(first) == sorted(ordered) and first != ordered
    assert shard_seed_rows(60, 20, 0, 99, shuffle=True) != first


def test_selected_range() -> None:
    assert selected_range(10) == (0, 9)
    assert selected_range(10, 2, 5) == (2, 5)
    with pytest.raises(ValueError, match="has no rows"):
        selected_range(0)
    with pytest.raises(ValueError, match=r"\[3, 10\] is outside the dataset's 10 rows"):
        selected_range(10, 3, 10)


def test_row_ranges_read_each_row_once() -> None:
    assert row_ranges([5, 6, 7, 0, 1, 7, 3]) == [(0, 1), (3, 3), (5, 7)]
    assert row_ranges([]) == []


def test_missing_and_batch_targets() -> None:
    assert missing({10, 12, 99}, 10, 5) == [11, 13, 14]
    todo = [11, 13, 14, 20, 21]
    assert batch_targets(todo, 0, 2) == [11, 13]
    assert batch_targets(todo, 2, 2) == [21]
    assert batch_targets(todo, 3, 2) == []


def test_record_line_puts_the_global_index_first_and_drops_the_carrier() -> None:
    index, line = record_line({"topic": "moon", INDEX_COLUMN: 42, "story": "ok"})
    assert index == 42 and line.endswith(b"\n")
    assert line == b'{"index": 42, "topic": "moon", "story": "ok"}\n'
    assert list(json.loads(line)) == ["index", "topic", "story"]


def test_record_line_needs_the_index() -> None:
    for row in ({"topic": "x"}, {INDEX_COLUMN: "3"}, {INDEX_COLUMN: True}):
        with pytest.raises(ValueError, match=f"lost its {INDEX_COLUMN} column"):
            record_line(row)


def test_values_become_json() -> None:
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    row = {INDEX_COLUMN: 1, "nan": math.nan, "inf": -math.inf, "when": when,
           "day": datetime.date(2026, 1, 2), "raw": b"\x00\x01", "price": decimal.Decimal("1.10"),
           "nested": {"a": [1.5, math.nan, {"b": when}]}, "text": "naïve ☃"}
    _, line = record_line(row)
    assert json.loads(line) == {
        "index": 1, "nan": None, "inf": None, "when": "2026-01-02T03:04:05",
        "day": "2026-01-02", "raw": "AAE=", "price": "1.10",
        "nested": {"a": [1.5, None, {"b": "2026-01-02T03:04:05"}]}, "text": "naïve ☃"}
    assert "naïve ☃".encode() in line  # written as UTF-8, not escaped


def test_plain_leaves_json_values_alone() -> None:
    for value in (None, True, 3, 2.5, "s", [1, "a"], {"k": [None]}):
        assert plain(value) == value
    assert plain(datetime.timedelta(seconds=90)) == 90.0
    assert plain(object).startswith("<class")
