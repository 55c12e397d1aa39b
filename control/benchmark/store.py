"""A benchmark's durable state: ``<workspace>/benchmarks/<id>/benchmark.json`` (the compiled
sweep: cases, their run ids and points, the targets) and each case's run file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from synthbatch.agent_stdlib.layout import benchmarks_root
from synthbatch.agent_stdlib.statefile import StateError, ensure_dir, read_json, write_json_atomic
from synthbatch.control.benchmark.sweep import CaseRun
from synthbatch.control.config.benchmark import BenchmarkConfig
from synthbatch.control.errors import InvalidInput, NotFound
from synthbatch.control.runs.store import RUN_ID


def bench_dir(workspace: Path, bench_id: str) -> Path:
    """The folder of one benchmark."""
    if not RUN_ID.match(bench_id):
        raise InvalidInput(f"benchmark id {bench_id!r}: not a valid benchmark id")
    return benchmarks_root(workspace) / bench_id


def manifest(bench_id: str, config: BenchmarkConfig, runs: List[CaseRun]) -> Dict[str, Any]:
    """What analysis needs, without the benchmark file."""
    return {"benchmark_id": bench_id, "name": config.name,
            "targets": config.targets.model_dump() if config.targets else None,
            "cases": [{"case": r.case, "run_id": r.run_id,
                       "points": [{"shard": s.index, "concurrency": s.concurrency,
                                   "records": s.num_records} for s in r.shards]}
                      for r in runs]}


def save(workspace: Path, data: Dict[str, Any]) -> Path:
    """Write the manifest (the same content for the same file: rewriting is harmless)."""
    folder = ensure_dir(bench_dir(workspace, data["benchmark_id"]))
    write_json_atomic(folder / "benchmark.json", data)
    return folder


def load(workspace: Path, bench_id: str) -> Dict[str, Any]:
    """The manifest of ``bench_id``; NotFound or InvalidInput in one line."""
    path = bench_dir(workspace, bench_id) / "benchmark.json"
    try:
        data = read_json(path)
    except StateError as err:
        raise InvalidInput(f"unreadable: {err}") from None
    if data is None:
        raise NotFound(f"benchmark {bench_id}: no such benchmark in "
                       f"{benchmarks_root(workspace)}")
    if not isinstance(data.get("cases"), list):
        raise InvalidInput(f"{path}: not a benchmark record")
    return data


def case_file(base_run: Path, run_id: str, run: Dict[str, Any]) -> Path:
    """The case's run file, beside the base run (its ``{config_dir}`` and relative paths
    mean the same)."""
    path = base_run.parent / f".synthbatch-bench-{run_id}.json"
    write_json_atomic(path, run)
    return path
