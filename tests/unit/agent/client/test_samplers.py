"""Samplers and seed-row picks: functions of (seed, column, record index) only."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any, Dict

import pytest

from synthbatch.agent_stdlib.client.samplers import SAMPLERS, cell_bits, uniform
from synthbatch.agent_stdlib.client.seeds import permute, row_for
from tests.conftest import REPO


def draw(kind: str, params: Dict[str, Any], index: int, seed: int = 1,
         values: Any = None) -> Any:
    return SAMPLERS[kind](params)(cell_bits(seed, "col", index), values or {})


def test_cell_bits_depend_on_seed_column_and_index_only() -> None:
    assert cell_bits(1, "a", 5) == cell_bits(1, "a", 5)
    assert len({cell_bits(1, "a", 5), cell_bits(2, "a", 5), cell_bits(1, "b", 5),
                cell_bits(1, "a", 6)}) == 4
    bits = cell_bits(0, "x", 0)
    assert all(0.0 <= uniform(bits, k) < 1.0 for k in range(4))


SCRIPT = """
import json, sys
from synthbatch.agent_stdlib.client.samplers import SAMPLERS, cell_bits
kinds = {"category": {"values": ["a", "b", "c"], "weights": [1, 2, 3]},
         "gaussian": {"mean": 0, "stddev": 1}, "uuid": {}, "integer": {"low": 0, "high": 99},
         "datetime": {"start": "2024-01-01T00:00:00", "end": "2024-12-31T00:00:00"}}
print(json.dumps([[SAMPLERS[k](p)(cell_bits(42, k, i), {}) for k, p in kinds.items()]
                  for i in range(50)]))
"""


def test_same_seed_same_values_in_every_process() -> None:
    """Python randomizes str hashes per process; the samplers must not depend on them."""
    outs = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                              text=True, timeout=60, check=True)
        outs.add(done.stdout)
    assert len(outs) == 1


def test_category_follows_its_weights() -> None:
    counts = Counter(draw("category", {"values": ["a", "b"], "weights": [3, 1]}, i)
                     for i in range(4000))
    assert set(counts) == {"a", "b"} and 0.70 < counts["a"] / 4000 < 0.80
    plain = Counter(draw("category", {"values": [1, 2, 3, 4]}, i) for i in range(4000))
    assert set(plain) == {1, 2, 3, 4} and min(plain.values()) > 850


def test_subcategory_draws_from_the_category_value() -> None:
    params = {"category": "level", "values": {"a": ["x", "y"], "1": ["one"], "true": ["t"]}}
    assert {draw("subcategory", params, i, values={"level": "a"}) for i in range(50)} == \
        {"x", "y"}
    assert draw("subcategory", params, 0, values={"level": 1}) == "one"
    assert draw("subcategory", params, 0, values={"level": True}) == "t"


def test_numbers_stay_in_range() -> None:
    ints = {draw("integer", {"low": -2, "high": 2}, i) for i in range(500)}
    assert ints == {-2, -1, 0, 1, 2}
    floats = [draw("uniform", {"low": 1.5, "high": 2.5, "decimals": 2}, i) for i in range(500)]
    assert all(1.5 <= f <= 2.5 and round(f, 2) == f for f in floats)
    normal = [draw("gaussian", {"mean": 10, "stddev": 2}, i) for i in range(4000)]
    mean = sum(normal) / len(normal)
    assert 9.8 < mean < 10.2
    assert 1.8 < (sum((x - mean) ** 2 for x in normal) / len(normal)) ** 0.5 < 2.2
    coins = [draw("bernoulli", {"p": 0.25}, i) for i in range(4000)]
    assert all(isinstance(c, bool) for c in coins) and 0.2 < sum(coins) / 4000 < 0.3
    assert not any(draw("bernoulli", {"p": 0.0}, i) for i in range(100))


def test_uuid_is_version_4() -> None:
    values = {draw("uuid", {}, i) for i in range(100)}
    assert len(values) == 100 and all(uuid.UUID(v).version == 4 for v in values)


@pytest.mark.parametrize("unit,fmt,check", [
    ("day", None, lambda v: dt.date.fromisoformat(v)),
    ("hour", None, lambda v: dt.datetime.fromisoformat(v).minute == 0),
    ("second", "%Y/%m/%d", lambda v: v.count("/") == 2),
])
def test_datetime_in_whole_units_within_range(unit: str, fmt: Any, check: Any) -> None:
    params = {"start": "2024-01-01T00:00:00", "end": "2024-01-03T00:00:00", "unit": unit}
    if fmt:
        params["format"] = fmt
    values = [draw("datetime", params, i) for i in range(200)]
    assert all(check(v) for v in values)
    if not fmt:
        moments = [dt.datetime.fromisoformat(v) for v in values]
        assert all(dt.datetime(2024, 1, 1) <= m < dt.datetime(2024, 1, 3) for m in moments)
    if unit == "day":
        assert set(values) == {"2024-01-01", "2024-01-02"}


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 64, 1000])
def test_shuffle_is_a_permutation_per_pass(rows: int) -> None:
    first = [row_for("shuffle", 9, i, rows) for i in range(rows)]
    second = [row_for("shuffle", 9, i, rows) for i in range(rows, 2 * rows)]
    assert sorted(first) == sorted(second) == list(range(rows))
    if rows >= 64:
        assert first != list(range(rows)) and first != second
        assert [permute(p, rows, 10, 0) for p in range(rows)] != first  # the seed matters


def test_in_order_and_sample_rows() -> None:
    assert [row_for("in-order", 0, i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    picks = [row_for("sample", 5, i, 10) for i in range(500)]
    assert set(picks) == set(range(10)) and picks == [row_for("sample", 5, i, 10)
                                                      for i in range(500)]


def test_poisson_and_binomial_counts_have_their_means() -> None:
    counts = [draw("poisson", {"mean": 3.5}, i) for i in range(4000)]
    assert all(isinstance(c, int) and c >= 0 for c in counts)
    assert abs(sum(counts) / len(counts) - 3.5) < 0.15
    assert abs(sum(draw("poisson", {"mean": 2000}, i) for i in range(200)) / 200 - 2000) < 20
    trials = [draw("binomial", {"n": 10, "p": 0.3}, i) for i in range(4000)]
    assert all(0 <= t <= 10 for t in trials)
    assert abs(sum(trials) / len(trials) - 3.0) < 0.1
    assert {draw("binomial", {"n": 7, "p": 1.0}, i) for i in range(20)} == {7}
    assert {draw("binomial", {"n": 7, "p": 0.0}, i) for i in range(20)} == {0}
    assert 4500 < draw("binomial", {"n": 10_000, "p": 0.5}, 1) < 5500
