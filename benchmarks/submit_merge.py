"""Submit of a 10,000-shard run, and merge of 1,000 shards x 1,000 records against ``cat``.

    . /tmp/synthbatch-testbed/env.sh && python benchmarks/submit_merge.py [--shards N]
        [--merge-shards N] [--records-per-shard N] [--skip-submit] [--skip-merge]

Submit (issue 8 target: <= 5 s): ``control.api.submit`` of a fake-server run with 10,000
shards against the running testbed: plan, stage (inputs, plan, agent, 10,000 ``created``
attempt records), ``run.json``, one held array, 10,000 attempts ``submitted``, release.
The jobs are ``scancel``-ed right after the submit returns (before any can start: the
fake-server run asks for a GPU each, 8 exist). Printed: the wall time of each phase.

Merge (target: >= 50 % of ``cat`` throughput): a synthetic run with winners for 1,000
shards x 1,000 records (~250 MB); ``merge`` (verify every digest, concatenate, fsync,
rename, manifest) against ``cat FILES > out`` of the same files (plus one fsync, for
fairness), page cache warm for both, best of 3 each. Printed: MB/s and the ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent_stdlib.contracts import FileEntry, WinnerRecord  # noqa: E402
from agent_stdlib.layout import RunLayout  # noqa: E402
from agent_stdlib.statefile import ensure_dir, publish_immutable  # noqa: E402


def phase_timer() -> Dict[str, float]:
    """Wrap the submit phases to time them (monkeypatching the modules api.submit uses)."""
    from control.runs import submit as submitting

    times: Dict[str, float] = {}

    def wrap(name: str) -> None:
        original = getattr(submitting, name)

        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - started

        setattr(submitting, name, timed)

    for name in ("stage_run", "commit_run", "submit_all"):
        wrap(name)
    return times


def bench_submit(shards: int, work: Path) -> None:
    from control import api

    profile = work / "profile.toml"
    profile.write_text((REPO / "examples" / "profiles" / "testbed.toml").read_text().replace(
        'workspace = "/tmp/synthbatch-workspace"', f'workspace = "{work / "ws"}"'))
    run = work / "run.toml"
    text = (REPO / "examples" / "fake-server.toml").read_text()
    text = text.replace("records = 30", f"records = {shards}").replace(
        "count = 3", f"count = {shards}").replace("{config_dir}/..", str(REPO))
    run.write_text(text)
    warm = api.submit(run, str(profile))  # warm-up: builds and caches the agent bundle once
    _cancel(warm.job_ids)
    times = phase_timer()
    started = time.perf_counter()
    try:
        result = api.submit(run, str(profile))
    finally:
        _cancel_named(work)
    wall = time.perf_counter() - started
    _cancel(result.job_ids)
    print(f"submit of {shards} shards: {wall:.2f} s wall (target <= 5 s: "
          f"{'ok' if wall <= 5 else 'MISS'}); job ids {result.job_ids}")
    for name, seconds in times.items():
        print(f"  {name:<11} {seconds:6.2f} s")
    print(f"  other       {wall - sum(times.values()):6.2f} s (plan: resolve, bundle lookup)")


def _cancel(job_ids: List[str]) -> None:
    """scancel the benchmark's arrays right away (10,000 jobs must never run)."""
    subprocess.run(["scancel", *job_ids], check=False, timeout=60)


def _cancel_named(work: Path) -> None:
    """Safety net: scancel every job named after one of the benchmark's runs."""
    for folder in (work / "ws" / "runs").iterdir():
        subprocess.run(["scancel", "--name", f"synthbatch-{folder.name}"], check=False,
                       timeout=60)


def build_merge_run(root: Path, shards: int, per_shard: int) -> RunLayout:
    """A run directory with a plan view and ``shards`` winners of ``per_shard`` records."""
    from tests.unit.test_candidate_merge import make_plan_for

    layout = RunLayout(ensure_dir(root))
    plan = make_plan_for(shards * per_shard, shards)
    publish_immutable(layout.plan_json, plan.to_json().encode(), mode=0o400)
    for shard in plan.shards:
        out = ensure_dir(layout.attempt(shard.index, 1).output)
        lines = [json.dumps({"index": i, "prompt": f"Describe item {i}.",
                             "completion": "alpha bravo charlie delta " * 40})
                 for i in range(shard.record_offset, shard.record_offset + per_shard)]
        data = ("\n".join(lines) + "\n").encode()
        (out / "records.jsonl").write_bytes(data)
        entry = FileEntry("records.jsonl", hashlib.sha256(data).hexdigest(), len(data),
                          per_shard)
        winner = WinnerRecord(shard=shard.index, attempt=1, records=per_shard,
                              result_sha256="0" * 64, files=(entry,), created_at=1.0)
        publish_immutable(layout.winner_json(shard.index), winner.to_json().encode())
    return layout


def _cat(files: List[Path], target: Path) -> None:
    with open(target, "wb") as out:
        subprocess.run(["cat", *map(str, files)], stdout=out, check=True, timeout=600)
        os.fsync(out.fileno())


def bench_merge(shards: int, per_shard: int, work: Path) -> None:
    from control.runs.merge import merge_run

    layout = build_merge_run(work / "run", shards, per_shard)
    files = [layout.attempt(s, 1).output / "records.jsonl" for s in range(shards)]
    size = sum(f.stat().st_size for f in files)
    cat_out, merge_out = work / "cat.jsonl", work / "merged.jsonl"
    _cat(files, cat_out)  # warm the page cache
    cat_s, merge_s = [], []
    for _ in range(3):
        started = time.perf_counter()
        _cat(files, cat_out)
        cat_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        manifest = merge_run(layout, merge_out, allow_partial=False)
        merge_s.append(time.perf_counter() - started)
    assert merge_out.read_bytes() == cat_out.read_bytes()
    assert manifest["records"] == shards * per_shard
    mb = size / 1e6
    cat_rate, merge_rate = mb / min(cat_s), mb / min(merge_s)
    ratio = merge_rate / cat_rate
    print(f"merge of {shards} shards x {per_shard} records ({mb:.0f} MB): "
          f"merge {min(merge_s):.2f} s = {merge_rate:.0f} MB/s, cat {min(cat_s):.2f} s = "
          f"{cat_rate:.0f} MB/s; ratio {ratio:.0%} (target >= 50 %: "
          f"{'ok' if ratio >= 0.5 else 'MISS'}); outputs identical")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--merge-shards", type=int, default=1_000)
    parser.add_argument("--records-per-shard", type=int, default=1_000)
    parser.add_argument("--skip-submit", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    parser.add_argument("--no-fsync", action="store_true",
                        help="diagnosis only: make os.fsync a no-op to show its share")
    args = parser.parse_args()
    if args.no_fsync:
        os.fsync = lambda fd: None
    work = Path(tempfile.mkdtemp(prefix="synthbatch-bench-"))
    try:
        if not args.skip_submit:
            bench_submit(args.shards, work)
        if not args.skip_merge:
            bench_merge(args.merge_shards, args.records_per_shard, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
