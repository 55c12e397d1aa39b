"""Submit of 10,000 and 100,000 shards against the testbed, and merge against ``cat``.

    . DIR/env.sh && python benchmarks/submit_merge.py [--submit 10000:0,100000:1001]
        [--merge-shards 1000] [--records-per-shard 1000] [--skip-submit] [--skip-merge]

Submit (issue 20 goals: <= 3 s at 10,000 shards, <= 30 s at 100,000): ``control.api.submit``
of a fake-server run, each size in its own process (so its peak memory is its own), against
the running testbed: plan, stage (inputs, plan, agent; nothing per shard), ``run.json``,
one held array per MaxArraySize chunk (``N:M`` makes the scheduler report MaxArraySize M,
0 = the cluster's own), its submission record, release (the first attempts get no record:
their submission records imply them). The jobs are
``scancel``-ed as soon as the submit returns. Printed: wall time per phase, fsync and sync
calls (counted in process: ``os.fsync``, ``os.sync``, ``statefile.sync_filesystem``), the
sbatch and scontrol calls, and the peak RSS.

Merge (goal: >= 0.7 of ``cat``): a synthetic run with winners for 1,000 shards x 1,000
records (~250 MB); ``merge`` (verify every digest, concatenate, fsync, rename, manifest)
against ``cat FILES > out`` of the same files (plus one fsync, for fairness), page cache
warm, best of 3 each, side by side in one run: the kernel copy (``copy_file_range``, hashed
from the output) and the buffered copy it falls back to. Also printed: this interpreter's
SHA-256 speed (merge hashes every byte once, against its file's digest; the manifest's
``files_sha256`` is made from those digests) and the process CPU time of each merge.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# ----------------------------------------------------------------------------- submit


def counters() -> Dict[str, int]:
    """Count fsync / sync / syncfs calls from now on (wrapping the functions in place)."""
    from synthbatch.agent_stdlib import statefile

    counts = {"fsync": 0, "sync": 0, "syncfs": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            counts[name] += 1
            return real(*args)
        return call

    os.fsync = counting("fsync", os.fsync)
    os.sync = counting("sync", os.sync)
    statefile.sync_filesystem = counting("syncfs", statefile.sync_filesystem)
    return counts


def phase_timer() -> Dict[str, float]:
    """Time the submit phases (wrapping the functions api.submit calls)."""
    from synthbatch.control.runs import plan as planning
    from synthbatch.control.runs.submit import arrays as submitting

    times: Dict[str, float] = {}

    def wrap(module: Any, name: str) -> None:
        original = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                times[name] = times.get(name, 0.0) + time.perf_counter() - started

        setattr(module, name, timed)

    wrap(planning, "resolve")
    for name in ("stage_run", "commit_run", "submit_all", "submit_attempts", "sbatch_adopting"):
        wrap(submitting, name)
    return times


def submit_child(shards: int, max_array: int, work: Path) -> Dict[str, Any]:
    """One submit in this process; returns its figures."""
    from synthbatch.control import api
    from synthbatch.control.slurm.scheduler import Scheduler

    profile = work / "profile.toml"
    profile.write_text((REPO / "examples" / "profiles" / "testbed.toml").read_text().replace(
        'workspace = "/tmp/synthbatch-workspace"', f'workspace = "{work / "ws"}"'))

    def run_file(name: str, count: int) -> Path:
        path = work / name
        path.write_text((REPO / "examples" / "fake-server.toml").read_text()
                        .replace("records = 30", f"records = {count}")
                        .replace("count = 3", f"count = {count}")
                        .replace("{config_dir}/..", str(REPO)))
        return path

    run = run_file("run.toml", shards)
    calls: List[str] = []
    base = Scheduler()

    def runner(argv: List[str], timeout_s: float) -> Any:
        calls.append(f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''}".strip())
        return base.runner(argv, timeout_s)

    scheduler = Scheduler(timeout_s=120.0, runner=runner)
    if max_array:
        scheduler.max_array_size = lambda: max_array  # type: ignore[method-assign]
    # Builds and caches the agent bundle. 10 shards: a warm-up of the full size would leave
    # 100,000 cancelled jobs counting against MaxJobCount for MinJobAge (300 s).
    warm = api.submit(run_file("warm.toml", 10), str(profile), scheduler)
    _cancel(warm.job_ids)
    calls.clear()
    counts, times = counters(), phase_timer()
    started = time.perf_counter()
    try:
        result = api.submit(run, str(profile), scheduler)
    finally:
        _cancel_named(work)
    wall = time.perf_counter() - started
    _cancel(result.job_ids)
    return {"shards": shards, "arrays": len(result.job_ids), "wall_s": wall,
            "phases": times, "syncs": counts,
            "slurm_calls": {c: calls.count(c) for c in sorted(set(calls))},
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _cancel(job_ids: List[str]) -> None:
    """scancel the benchmark's arrays right away (their jobs must not run)."""
    subprocess.run(["scancel", *job_ids], check=False, timeout=120)


def _cancel_named(work: Path) -> None:
    """Safety net: scancel every job named after one of the benchmark's runs."""
    from synthbatch.agent_stdlib.layout import job_name, runs_root

    for folder in runs_root(work / "ws").iterdir():
        subprocess.run(["scancel", "--name", job_name(folder.name)], check=False,
                       timeout=120)


def bench_submit(spec: str, work: Path) -> None:
    for item in spec.split(","):
        shards, _, max_array = item.partition(":")
        folder = work / f"submit-{shards}"
        folder.mkdir()
        out = subprocess.run([sys.executable, __file__, "--child-submit", shards,
                              max_array or "0", str(folder)], capture_output=True, text=True,
                             check=False, cwd=str(REPO))
        if out.returncode != 0:
            print(f"submit of {shards} shards failed: {out.stderr.strip()[-500:]}")
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        goal = 3.0 if row["shards"] <= 10_000 else 30.0
        phases = ", ".join(f"{k} {v:.2f}" for k, v in sorted(row["phases"].items(),
                                                             key=lambda kv: -kv[1]))
        print(f"submit of {row['shards']:,} shards in {row['arrays']} array(s): "
              f"{row['wall_s']:.2f} s (goal <= {goal:g} s: "
              f"{'ok' if row['wall_s'] <= goal else 'MISS'}); phases (s): {phases}; "
              f"durability calls {row['syncs']}; Slurm calls {row['slurm_calls']}; "
              f"peak RSS {row['peak_rss_mb']:.0f} MB", flush=True)
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- merge


def build_merge_run(root: Path, shards: int, per_shard: int) -> Any:
    """A run directory with a plan and ``shards`` winners of ``per_shard`` records."""
    from synthbatch.agent_stdlib.contracts import FileEntry, ShardSpec, WinnerRecord
    from synthbatch.agent_stdlib.layout import RunLayout
    from synthbatch.agent_stdlib.statefile import ensure_dir, publish_immutable
    from synthbatch.control.config.loader import load_model
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.config.run import RunConfig
    from synthbatch.control.planning.planner import make_plan

    layout = RunLayout(ensure_dir(root))
    base = make_plan(load_model(REPO / "examples/quickstart.toml", RunConfig),
                     load_model(REPO / "examples/profiles/testbed.toml", Profile),
                     "merge-20240101-000000-abcdef", REPO / "examples")
    plan = replace(base, shards=tuple(ShardSpec(i, i * per_shard, per_shard)
                                      for i in range(shards)),
                   total_records=shards * per_shard)
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


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bench_merge(shards: int, per_shard: int, work: Path) -> None:
    from synthbatch.control.runs import merge

    layout = build_merge_run(work / "run", shards, per_shard)
    files = [layout.attempt(s, 1).output / "records.jsonl" for s in range(shards)]
    size = sum(f.stat().st_size for f in files)
    cat_out, merge_out = work / "cat.jsonl", work / "merged.jsonl"
    kernel = merge._copy_jsonl

    def buffered(files: Any, out: Any, *_: Any) -> Tuple[str, int]:
        return kernel(files, out, False)

    def run(copy: Callable[..., Any]) -> Callable[[], None]:
        def go() -> None:
            merge._copy_jsonl = copy
            try:
                # the copy and its verification; the card's column statistics (a parse of
                # every record) are measured by merge_parquet.py
                merge.merge_run(layout, merge_out, allow_partial=False, stats=False)
            finally:
                merge._copy_jsonl = kernel
        return go

    _cat(files, cat_out)  # warm the page cache
    best: Dict[str, Tuple[float, float]] = {}
    for _ in range(3):
        for name, action in (("cat", lambda: _cat(files, cat_out)), ("kernel", run(kernel)),
                             ("buffered", run(buffered))):
            cpu, started = _cpu(), time.perf_counter()
            action()
            wall, used = time.perf_counter() - started, _cpu() - cpu
            if name not in best or wall < best[name][0]:
                best[name] = (wall, used)
    assert merge_out.read_bytes() == cat_out.read_bytes()
    blob = os.urandom(64 << 20)
    started = time.perf_counter()
    hashlib.sha256(blob).hexdigest()
    sha = len(blob) / 1e6 / (time.perf_counter() - started)
    mb = size / 1e6
    print(f"merge of {shards} shards x {per_shard} records ({mb:.0f} MB), best of 3, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, sha256 of this "
          f"interpreter {sha:.0f} MB/s:")
    cat_s = best["cat"][0]
    for name, (wall, used) in best.items():
        ratio = f"; ratio to cat {cat_s / wall:.2f}" if name != "cat" else ""
        print(f"  {name:<9} {wall:6.2f} s = {mb / wall:5.0f} MB/s{ratio}"
              + (f"; process CPU {used:.2f} s" if name != "cat" else ""))
    print(f"  goal >= 0.7 of cat: {'ok' if cat_s / best['kernel'][0] >= 0.7 else 'MISS'}; "
          "outputs identical")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-submit":
        print(json.dumps(submit_child(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submit", default="10000:0,100000:1001",
                        help="SHARDS:MAXARRAYSIZE,... (0: the cluster's MaxArraySize)")
    parser.add_argument("--merge-shards", type=int, default=1_000)
    parser.add_argument("--records-per-shard", type=int, default=1_000)
    parser.add_argument("--skip-submit", action="store_true")
    parser.add_argument("--skip-merge", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="synthbatch-bench-"))
    try:
        if not args.skip_submit:
            bench_submit(args.submit, work)
        if not args.skip_merge:
            bench_merge(args.merge_shards, args.records_per_shard, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
