"""Analysis from durable state: figures per point, partial and missing points named, the
knee, the Pareto front, the recommendation; the report's SVG charts."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Dict

import pytest

from synthbatch.control.benchmark.accounting import parse_times
from synthbatch.control.benchmark.analyze import analyze, pareto, percentile, recommend
from synthbatch.control.benchmark.report import charts, text, write
from tests.fakes import NOW, RUN_ID, Shard, fill, make_run, template_line

SVG = "{http://www.w3.org/2000/svg}"


MANIFEST: Dict[str, Any] = {
    "benchmark_id": "b-1", "name": "b",
    "targets": {"records": 35_000, "deadline_hours": 1.0, "max_jobs": None},
    "cases": [{"case": "one", "run_id": RUN_ID, "points": [
        {"shard": 0, "concurrency": 1, "records": 10},
        {"shard": 1, "concurrency": 2, "records": 10},
        {"shard": 2, "concurrency": 4, "records": 10}]},
        {"case": "absent", "run_id": "absent-run", "points": [
            {"shard": 0, "concurrency": 1, "records": 10}]}],
}


def analysis(tmp_path: Path) -> Dict[str, Any]:
    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("winner"), Shard("running")])
    fill(layout, 0, 10, 10.0, [100.0] * 10)             # 1 record/s
    fill(layout, 1, 10, 5.0, [100.0 + i for i in range(10)], errors={"429": 10})
    fill(layout, 2, 4, 2.0, [200.0] * 4, done=False)     # partial: still running
    return analyze(MANIFEST, {RUN_ID: layout, "absent-run": None})


def test_points_from_durable_state_with_partial_and_missing_ones_named(tmp_path) -> None:
    data = analysis(tmp_path)
    rows = {(r["case"], r["concurrency"]): r for r in data["points"]}
    first, second, third = rows["one", 1], rows["one", 2], rows["one", 4]
    assert first["state"] == "done" and first["records_per_s"] == 1.0
    assert first["boot_s"] == 0.5 and first["output_tokens_per_s"] == 10.0
    gpus = first["gpus"]
    assert gpus >= 1 and first["output_tokens_per_s_per_gpu"] == 10.0 / gpus
    assert first["gpu_hours_per_1000"] == round(gpus * 10.0 / 3600 / 10 * 1000, 4)  # cost's rule
    assert first["tokens_per_1000"]["out"] == 10 * 1000.0  # 10 completion tokens a record
    assert second["records_per_s"] == 2.0 and second["rate_429"] == 0.5
    assert second["latency_ms"] == {"p50": 104.5, "p95": 108.55, "p99": 108.91,
                                    "requests": 10}
    assert third["state"] == "partial" and third["records"] == 4
    assert rows["absent", 1]["state"] == "missing"
    assert not data["complete"]
    assert data["missing"] == ["one @ concurrency 4: partial",
                               "absent @ concurrency 1: run not submitted"]
    assert data["cases"][0]["knee_concurrency"] == 2  # 2 records/s at 2 and at 4
    assert data["ranking"] == ["one"]
    front = [(p["case"], p["concurrency"]) for p in data["pareto"]]
    assert ("one", 1) not in front and ("one", 2) in front


def test_the_recommendation_sizes_jobs_and_says_why(tmp_path) -> None:
    data = analysis(tmp_path)
    best = data["recommendation"]["best"]
    # 35,000 records in 1 h at 2 records/s (0.5 s boot): 5 jobs; the partial point is no option
    assert (best["case"], best["concurrency"], best["jobs"]) == ("one", 2, 5)
    assert best["feasible"] and "5 job(s)" in best["why"]
    assert [(o["case"], o["concurrency"]) for o in data["recommendation"]["options"]] == [
        ("one", 1), ("one", 2)]
    capped = recommend(data["points"], {**MANIFEST["targets"], "max_jobs": 2})
    assert capped["best"] is None and capped["why"] == "no measured point meets the targets"
    assert {o["why"] for o in capped["options"]} >= {"needs 5 jobs, more than max_jobs 2"}
    assert "not feasible" in text({**data, "recommendation": capped})


def test_charts_are_well_formed_svg_with_a_series_per_case(tmp_path) -> None:
    data = analysis(tmp_path)
    made = charts(data)
    assert set(made) == {"throughput.svg", "latency.svg", "pareto.svg"}
    for name, svg in made.items():
        root = ET.fromstring(svg)
        assert root.tag == f"{SVG}svg"
        series = [g.get("data-series") for g in root.iter(f"{SVG}g")]
        assert {s.split(" ")[0] for s in series} >= {"one", "absent"}, (name, series)
    throughput = ET.fromstring(made["throughput.svg"])
    line = next(g for g in throughput.iter(f"{SVG}g") if g.get("data-series") == "one")
    assert len(line.findall(f"{SVG}circle")) == 3 + 1  # three points and the legend's
    files = write(data, tmp_path / "report")
    assert sorted(Path(f).name for f in files) == [
        "README.md", "analysis.json", "latency.svg", "pareto.svg", "throughput.svg"]
    assert "**Partial results.**" in (tmp_path / "report" / "README.md").read_text()


def test_a_series_name_from_a_case_is_escaped() -> None:
    data = {"cases": [{"case": "a<b&\"c"}], "points": [], "pareto": []}
    ET.fromstring(charts(data)["throughput.svg"])  # well-formed despite the name


def test_percentiles_interpolate() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == 1.99


def test_a_cpu_deployment_costs_no_gpu_hours_and_is_still_on_the_front() -> None:
    """The llama.cpp 2 x 2 sweep on the testbed runs on CPUs: 0 GPUs (failed: empty front)."""
    rows = [{"case": "a", "concurrency": 1, "records_per_s": 2.0, "gpu_hours_per_1000": 0.0},
            {"case": "a", "concurrency": 2, "records_per_s": 3.0, "gpu_hours_per_1000": 0.0}]
    assert [r["concurrency"] for r in pareto(rows)] == [2]


def test_sacct_times_add_the_jobs_boot_and_count_the_whole_allocation(tmp_path) -> None:
    """With accounting, boot starts at the job's start and GPU-hours cover the job."""
    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("winner"), Shard("running")])
    for shard, seconds in ((0, 10.0), (1, 5.0), (2, 2.0)):
        fill(layout, shard, 10, seconds, [100.0], done=shard != 2)
    asked = []

    def times(ids):
        asked.append(sorted(ids))
        return {"500_0": (NOW - 4.0, NOW + 16.0)}  # started 4 s before ready, 20 s in all

    data = analyze({**MANIFEST, "cases": MANIFEST["cases"][:1]}, {RUN_ID: layout}, times)
    assert asked == [["500_0", "500_1", "500_2"]]
    first, second = data["points"][0], data["points"][1]
    assert (first["job_boot_s"], first["job_wall_s"], first["gpu_hours_from"]) == \
        (4.0, 20.0, "sacct")
    assert first["gpu_hours_per_1000"] == round(first["gpus"] * 20.0 / 3600 / 10 * 1000, 4)
    assert (second["job_boot_s"], second["gpu_hours_from"]) == (None, "generator")


def test_sacct_lines_parse_and_unknown_times_are_none() -> None:
    got = parse_times("1640_0|2026-12-01T13:24:07|2026-12-01T13:24:15\n"
                      "1640_1|2026-12-01T13:24:07|Unknown\nbad line\n")
    assert got["1640_0"][1] - got["1640_0"][0] == 8.0 and got["1640_1"][1] is None
    assert set(got) == {"1640_0", "1640_1"}


def test_job_times_on_the_local_backend_are_empty_not_a_crash(tmp_path) -> None:
    """The local backend has no sacct (its scheduler has no ``query``): analyze then has
    no job times, as on a cluster without accounting (it raised AttributeError)."""
    from synthbatch.control.backends.local.scheduler import LocalScheduler
    from synthbatch.control.benchmark.accounting import job_times

    assert not hasattr(LocalScheduler, "query")
    assert job_times(object(), ["12_0"]) == {}


def test_a_prompt_template_sweep_reports_latency(tmp_path) -> None:
    """The prompt template form keeps its request's ``latency_ms`` top-level (was: only
    ``_meta.columns`` was read, so such a sweep had null percentiles and an empty chart)."""
    layout = make_run(tmp_path / "ws", [Shard("winner")])
    fill(layout, 0, 4, 2.0, [100.0, 200.0, 300.0, 400.0], shape=template_line)
    manifest = {**MANIFEST, "cases": [{**MANIFEST["cases"][0],
                                       "points": MANIFEST["cases"][0]["points"][:1]}]}
    row = analyze(manifest, {RUN_ID: layout})["points"][0]
    assert row["latency_ms"] == {"p50": 250.0, "p95": 385.0, "p99": 397.0, "requests": 4}
    latency = ET.fromstring(charts(analyze(manifest, {RUN_ID: layout}))["latency.svg"])
    line = next(g for g in latency.iter(f"{SVG}g") if g.get("data-series", "").startswith("one"))
    assert line.findall(f"{SVG}circle")


def test_the_recommendation_sizes_jobs_with_the_measured_model_load(tmp_path) -> None:
    """sacct saw 44 s from the job's start to ready (the model load): a job pays it before
    its first record, so 300 records at 1 record/s within 180 s need 3 jobs, not 2."""
    layout = make_run(tmp_path / "ws", [Shard("winner")])
    fill(layout, 0, 10, 10.0, [100.0])  # 1 record/s, 0.5 s ready -> first record
    manifest = {**MANIFEST, "targets": {"records": 300, "deadline_hours": 0.05,
                                        "max_jobs": None},
                "cases": [{**MANIFEST["cases"][0],
                           "points": MANIFEST["cases"][0]["points"][:1]}]}
    data = analyze(manifest, {RUN_ID: layout}, lambda ids: {"500_0": (NOW - 44.0, NOW + 10.0)})
    best = data["recommendation"]["best"]
    assert (best["jobs"], best["boot_s"], best["boot_from"]) == (3, 44.5, "sacct")
    assert best["wall_hours"] * 3600 == pytest.approx(44.5 + 100.0)
    assert "boot 44 s: job start -> first record" in best["why"]
    assert "model load included (sacct)" in text(data)
    unknown = analyze(manifest, {RUN_ID: layout}, lambda ids: {})
    best = unknown["recommendation"]["best"]
    assert (best["jobs"], best["boot_s"], best["boot_from"]) == (2, 0.5, "generator")
    assert "model load is not measured" in best["why"]


def test_reused_records_and_cells_are_no_generated_work(tmp_path) -> None:
    """Issue 31: records every cell of which was reused leave records/s, and a reused
    cell's latency (the earlier run's request) is not this point's."""
    import json

    from synthbatch.agent_stdlib.statefile import write_json_atomic
    from synthbatch.control.benchmark.analyze import point

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    fill(layout, 0, 10, 10.0, [100.0] * 10)
    paths = layout.attempt(0, 1)
    progress = json.loads(paths.progress_json.read_text())
    write_json_atomic(paths.progress_json, {**progress, "records_reused": 6,
                                            "cells_reused": 6})
    out = paths.output / "records-000000000000.jsonl"
    lines = out.read_text().splitlines()[:-1]
    reused = [json.dumps({"index": i, "_meta": {"columns": {"text": {
        "latency_ms": 900.0, "reused_from": "old"}}}}) for i in range(10, 16)]
    out.write_text("\n".join(lines + reused) + "\n")
    row = point(layout, 0, 1, 1)
    assert row["records_per_s"] == 0.4 and row["cells_reused"] == 6  # 4 generated in 10 s
    assert row["latency_ms"]["requests"] == 10 and row["latency_ms"]["p99"] == 100.0


def test_points_say_where_time_went_from_the_agents_telemetry(tmp_path) -> None:
    """Issue 32: a point's ``time`` (servers ready, first record, generation, shutdown)
    from the attempt's telemetry.json; none of it without one."""
    import json

    from synthbatch.agent_stdlib.contracts import TelemetryRecord
    from synthbatch.agent_stdlib.statefile import write_bytes_atomic

    layout = make_run(tmp_path / "ws", [Shard("winner"), Shard("winner")])
    fill(layout, 0, 10, 10.0, [100.0] * 10)
    fill(layout, 1, 10, 10.0, [100.0] * 10)
    progress = layout.attempt(0, 1).progress_json
    first_record = json.loads(progress.read_text())["first_record_at"]
    record = TelemetryRecord(interval_s=5.0, updated_at=0.0, started_at=first_record - 30.0,
                             ready_at=first_record - 2.0, stopping_at=first_record + 20.0,
                             stopped_at=first_record + 23.0)
    write_bytes_atomic(layout.attempt(0, 1).telemetry_json, record.to_json().encode())
    manifest = {**MANIFEST, "cases": [{"case": "one", "run_id": RUN_ID, "points": [
        {"shard": 0, "concurrency": 1, "records": 10},
        {"shard": 1, "concurrency": 2, "records": 10}]}]}
    rows = {r["concurrency"]: r for r in analyze(manifest, {RUN_ID: layout})["points"]}
    assert rows[1]["time"] == {"queue_s": None, "servers_s": 28.0, "first_record_s": 2.0,
                               "generation_s": 20.0, "shutdown_s": 3.0}
    assert rows[2]["time"]["servers_s"] is None and rows[2]["latency_split"] == []


def test_points_are_priced_per_1000_records_as_status_prices_a_run(tmp_path) -> None:
    """Issue 32: a point's cost per 1,000 records is its GPU-hours x the run's price per
    GPU-hour (``cost.run_price``: the profile's price of the run's partition), by the
    one per-1,000 rule; without a price it is unknown, never 0."""
    from synthbatch.control.runs.cost import run_price

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    fill(layout, 0, 10, 10.0, [100.0] * 10)
    manifest = {**MANIFEST, "cases": [{"case": "one", "run_id": RUN_ID, "points": [
        {"shard": 0, "concurrency": 1, "records": 10}]}]}
    profile = tmp_path / "p.toml"
    profile.write_text("schema_version = 1\nworkspace = '/x'\n[pricing]\nper_gpu_hour = 2.5\n"
                       "currency = 'EUR'\n")
    price = run_price(layout, profile)
    assert price == (2.5, "EUR")
    (point,) = analyze(manifest, {RUN_ID: layout}, prices={RUN_ID: price})["points"]
    hours = point["gpus"] * 10.0 / 3600  # 10 s of the generator's wall time
    assert point["gpu_hours"] == hours
    assert point["cost_per_1000"] == round(hours * 2.5 * 1000 / 10, 4)
    assert point["currency"] == "EUR"
    (unpriced,) = analyze(manifest, {RUN_ID: layout})["points"]
    assert (unpriced["cost_per_1000"], unpriced["currency"]) == (None, None)
    assert "cost/1k" in text({**analyze(manifest, {RUN_ID: layout}, prices={RUN_ID: price}),
                              "recommendation": None})


def test_a_points_cost_is_split_per_alias_and_column_as_status_splits_a_runs(tmp_path) -> None:
    """Per model alias and per LLM column, a point gets the figures status gives a run
    (``cost.attribute``: the alias's share of the GPUs, a column's share of its alias's
    tokens): one alias holds every GPU; draft has 3/4 of its tokens, title 1/4."""
    from synthbatch.agent_stdlib.contracts import (
        AliasProgress,
        ColumnTokens,
        Plan,
        ProgressRecord,
    )
    from synthbatch.agent_stdlib.statefile import read_json, write_json_atomic

    layout = make_run(tmp_path / "ws", [Shard("winner")])
    fill(layout, 0, 10, 10.0, [100.0] * 10)
    (alias,) = [d.alias for d in Plan.from_dict(read_json(layout.plan_json)).deployments]
    progress = ProgressRecord.from_dict(read_json(layout.attempt(0, 1).progress_json))
    columns = {"draft": ColumnTokens(10, 200, 100), "title": ColumnTokens(10, 50, 50)}
    write_json_atomic(layout.attempt(0, 1).progress_json, ProgressRecord(**{
        **progress.__dict__, "aliases": {alias: AliasProgress(
            requests=20, tokens_in=250, tokens_out=150, columns=columns)}}).to_dict())
    manifest = {**MANIFEST, "cases": [{"case": "one", "run_id": RUN_ID, "points": [
        {"shard": 0, "concurrency": 1, "records": 10}]}]}
    (point,) = analyze(manifest, {RUN_ID: layout}, prices={RUN_ID: (2.0, "$")})["points"]
    hours = point["gpu_hours"]
    assert hours and point["deployment_gpus"][alias] > 0
    assert point["aliases"][alias]["per_1000_records"] == {
        "gpu_hours": round(hours * 100, 4), "cost": round(hours * 2.0 * 100, 4),
        "tokens_in": 25000.0, "tokens_out": 15000.0}
    draft, title = point["columns"]["draft"], point["columns"]["title"]
    assert (draft["alias"], draft["gpu_hours"]) == (alias, round(hours * 0.75, 4))
    assert title["per_1000_records"]["cost"] == round(hours * 0.25 * 2.0 * 100, 4)
