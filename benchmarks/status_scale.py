"""``status --json`` of a 10,000-shard run from a fresh process, against one bare ``squeue``.

Builds a synthetic run in a temp workspace (6,000 shards succeeded, 100 failed, 50
cancelled, 150 running with progress, 3,700 pending), submits one held array for its
unfinished shards to the running testbed (so squeue answers about real jobs), times
``synthbatch status RUN --json`` in fresh processes, compares it with a bare ``squeue``
and prints the ratio. The held array is cancelled at the end.

    . /tmp/synthbatch-testbed/env.sh && python benchmarks/status_scale.py [--shards N]

Targets (issue 4): <= 1.0 s, and <= 3x one bare squeue call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent_stdlib.contracts import RunRecord, ShardSpec, SubmissionRecord  # noqa: E402
from control.config.loader import load_model  # noqa: E402
from control.config.profile import Profile  # noqa: E402
from control.config.run import RunConfig  # noqa: E402
from control.planning.planner import make_plan  # noqa: E402

PER_SHARD = 10
NOW = time.time()


def write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, sort_keys=True))


def attempt(run_id: str, shard: int, state: str, job: Optional[str],
            reason: Optional[str] = None, updated_at: float = NOW) -> dict:
    return {"schema_version": 1, "run_id": run_id, "shard": shard, "attempt": 1,
            "state": state, "revision": 4, "updated_at": updated_at, "submission": 1,
            "job_id": f"{job}_{shard}" if job else None, "node": None, "restarts": 0,
            "reason": reason}


def progress(done: int) -> dict:
    return {"schema_version": 1, "records_done": done, "records_total": PER_SHARD,
            "tokens": done * 40, "requests_per_s": 0.8, "updated_at": NOW - 3}


def kind(index: int, shards: int) -> str:
    """The state of shard ``index`` in the synthetic mix (fractions of 10,000)."""
    share = index * 10_000 // shards
    if share < 6000:
        return "succeeded"
    if share < 6100:
        return "failed"
    if share < 6150:
        return "cancelled"
    return "running" if share < 6300 else "submitted"


def build(workspace: Path, shards: int, job: Optional[str], run_id: str) -> Path:
    """The run directory, written with plain writes (no fsync: this is a benchmark)."""
    base = make_plan(load_model(REPO / "examples/quickstart.toml", RunConfig),
                     load_model(REPO / "examples/profiles/testbed.toml", Profile), run_id,
                     REPO / "examples")
    plan = replace(base, shards=tuple(ShardSpec(i, i * PER_SHARD, PER_SHARD)
                                      for i in range(shards)),
                   total_records=shards * PER_SHARD)
    root = workspace / "runs" / run_id
    (root / "submissions").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "plan.json").write_text(plan.to_json())
    write(root / "run.json", RunRecord(
        run_id=run_id, name=plan.name, created_at=NOW, plan_sha256="0" * 64,
        agent_pyz="agent-x.pyz", agent_sha256="0" * 64, backend="slurm",
        job_name=f"synthbatch-{run_id}", shard_count=shards).to_dict())
    write(root / "submissions" / "0001.json", SubmissionRecord(
        number=1, argv=("sbatch",), job_id=job or "999999990",
        attempts={str(i): 1 for i in range(shards)}, submitted_at=NOW - 3600,
        released=True).to_dict())
    for index in range(shards):
        write_shard(root, run_id, index, kind(index, shards), job or "999999990")
    return root


def winner(index: int) -> dict:
    """A complete winner record (status verifies every one, as merge does)."""
    files = [{"path": "records.jsonl", "sha256": "0" * 64, "bytes": 1000 * PER_SHARD,
              "records": PER_SHARD}]
    return {"schema_version": 1, "shard": index, "attempt": 1, "records": PER_SHARD,
            "result_sha256": "0" * 64, "files": files, "created_at": NOW - 3600}


def write_shard(root: Path, run_id: str, index: int, state: str, job: str) -> None:
    shard = root / "shards" / f"shard-{index:05d}"
    folder = shard / "attempts" / "attempt-0001"
    (folder / "logs" / "execution-1").mkdir(parents=True)
    old = NOW - 3600
    if state == "succeeded":
        write(folder / "attempt.json", attempt(run_id, index, state, job, updated_at=old))
        write(folder / "progress.json", progress(PER_SHARD))
        write(shard / "winner.json", winner(index))
    elif state in ("failed", "cancelled"):
        log = folder / "logs" / "execution-1" / "client.log"
        reason = f"client exited with status 1 (log {log}: boom)"
        write(folder / "attempt.json", attempt(run_id, index, state, job, reason, old))
    elif state == "running":
        write(folder / "attempt.json", attempt(run_id, index, state, job))
        write(folder / "progress.json", progress(4))
    else:
        write(folder / "attempt.json", attempt(run_id, index, state, job))


def timed(argv: List[str], env: dict, repeat: int) -> tuple[float, subprocess.CompletedProcess]:
    """Median wall time of ``argv`` over ``repeat`` fresh processes, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def held_array(name: str, indices: str) -> Optional[str]:
    """Submit a held array with the run's job name; None without a testbed."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        return None
    out = subprocess.run(["sbatch", "--parsable", "--hold", f"--array={indices}",
                          f"--job-name={name}", "--mem=64M", "-c1", "-o", "/dev/null",
                          "--wrap", "true"], capture_output=True, text=True, check=False)
    return out.stdout.strip().split(";")[0] if out.returncode == 0 else None


def main() -> None:
    """Build, measure, print, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    run_id = f"scale-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid():06x}"[:40]
    first_open = next(i for i in range(args.shards) if kind(i, args.shards) == "running")
    job = held_array(f"synthbatch-{run_id}", f"{first_open}-{args.shards - 1}")
    tmp = Path(tempfile.mkdtemp(prefix="status-scale-"))
    try:
        measure(tmp, run_id, job, args)
    finally:
        if job:
            subprocess.run(["scancel", job], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def measure(tmp: Path, run_id: str, job: Optional[str], args: argparse.Namespace) -> None:
    """Time the fresh-process status and the bare squeue; print the figures."""
    started = time.perf_counter()
    build(tmp / "ws", args.shards, job, run_id)
    profile = tmp / "profile.toml"
    profile.write_text((REPO / "examples/profiles/testbed.toml").read_text().replace(
        '"/tmp/synthbatch-workspace"', json.dumps(str(tmp / "ws"))))
    print(f"built {args.shards} shards in {time.perf_counter() - started:.1f}s "
          f"(held array {job or 'none: no testbed, job ids are fake'})")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cli = [sys.executable, "-c", "from control.cli.main import main; main()"]
    status_s, result = timed([*cli, "status", run_id, "--profile", str(profile), "--json"],
                             env, args.repeat)
    if result.returncode != 0:
        raise SystemExit(f"status failed: {result.stderr}")
    data = json.loads(result.stdout)
    import_s, _ = timed([sys.executable, "-c", STATUS_IMPORTS], env, args.repeat)
    python_s, _ = timed([sys.executable, "-c", "pass"], env, args.repeat)
    print(f"status --json: {status_s * 1000:.0f} ms  (state {data['state']}, counts "
          f"{data['counts']}, scheduler_error {data['scheduler_error']})")
    reads_s = read_time(tmp / "ws" / "runs" / run_id, args.repeat)
    sacct = "not called" if data["accounting"] is None else "called"
    print(f"  of which: python start-up {python_s * 1000:.0f} ms, imports of the status path "
          f"{(import_s - python_s) * 1000:.0f} ms, reading {args.shards} shards "
          f"{reads_s * 1000:.0f} ms (in process, warm), sacct {sacct}")
    if shutil.which("squeue") and os.environ.get("SLURM_CONF"):
        query_s, _ = timed(["squeue", "-h", "-t", "all", "-n", f"synthbatch-{run_id}", "-o",
                            "%i|%T|%r"], env, args.repeat)
        print(f"  status's own squeue call: {query_s * 1000:.0f} ms; the rest (verdicts, "
              f"rows, JSON out) {(status_s - import_s - reads_s - query_s) * 1000:.0f} ms")
        squeue_s, _ = timed(["squeue"], env, args.repeat)
        print(f"bare squeue:   {squeue_s * 1000:.0f} ms")
        print(f"ratio status/squeue: {status_s / squeue_s:.1f}x (target <= 3x); "
              f"absolute {'OK' if status_s <= 1.0 else 'OVER'} (target <= 1.0 s); "
              f"python start-up alone is {python_s / squeue_s:.1f}x")


STATUS_IMPORTS = ("import control.cli.main, control.cli.status, control.api, "
                  "control.runs.status")


def read_time(root: Path, repeat: int) -> float:
    """Median time to read the plan, submissions and every shard as status does."""
    from agent_stdlib.layout import RunLayout
    from control.runs.store import (
        expected_attempts,
        load_plan_view,
        scan_shard,
        submission_views,
    )

    layout, times = RunLayout(root), []
    for _ in range(repeat):
        start = time.perf_counter()
        plan = load_plan_view(layout)
        expected = expected_attempts(submission_views(layout)).get
        for index in range(len(plan.shard_records)):
            scan_shard(layout, index, expected(index))
        times.append(time.perf_counter() - start)
    return statistics.median(times)

if __name__ == "__main__":
    main()
