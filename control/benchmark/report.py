"""The report of an analysis: a terminal table, and a self-contained directory (Markdown
plus SVG charts: throughput vs concurrency per case, latency percentiles, the Pareto
front)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from synthbatch.agent_stdlib.statefile import ensure_dir, write_bytes_atomic
from synthbatch.control.benchmark.svg import Series, chart, colour, optional_points

COLUMNS = (("case", "case"), ("conc", "concurrency"), ("state", "state"),
           ("records", "records"), ("job boot s", "job_boot_s"), ("boot s", "boot_s"),
           ("rec/s", "records_per_s"),
           ("tok/s", "output_tokens_per_s"), ("tok/s/GPU", "output_tokens_per_s_per_gpu"),
           ("p50 ms", "p50"), ("p95 ms", "p95"), ("p99 ms", "p99"), ("err", "error_rate"),
           ("429", "rate_429"), ("GPU-h/1k", "gpu_hours_per_1000"), ("cost/1k", "cost_per_1000"))


def _cell(row: Dict[str, Any], key: str) -> str:
    value = row.get("latency_ms", {}).get(key) if key in ("p50", "p95", "p99") \
        else row.get(key)
    if value is None:
        return "-"
    if key in ("error_rate", "rate_429"):
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: List[Dict[str, Any]]) -> List[List[str]]:
    """Header and one line of cells per point."""
    return [[h for h, _ in COLUMNS]] + [[_cell(r, k) for _, k in COLUMNS] for r in rows]


def _aligned(cells: List[List[str]]) -> List[str]:
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in cells]


def _recommendation(data: Dict[str, Any]) -> List[str]:
    rec = data.get("recommendation")
    if not rec:
        return ["no targets: add [targets] records and deadline_hours for a recommendation"]
    t = rec["targets"]
    head = f"targets: {t['records']} records in {t['deadline_hours']:g} h"
    best = rec["best"]
    if best is None:
        return [head, f"not feasible: {rec['why']}"] + [
            f"  {o['case']} @ {o['concurrency']}: {o['why']}" for o in rec["options"]]
    lines = [head, f"recommended: {best['case']} at concurrency {best['concurrency']}: "
             f"{best['jobs']} job(s), {best['wall_hours']:.2f} h wall, "
             f"{best['gpu_hours']:.2f} GPU-hours (feasible: {best['why']})"]
    few = rec["fewest_jobs"]
    if few and (few["case"], few["concurrency"]) != (best["case"], best["concurrency"]):
        lines.append(f"fewest jobs: {few['case']} at concurrency {few['concurrency']}: "
                     f"{few['jobs']} job(s), {few['gpu_hours']:.2f} GPU-hours")
    return lines


def text(data: Dict[str, Any]) -> str:
    """The terminal report."""
    lines = [f"benchmark {data['benchmark_id']}"
             + ("" if data["complete"] else " (partial)"), ""]
    lines += _aligned(table(data["points"]))
    lines.append("")
    for c in data["cases"]:
        lines.append(f"{c['case']}: best {_cell(c, 'best_records_per_s')} records/s, knee at "
                     f"concurrency {c['knee_concurrency'] or '-'} ({c['gpus']} GPU(s))")
    lines.append("pareto front: " + (", ".join(
        f"{p['case']} @ {p['concurrency']}" for p in data["pareto"]) or "-"))
    if data["missing"]:
        lines.append("missing: " + "; ".join(data["missing"]))
    return "\n".join(lines + _recommendation(data))


def charts(data: Dict[str, Any]) -> Dict[str, str]:
    """File name -> SVG text of each chart."""
    names = [c["case"] for c in data["cases"]]
    by_case = {n: [r for r in data["points"] if r["case"] == n] for n in names}
    throughput = [Series(n, optional_points(by_case[n], "concurrency", "records_per_s"),
                         colour(i)) for i, n in enumerate(names)]
    latency = []
    for i, n in enumerate(names):
        for q, dash in (("p50", False), ("p99", True)):
            latency.append(Series(f"{n} {q}", optional_points(
                by_case[n], "concurrency", "latency_ms", q), colour(i), dash=dash))
    front = [Series(n, optional_points(by_case[n], "gpu_hours_per_1000", "records_per_s"),
                    colour(i), line=False) for i, n in enumerate(names)]
    front.append(Series("Pareto front", [(p["gpu_hours_per_1000"], p["records_per_s"])
                                         for p in data["pareto"]], "#444444", dash=True,
                        ring=True))
    return {
        "throughput.svg": chart("Throughput vs client concurrency", "client concurrency",
                                "records/s", throughput, log2_x=True),
        "latency.svg": chart("Request latency (p50 solid, p99 dashed)", "client concurrency",
                             "latency, ms", latency, log2_x=True),
        "pareto.svg": chart("Throughput vs cost", "GPU-hours per 1,000 records", "records/s",
                            front),
    }


def markdown(data: Dict[str, Any]) -> str:
    """The report's README.md, linking the charts beside it."""
    cells = table(data["points"])
    md = [f"# Benchmark {data['benchmark_id']}", ""]
    if data["missing"]:
        md += ["**Partial results.** Missing: " + "; ".join(data["missing"]), ""]
    md += ["## Recommendation", ""] + [f"- {line}" for line in _recommendation(data)] + [""]
    md += ["## Points", "", "| " + " | ".join(cells[0]) + " |",
           "|" + "---|" * len(cells[0])] + ["| " + " | ".join(c) + " |" for c in cells[1:]]
    md += ["", "## Cases", ""] + [
        f"- {c['case']} (`{c['run_id']}`, {c['gpus']} GPU(s)): knee at concurrency "
        f"{c['knee_concurrency'] or '-'}" for c in data["cases"]]
    md += ["", "## Charts", "", "![throughput](throughput.svg)", "",
           "![latency](latency.svg)", "", "![pareto](pareto.svg)", ""]
    return "\n".join(md)


def write(data: Dict[str, Any], folder: Path, extra: Optional[Dict[str, bytes]] = None
          ) -> List[str]:
    """Write README.md, analysis.json and the charts into ``folder``; the files written."""
    ensure_dir(folder)
    files = {"README.md": markdown(data).encode("utf-8"),
             "analysis.json": json.dumps(data, indent=2, sort_keys=True).encode("utf-8"),
             **{name: svg.encode("utf-8") for name, svg in charts(data).items()},
             **(extra or {})}
    for name, payload in files.items():
        write_bytes_atomic(folder / name, payload)
    return sorted(str(folder / n) for n in files)
