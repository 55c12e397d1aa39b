"""The sweep compiler: a benchmark file -> one ordinary run per deployment case.

A case's concurrency points are the shards of its run, each with its own fixed client
concurrency and record count; the cases of one shape are submitted as one Slurm array
(``control.runs.shared``), each still its own run. Ids are digests of what the run
will do, so compiling the same file again names the same runs (resubmission is
idempotent) and an edited case is a new run. Pure: no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from synthbatch.agent_stdlib.contracts import ShardSpec
from synthbatch.control.config.benchmark import BenchmarkConfig, Case
from synthbatch.control.errors import InvalidInput


@dataclass(frozen=True)
class CaseRun:
    """One case compiled: its run id, the run document and its sized points."""

    case: str
    run_id: str
    run: Dict[str, Any]
    shards: Tuple[ShardSpec, ...]


def digest(data: Any) -> str:
    """Eight hex digits of the canonical JSON of ``data``."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _merge(base: Dict[str, Any], case: Case, where: str) -> Dict[str, Any]:
    run = copy.deepcopy(base)
    deployments = {d.get("alias"): d for d in run.get("deployments", [])
                   if isinstance(d, dict)}
    for alias, fields in case.deployments.items():
        if alias not in deployments:
            raise InvalidInput(f"{where}.deployments.{alias}: not a deployment alias of the "
                               f"base run (have: {', '.join(map(str, deployments))})")
        deployments[alias].update(copy.deepcopy(fields))
    if case.resources:
        run["resources"] = {**run.get("resources", {}), **copy.deepcopy(case.resources)}
    return run


def points(config: BenchmarkConfig) -> List[ShardSpec]:
    """The shards of every case's run: one per concurrency value, in the file's order."""
    shards, offset = [], 0
    for index, value in enumerate(config.concurrency):
        count = config.records.at(value)
        shards.append(ShardSpec(index=index, record_offset=offset, num_records=count,
                                concurrency=value))
        offset += count
    return shards


def compile_sweep(config: BenchmarkConfig, base: Dict[str, Any]) -> Tuple[str, List[CaseRun]]:
    """The benchmark id and each case's run (``base``: the base run file's plain data)."""
    shards = points(config)
    total = sum(s.num_records for s in shards)
    runs = []
    for i, case in enumerate(config.cases):
        run = _merge(base, case, f"cases[{i}]")
        run["name"] = f"{config.name}-{case.name}"[:64]
        run["records"] = total
        run["shards"] = {"count": len(shards)}
        sizes = [(s.num_records, s.concurrency) for s in shards]
        run_id = f"{run['name']}-{digest([run, sizes])}"
        runs.append(CaseRun(case.name, run_id, run, tuple(shards)))
    bench_id = f"{config.name}-{digest([r.run_id for r in runs])}"
    return bench_id, runs
