"""The benchmark file and its compilation: strict fields, deterministic ids, sized points."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.control.benchmark.sweep import compile_sweep
from synthbatch.control.config.benchmark import BenchmarkConfig
from synthbatch.control.config.loader import load_model
from synthbatch.control.errors import InvalidInput
from tests.fakes import run_data, write_json

BENCH: Dict[str, Any] = {
    "schema_version": 1, "name": "sizing", "run": "run.toml", "concurrency": [1, 4, 16],
    "records": {"per_concurrency": 10},
    "targets": {"records": 1_000_000, "deadline_hours": 12},
    "cases": [{"name": "tp1", "deployments": {}},
              {"name": "more", "resources": {"cpus": 4}}],
}


def bench(**changes: Any) -> Dict[str, Any]:
    data = copy.deepcopy(BENCH)
    data.update(changes)
    return data


@pytest.mark.parametrize("changes, message", [
    ({"sweep": 1}, "sweep: unknown field"),
    ({"concurrency": [1, 0]}, "concurrency[1]: 0 is not in 1..4096"),
    ({"concurrency": [2, 2]}, "concurrency: a value is given twice"),
    ({"records": {"fixed": 5, "per_concurrency": 2}},
     "records: give exactly one of fixed or per_concurrency"),
    ({"targets": {"records": 10, "deadline_hours": 0}}, "targets.deadline_hours:"),
    ({"cases": [{"name": "a"}, {"name": "a"}]}, "cases: name 'a' is used twice"),
    ({"cases": [{"name": "a", "gpus": 2}]}, "cases[0].gpus: unknown field"),
])
def test_a_bad_benchmark_file_is_one_line_naming_the_field(tmp_path: Path, changes, message):
    with pytest.raises(InvalidInput) as err:
        load_model(write_json(tmp_path, bench(**changes), "bench.json"), BenchmarkConfig)
    assert message in err.value.message and "\n" not in err.value.message


def compiled(data: Dict[str, Any], base: Dict[str, Any]):
    return compile_sweep(BenchmarkConfig.model_validate(data), base)


def test_ids_are_deterministic_and_an_edited_case_is_a_new_run() -> None:
    bench_id, runs = compiled(BENCH, run_data())
    again_id, again = compiled(copy.deepcopy(BENCH), run_data())
    assert (bench_id, [r.run_id for r in runs]) == (again_id, [r.run_id for r in again])
    edited = bench(cases=[BENCH["cases"][0], {"name": "more", "resources": {"cpus": 8}}])
    other_id, other = compiled(edited, run_data())
    assert other[0].run_id == runs[0].run_id and other[1].run_id != runs[1].run_id
    assert other_id != bench_id


def test_a_cases_points_are_the_shards_of_its_run() -> None:
    _, runs = compiled(BENCH, run_data())
    shards = runs[0].shards
    assert [(s.index, s.record_offset, s.num_records, s.concurrency) for s in shards] == [
        (0, 0, 10, 1), (1, 10, 40, 4), (2, 50, 160, 16)]
    assert runs[0].run["records"] == 210 and runs[0].run["shards"] == {"count": 3}
    assert runs[1].run["resources"]["cpus"] == 4
    fixed = compiled(bench(records={"fixed": 7}), run_data())[1][0]
    assert [s.num_records for s in fixed.shards] == [7, 7, 7]


def test_a_case_naming_an_alias_the_base_run_lacks_is_named() -> None:
    base = run_data()
    alias = base["deployments"][0]["alias"]
    data = bench(cases=[{"name": "x", "deployments": {"nope": {"gpus": 2}}}])
    with pytest.raises(InvalidInput) as err:
        compiled(data, base)
    assert err.value.message == (f"cases[0].deployments.nope: not a deployment alias of the "
                                 f"base run (have: {alias})")
    _, runs = compiled(bench(cases=[{"name": "x", "deployments": {alias: {"gpus": 2}}}]), base)
    assert runs[0].run["deployments"][0]["gpus"] == 2
    assert base == run_data()  # the base run is not changed by a case
