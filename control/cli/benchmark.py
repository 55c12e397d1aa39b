"""``synthbatch benchmark run|analyze|report``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from synthbatch.control.cli.common import common, group_json


@click.group("benchmark")
@group_json
def benchmark_group() -> None:
    """Size a run before spending the GPU budget: sweeps, analysis, a report."""


@benchmark_group.command("run")
@click.argument("bench_file", type=click.Path(path_type=Path, dir_okay=False))
@common
def run_cmd(bench_file: Path, profile: Optional[str]) -> Any:
    """Submit each case of BENCH_FILE not submitted yet; print the benchmark id."""
    from synthbatch.control import api

    data = api.benchmark_run(bench_file, profile)
    lines = [f"benchmark {data['benchmark_id']}"] + [
        f"  {c['case']}: {c['run_id']} "
        + (f"submitted (job {', '.join(c['job_ids'])}"
           + (f", one array with {', '.join(c['shared_with'])}" if c["shared_with"] else "")
           + ")" if c["submitted"] else "already submitted")
        for c in data["cases"]]
    return {"data": data, "text": "\n".join(lines)}


@benchmark_group.command("analyze")
@click.argument("bench_id")
@common
def analyze_cmd(bench_id: str, profile: Optional[str]) -> Any:
    """Figures per case and concurrency, the Pareto front and the recommendation."""
    from synthbatch.control import api
    from synthbatch.control.readapi import report_text as text

    data = api.benchmark_analyze(bench_id, profile)
    return {"data": data, "text": text(data)}


@benchmark_group.command("report")
@click.argument("bench_id")
@click.option("--output", "-o", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Report directory (default: the benchmark's report/).")
@common
def report_cmd(bench_id: str, output: Optional[Path], profile: Optional[str]) -> Any:
    """Write a self-contained report directory: Markdown and SVG charts."""
    from synthbatch.control import api

    data = api.benchmark_report(bench_id, output, profile)
    note = "" if data["complete"] else " (partial: " + "; ".join(data["missing"]) + ")"
    return {"data": data, "text": f"report in {data['report_dir']}{note}"}
