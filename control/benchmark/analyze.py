"""Analysis of a benchmark from durable state alone (works from a fresh process, on
partial results): per point boot, throughput, tokens, latency, errors, GPU-hours; the
Pareto front; the recommendation for the targets.

Per point (one shard of a case's run) the figures come from the winning (else the latest)
attempt: ``progress.json`` (generator start = endpoints ready, first record, tokens,
requests and errors per alias), ``result.json`` (records, when the shard ended) and the
records' per-request ``latency_ms`` (in ``_meta``, or top-level in the prompt template
form). Throughput is over the generator's wall time,
from its start to its last progress write (written when the last record settles); boot is
ready -> first record. GPU-hours are the allocation's GPUs x that wall time, or x the
job's elapsed time when ``sacct`` knows the job (``accounting.py``; then ``job_boot_s`` is
the job's start -> ready: the model load). The recommendation sizes jobs with the boot it
has: the job's start -> first record when ``sacct`` knows it, else ready -> first record
(and says which).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from synthbatch.agent_stdlib.contracts import Plan, ProgressRecord, ResultManifest
from synthbatch.agent_stdlib.layout import AttemptLayout, RunLayout, attempt_number
from synthbatch.agent_stdlib.resume import request_cells
from synthbatch.agent_stdlib.statefile import read_json_or_none
from synthbatch.control.planning.sizing import percentile, size
from synthbatch.control.runs.cost import attribute, part_report, per_1000
from synthbatch.control.runs.telemetry import serving_figures

ERROR_KINDS_NOT_429 = ("503", "5xx", "4xx", "timeout", "connection", "invalid_output")


def record_cells(output: Path) -> Iterator[Dict[str, Any]]:
    """Every request cell (``request_cells``) of the records in ``output``, in either
    record shape; a torn last line is skipped."""
    for path in sorted(output.glob("records-*.jsonl")):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line of a stopped execution
            yield from request_cells(record) if isinstance(record, dict) else ()


def _latencies(output: Path) -> Iterator[float]:
    """Every request's ``latency_ms`` in the records, in either record shape; a cell
    reused from an earlier run (issue 31) was no request of this one."""
    for cell in record_cells(output):
        value = cell.get("latency_ms") if "reused_from" not in cell else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            yield float(value)


def attempt_dir(layout: RunLayout, shard: int) -> Optional[Path]:
    """The winning attempt's folder of ``shard``, else its latest one's (None: none)."""
    winner = read_json_or_none(layout.winner_json(shard))
    if winner and isinstance(winner.get("attempt"), int):
        return layout.attempt(shard, winner["attempt"]).root
    folder = layout.attempts_dir(shard)
    found = sorted(n for n in map(attempt_number, _names(folder)) if n is not None)
    return layout.attempt(shard, found[-1]).root if found else None


def _names(folder: Path) -> List[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def point(layout: RunLayout, shard: int, concurrency: int, gpus: int) -> Dict[str, Any]:
    """The figures of one point; ``state`` is ``done``, ``partial`` or ``missing``."""
    row: Dict[str, Any] = {"concurrency": concurrency, "shard": shard, "gpus": gpus}
    folder = attempt_dir(layout, shard)
    raw = read_json_or_none(AttemptLayout(folder).progress_json) if folder else None
    if raw is None:
        return {**row, "state": "missing"}
    try:
        progress = ProgressRecord.from_dict(raw)
    except Exception:  # noqa: BLE001 - a damaged record is named, not raised
        return {**row, "state": "missing", "problem": "progress.json is damaged"}
    try:
        result_raw = read_json_or_none(AttemptLayout(folder).result_json)
        result = ResultManifest.from_dict(result_raw) if result_raw else None
    except Exception:  # noqa: BLE001 - a damaged result: the point is partial
        result = None
    ended = progress.updated_at  # the generator's last write, when its last record settled
    started = progress.started_at
    records = result.records if result else progress.records_done
    generated = max(0, records - progress.records_reused)  # issue 31: generated work only
    wall = (ended - started) if started is not None else None
    aliases = progress.aliases.values()
    requests = sum(a.requests for a in aliases)
    tokens_out = sum(a.tokens_out for a in aliases)
    n429 = sum(a.errors.get("429", 0) for a in aliases)
    errors = sum(a.errors.get(k, 0) for a in aliases for k in ERROR_KINDS_NOT_429)
    tried = requests + n429 + errors
    lat = list(_latencies(folder / "output"))
    attempt = read_json_or_none(AttemptLayout(folder).attempt_json) or {}
    rate = generated / wall if wall and wall > 0 else None
    row.update(serving_figures(folder, progress, ended))  # issue 32: where time goes
    return {
        **row, "state": "done" if result else "partial", "records": records,
        "job_id": attempt.get("job_id") if isinstance(attempt.get("job_id"), str) else None,
        "started_at": started,
        "boot_s": (progress.first_record_at - started
                   if started is not None and progress.first_record_at is not None else None),
        "wall_s": wall, "records_per_s": rate, "cells_reused": progress.cells_reused,
        "output_tokens_per_s": tokens_out / wall if wall and wall > 0 else None,
        "output_tokens_per_s_per_gpu": (tokens_out / wall / gpus
                                        if wall and wall > 0 and gpus else None),
        "latency_ms": {"p50": percentile(lat, 50), "p95": percentile(lat, 95),
                       "p99": percentile(lat, 99), "requests": len(lat)},
        "error_rate": errors / tried if tried else 0.0,
        "rate_429": n429 / tried if tried else 0.0,
        "gpu_hours": gpus * wall / 3600.0 if wall else None,
        "gpu_hours_per_1000": per_1000(gpus * wall / 3600.0 if wall else None, records),
        "tokens_per_1000": {"in": per_1000(sum(a.tokens_in for a in aliases), records, 1),
                            "out": per_1000(tokens_out, records, 1)},
        "tokens_by_alias": {a: [f.tokens_in, f.tokens_out]
                            for a, f in sorted(progress.aliases.items())},
        "tokens_by_column": {c: [a, t.tokens_in, t.tokens_out]
                             for a, f in sorted(progress.aliases.items())
                             for c, t in sorted(f.columns.items())},
    }


def with_job_times(row: Dict[str, Any], times: Dict[str, Any]) -> Dict[str, Any]:
    """Add sacct's view of the point's job: start -> ready (``job_boot_s``) and the job's
    wall time; GPU-hours then count the whole allocation (``gpu_hours_from``)."""
    start, end = times.get(row.get("job_id") or "", (None, None))
    if start is None or row.get("started_at") is None:
        return {**row, "job_boot_s": None, "job_wall_s": None, "gpu_hours_from": "generator"}
    out = {**row, "job_boot_s": max(0.0, row["started_at"] - start),
           "job_wall_s": (end - start) if end is not None else None}
    if out["job_wall_s"] and row.get("records"):
        out["gpu_hours"] = row["gpus"] * out["job_wall_s"] / 3600.0
        out["gpu_hours_per_1000"] = per_1000(out["gpu_hours"], row["records"])
        out["gpu_hours_from"] = "sacct"
    else:
        out["gpu_hours_from"] = "generator"
    return out


def priced(row: Dict[str, Any], price: Optional[float], currency: Optional[str],
           alias_gpus: Optional[Dict[str, int]] = None) -> Dict[str, Any]:
    """The point with ``cost_per_1000``: its GPU-hours x ``price`` per 1,000 records
    (``cost.per_1000``'s rule; None without a price or GPU-hours), ``currency``, and per
    model alias and LLM column (``aliases``, ``columns``) the figures ``status`` gives a
    run, attributed by ``cost.attribute`` (``alias_gpus``: alias -> its GPUs)."""
    hours = row.get("gpu_hours")
    records = row.get("records") or 0
    out = {**row, "currency": currency if price is not None else None,
           "cost_per_1000": per_1000(hours * price if hours is not None and
                                     price is not None else None, records)}
    if hours is not None:
        aliases, columns = attribute(hours, alias_gpus or {}, row.get("tokens_by_alias", {}),
                                     row.get("tokens_by_column", {}))
        out["aliases"] = {a: part_report(p, records, price) for a, p in aliases.items()}
        out["columns"] = {c: part_report(p, records, price) for c, p in columns.items()}
    return out


def knee(rows: List[Dict[str, Any]], share: float = 0.9) -> Optional[int]:
    """The smallest concurrency reaching ``share`` of the case's best records/s."""
    done = [r for r in rows if r.get("records_per_s")]
    if not done:
        return None
    best = max(r["records_per_s"] for r in done)
    return min(r["concurrency"] for r in done if r["records_per_s"] >= share * best)


def pareto(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Points no other point beats on both records/s (more) and GPU-hours/1000 (fewer)."""
    done = [r for r in rows  # 0 GPU-hours (a CPU deployment) is a cost like any other
            if r.get("records_per_s") and r.get("gpu_hours_per_1000") is not None]

    def beaten(r: Dict[str, Any]) -> bool:
        return any(o["records_per_s"] >= r["records_per_s"]
                   and o["gpu_hours_per_1000"] <= r["gpu_hours_per_1000"]
                   and (o["records_per_s"], o["gpu_hours_per_1000"])
                   != (r["records_per_s"], r["gpu_hours_per_1000"]) for o in done)

    return sorted((r for r in done if not beaten(r)), key=lambda r: r["gpu_hours_per_1000"])


def recommend(rows: List[Dict[str, Any]], targets: Optional[Dict[str, Any]]
              ) -> Optional[Dict[str, Any]]:
    """The feasible finished point with the fewest GPU-hours (then fewest jobs), the one
    with the fewest jobs, and every option with its reason."""
    if not targets:
        return None
    options = [size(r, targets) for r in rows if r.get("state") == "done"]
    feasible = sorted((o for o in options if o["feasible"]),
                      key=lambda o: (o["gpu_hours"], o["jobs"]))
    fewest = min(feasible, key=lambda o: (o["jobs"], o["gpu_hours"])) if feasible else None
    return {"targets": targets, "best": feasible[0] if feasible else None,
            "fewest_jobs": fewest, "options": options,
            "why": None if feasible else "no measured point meets the targets"}


def _case_rows(case: Dict[str, Any], layout: Optional[RunLayout]) -> List[Dict[str, Any]]:
    plan = read_json_or_none(layout.plan_json) if layout else None
    gpus = 0
    alias_gpus: Dict[str, int] = {}
    if plan is not None:
        decoded = Plan.from_dict(plan)
        gpus = decoded.resources.gpus * decoded.resources.nodes
        alias_gpus = {d.alias: d.replicas * d.gpus_per_replica for d in decoded.deployments}
    rows = []
    for p in case["points"]:
        row = ({"concurrency": p["concurrency"], "shard": p["shard"], "gpus": gpus,
                "state": "missing", "problem": "run not submitted"} if layout is None
               else point(layout, p["shard"], p["concurrency"], gpus))
        rows.append({"case": case["case"], "run_id": case["run_id"], **row,
                     "deployment_gpus": alias_gpus})
    return rows


def analyze(manifest: Dict[str, Any], layouts: Dict[str, Optional[RunLayout]],
            job_times: Optional[Callable[[List[str]], Dict[str, Any]]] = None,
            prices: Optional[Dict[str, Tuple[Optional[float], Optional[str]]]] = None
            ) -> Dict[str, Any]:
    """Every point of every case, the missing ones named, the knee per case, the Pareto
    front and the recommendation (``layouts``: run id -> its layout, None if absent;
    ``job_times``: job ids -> their sacct start and end, when the cluster has them;
    ``prices``: run id -> (price of a GPU-hour, currency), ``cost.run_price``)."""
    by_case = [(case, _case_rows(case, layouts.get(case["run_id"])))
               for case in manifest["cases"]]
    ids = [r["job_id"] for _, rows in by_case for r in rows if r.get("job_id")]
    times = job_times(ids) if job_times and ids else {}
    rows, missing, cases = [], [], []
    for case, found in by_case:
        price, currency = (prices or {}).get(case["run_id"], (None, None))
        case_rows = [priced(with_job_times(r, times), price, currency, r["deployment_gpus"])
                     if r["state"] != "missing" else r for r in found]
        for row in case_rows:
            if row["state"] != "done":
                missing.append(f"{case['case']} @ concurrency {row['concurrency']}: "
                               f"{row.get('problem') or row['state']}")
        rows.extend(case_rows)
        best = max((r for r in case_rows if r.get("records_per_s")),
                   key=lambda r: r["records_per_s"], default=None)
        cases.append({"case": case["case"], "run_id": case["run_id"],
                      "gpus": case_rows[0]["gpus"] if case_rows else 0,
                      "knee_concurrency": knee(case_rows),
                      "best_records_per_s": best["records_per_s"] if best else None})
    ranking = sorted((c for c in cases if c["best_records_per_s"]),
                     key=lambda c: -c["best_records_per_s"])
    return {"benchmark_id": manifest["benchmark_id"], "name": manifest["name"],
            "complete": not missing, "missing": missing, "cases": cases,
            "ranking": [c["case"] for c in ranking], "points": rows,
            "pareto": [{"case": r["case"], "concurrency": r["concurrency"],
                        "records_per_s": r["records_per_s"],
                        "gpu_hours_per_1000": r["gpu_hours_per_1000"]} for r in pareto(rows)],
            "recommendation": recommend(rows, manifest.get("targets"))}
