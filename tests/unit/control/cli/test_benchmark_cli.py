"""``synthbatch benchmark``: bad input is one line naming the field or file; a benchmark
that was never run is NotFound; analyze and report work on a benchmark with no run yet."""

from __future__ import annotations

import json
from pathlib import Path

from synthbatch.control.benchmark import store
from synthbatch.control.benchmark.sweep import compile_sweep
from synthbatch.control.config.benchmark import BenchmarkConfig
from tests.fakes import QUICKSTART, invoke, run_data

BENCH = {"schema_version": 1, "name": "b", "run": str(QUICKSTART), "concurrency": [1, 2],
         "records": {"fixed": 4}, "cases": [{"name": "a"}]}


def test_a_bad_field_is_one_line_naming_file_and_field(tmp_path, profile_file) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**BENCH, "concurency": [1]}))
    result = invoke("benchmark", "run", str(path), "--profile", str(profile_file))
    assert result.exit_code != 0
    assert result.stderr.strip() == (f"synthbatch: error: {path}: concurency: unknown field "
                                     "(did you mean concurrency?)")


def test_a_missing_base_run_is_named(tmp_path, profile_file) -> None:
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({**BENCH, "run": "nope.toml"}))
    result = invoke("benchmark", "run", str(path), "--profile", str(profile_file))
    assert result.stderr.strip() == f"synthbatch: error: {path}: run: nope.toml: no such file"


def test_an_unknown_benchmark_is_not_found(profile_file) -> None:
    result = invoke("benchmark", "analyze", "nope-1", "--profile", str(profile_file), "--json")
    assert json.loads(result.stderr)["error"]["code"] == "not_found"


def test_analyze_and_report_before_any_run_name_every_point_missing(
        tmp_path, profile_file, workspace) -> None:
    bench_id, runs = compile_sweep(BenchmarkConfig.model_validate(BENCH), run_data())
    store.save(workspace, store.manifest(bench_id, BenchmarkConfig.model_validate(BENCH), runs))
    result = invoke("benchmark", "analyze", bench_id, "--profile", str(profile_file))
    assert result.exit_code == 0, result.output
    assert "(partial)" in result.stdout
    assert "missing: a @ concurrency 1: run not submitted" in result.stdout
    out = tmp_path / "rep"
    made = invoke("benchmark", "report", bench_id, "-o", str(out), "--profile",
                  str(profile_file), "--json")
    assert json.loads(made.stdout)["complete"] is False
    assert (out / "throughput.svg").read_text().startswith("<svg")
    assert isinstance(json.loads((out / "analysis.json").read_text())["points"], list)
    assert Path(out / "README.md").read_text().startswith(f"# Benchmark {bench_id}")
