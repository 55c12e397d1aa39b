"""``merge --format parquet`` of 100,000 generator records against pyarrow writing the same
table directly, and the memory each holds.

    python benchmarks/merge_parquet.py [--records 100000] [--shards 20] [--rounds 3]

A run directory of ``--shards`` verified winners holds ``--records`` records shaped as the
built-in generator writes them (index, a seed field, a category, an integer, a float,
llm-text, a structured column, a judge, ``_meta`` with usage). Each measure runs in its own
process (so its peak RSS is its own), rounds alternate, best of ``--rounds``:

* ``direct``: pyarrow alone: ``pyarrow.json.read_json`` of the same records (one file, the
  shards concatenated beforehand, untimed) and ``pyarrow.parquet.write_table``: the whole
  table in memory, schema inferred, no digest;
* ``merge``: ``merge_run(fmt="parquet")``: schema pass, verified conversion, several files,
  the card with its column statistics (the default);
* ``merge --no-stats``: the same without the statistics;
* ``jsonl``, ``jsonl+stats``: the jsonl merge without and with the card's statistics pass.

Memory: peak RSS minus the RSS after imports (the process's working memory), beside one
row group's in-memory size (the table of one ``parquet.CHUNK`` of JSONL). Then ``merge``
once more on twice the records in twice the shards (the same shard files): the bound is
that working memory depends on the chunk, not on the number of records. The goals: merge
>= 0.5 of direct's speed; working memory at 2x the records <= 1.15x that at 1x.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_run(root: Path, records: int, shards: int) -> Path:
    from synthbatch.agent_stdlib.contracts import (
        ColumnSpec,
        FileEntry,
        GenerateSpec,
        ShardSpec,
        WinnerRecord,
    )
    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable
    from synthbatch.control.config.loader import load_model
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.config.run import RunConfig
    from synthbatch.control.planning.planner import make_plan

    layout = RunLayout(ensure_dir(root))
    base = make_plan(load_model(REPO / "examples/quickstart.toml", RunConfig),
                     load_model(REPO / "examples/profiles/testbed.toml", Profile),
                     "parquet-20240101-000000-abcdef", REPO / "examples")
    alias = base.deployments[0].alias
    columns = (
        ColumnSpec("level", "category", {"values": ["beginner", "expert"]}),
        ColumnSpec("minutes", "integer", {"low": 5, "high": 30}),
        ColumnSpec("weight", "uniform", {"low": 0, "high": 1}),
        ColumnSpec("question", "llm-text", {"model": alias, "prompt": "{topic} {level}"}),
        ColumnSpec("answer", "llm-structured", {
            "model": alias, "prompt": "{question}",
            "schema": {"type": "object", "properties": {
                "answer": {"type": "string"},
                "steps": {"type": "array", "items": {"type": "string"}}}}}),
        ColumnSpec("grade", "llm-judge", {"model": alias, "prompt": "{answer.answer}",
                                          "scores": [{"name": "correct",
                                                      "options": {"1": "y", "0": "n"}}]}),
    )
    per = records // shards
    plan = replace(base, client=GenerateSpec(columns=columns), total_records=per * shards,
                   shards=tuple(ShardSpec(i, i * per, per) for i in range(shards)))
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    usage = {"prompt_tokens": 40, "completion_tokens": 60, "total_tokens": 100}
    cell = {"model": alias, "served_model": "m", "finish_reason": "stop", "usage": usage,
            "attempts": 1, "latency_ms": 812.4}
    for shard in plan.shards:
        out = ensure_dir(layout.attempt(shard.index, 1).output)
        lines = []
        for i in range(shard.record_offset, shard.record_offset + per):
            lines.append(json.dumps({
                "index": i, "topic": f"topic {i % 97}", "level": ["beginner", "expert"][i % 2],
                "minutes": 5 + i % 25, "weight": (i % 1000) / 1000,
                "question": f"Question {i}: " + "why does the tide rise " * 6,
                "answer": {"answer": "Because of the moon. " * 8,
                           **({"steps": ["one", "two", "three"]} if i % 3 else {})},
                "grade": {"correct": {"score": i % 2, "reasoning": "The answer is right."}},
                "_meta": {"index": i, "columns": {"question": cell, "answer": cell,
                                                  "grade": cell}}}))
        data = ("\n".join(lines) + "\n").encode()
        (out / "records.jsonl").write_bytes(data)
        entry = FileEntry("records.jsonl", hashlib.sha256(data).hexdigest(), len(data), per)
        winner = WinnerRecord(shard=shard.index, attempt=1, records=per,
                              result_sha256="0" * 64, files=(entry,), created_at=1.0)
        publish_immutable(layout.winner_json(shard.index), winner.to_json().encode())
    return root


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child(kind: str, run: Path, work: Path) -> None:
    """One measure in this process; prints one JSON line."""
    import pyarrow as pa
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq

    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.control.runs import merge, parquet

    layout = RunLayout(run)
    start_rss = _rss_kb()
    started = time.perf_counter()
    if kind == "direct":
        table = pa_json.read_json(work / "all.jsonl")
        pq.write_table(table, work / "direct.parquet")
        rows = table.num_rows
    elif kind.startswith("merge"):
        out = merge.merge_run(layout, work / "merged", False, fmt="parquet",
                              stats=kind == "merge")
        rows = out["records"]
    else:
        out = merge.merge_run(layout, work / "merged.jsonl", False, stats=kind == "jsonl+stats")
        rows = out["records"]
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open(work / "all.jsonl", "rb") as handle:
        group = pa_json.read_json(pa.BufferReader(handle.read(parquet.CHUNK).rpartition(
            b"\n")[0] + b"\n")).nbytes
    print(json.dumps({"kind": kind, "wall": wall, "rows": rows,
                      "working_mb": (peak - start_rss) / 1024, "peak_mb": peak / 1024,
                      "row_group_mb": group / 2**20}))


KINDS = ("direct", "merge", "merge --no-stats", "jsonl", "jsonl+stats")


def measure(kind: str, run: Path, work: Path) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--child", kind, str(run), str(work)],
                          capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{kind}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="merge-parquet-") as folder:
        work = Path(folder)
        run = build_run(work / "run", args.records, args.shards)
        files = sorted(run.glob("shards/*/attempts/*/output/records.jsonl"))
        with open(work / "all.jsonl", "wb") as out:
            for path in files:
                out.write(path.read_bytes())
        mb = (work / "all.jsonl").stat().st_size / 1e6
        best: Dict[str, Dict[str, Any]] = {}
        for _ in range(args.rounds):
            for kind in KINDS:
                got = measure(kind, run, work)
                if kind not in best or got["wall"] < best[kind]["wall"]:
                    best[kind] = {**got, "working_mb": max(got["working_mb"], best.get(
                        kind, {}).get("working_mb", 0))}
        double = build_run(work / "run2", args.records * 2, args.shards * 2)
        twice = measure("merge", double, work)
        rows: List[Tuple[str, Dict[str, Any]]] = list(best.items())
        direct = best["direct"]["wall"]
        group = best["merge"]["row_group_mb"]
        print(f"merge to parquet: {args.records} records in {args.shards} shards ({mb:.0f} MB "
              f"of JSONL), best of {args.rounds}, load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs; one row group in memory {group:.1f} MB:")
        for kind, got in rows:
            ratio = f"; speed vs direct {direct / got['wall']:.2f}" if kind != "direct" else ""
            print(f"  {kind:<17} {got['wall']:6.2f} s = {mb / got['wall']:5.1f} MB/s; working "
                  f"memory {got['working_mb']:6.1f} MB (peak RSS {got['peak_mb']:.0f} MB)"
                  f"{ratio}")
        print(f"  merge of {args.records * 2} records in {args.shards * 2} shards: working "
              f"memory {twice['working_mb']:.1f} MB ({twice['wall']:.2f} s)")
        ratio = direct / best["merge"]["wall"]
        growth = twice["working_mb"] / best["merge"]["working_mb"]
        print(f"  goal merge >= 0.5 of direct: {'ok' if ratio >= 0.5 else 'MISS'} ({ratio:.2f});"
              f" working memory at 2x the records <= 1.15x: {'ok' if growth <= 1.15 else 'MISS'}"
              f" ({growth:.2f}; {best['merge']['working_mb'] / group:.1f} row groups; direct "
              f"holds the whole table: {best['direct']['working_mb'] / group:.1f})")


if __name__ == "__main__":
    main()
