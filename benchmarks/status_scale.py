"""``status --json`` of 1,000 / 10,000 / 100,000-shard runs, all settled and 1% active:
time, files opened and path lookups, with and without the settled index, against main.

    . DIR/env.sh && python benchmarks/status_scale.py [--shards 1000,10000,100000]
        [--repeat 3] [--latency-ms 1] [--before REF] [--no-latency]

For each size it builds one synthetic run in a temp workspace (99% of shards with a
verified winner, 1% failed an hour ago), then makes 1% of the shards active (90% of those
``submitted``, 10% ``running`` with progress) and submits one held array for them to the
running testbed (so squeue answers about real jobs; cancelled at the end). The
``submitted`` ones have a record, as REF's submit wrote them, while REF is measured; then
their folders are removed, as this tree's submit leaves a first attempt that has not
started (``imply_pending``). Every figure is a fresh ``synthbatch status RUN --json``
process, all side by side in one run:

* ``before``: the code of REF (default ``main``, exported with ``git archive`` to a temp
  folder, so no checkout is touched), without an index, or with ``--before-warm`` with
  the index REF keeps itself (built by a first run, as its later statuses see it);
* ``cold``: this tree with ``observer/`` removed first (the first status of a run, or one
  after the index was found damaged: every shard read, the index built);
* ``warm``: this tree with the index there (every later status).

Files opened and path lookups (``openat``; ``stat``/``lstat``/``newfstatat``/``statx``/
``readlink``) under the run directory are counted with ``strace -f``. The simulated
metadata latency runs the same CLI in a child whose ``os.open``, ``os.stat``,
``os.lstat``, ``os.listdir`` and ``os.scandir`` sleep ``--latency-ms`` first for paths
under the workspace (an in-process wrapper: no FUSE here, and it costs exactly what the
code asks of the filesystem, nothing that a FUSE daemon would add). Python's own imports
are not slowed: on a cluster the software is usually installed elsewhere.

Goals (issue 20): files opened <= unsettled shards + 20; <= 0.5 s at 100,000 settled
shards.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
UNDER_TEST = os.environ.get("STATUS_SCALE_REPO")  # child mode: the tree to import
sys.path.insert(0, UNDER_TEST or str(REPO))

PER_SHARD = 10
# the tree's CLI, under the name that tree imports itself by (benchmarks/trees.py)
RUN_CLI = ("import importlib, os; "
           "importlib.import_module(os.environ['STATUS_SCALE_PACKAGE'] + '.cli.main').main()")
NOW = time.time()
LOOKUPS = re.compile(r"\b(newfstatat|statx|lstat|stat|readlink|access)\(")


def write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, sort_keys=True))


def attempt(run_id: str, shard: int, state: str, job: str, reason: Optional[str] = None,
            updated_at: float = NOW) -> dict:
    from synthbatch.agent_stdlib.arrays import task_job_id

    return {"schema_version": 1, "run_id": run_id, "shard": shard, "attempt": 1,
            "state": state, "revision": 4, "updated_at": updated_at, "submission": 1,
            "job_id": task_job_id(job, shard), "node": None, "restarts": 0, "reason": reason}


def progress(done: int) -> dict:
    return {"schema_version": 1, "records_done": done, "records_total": PER_SHARD,
            "tokens": done * 40, "requests_per_s": 0.8, "updated_at": NOW - 3}


def winner(index: int) -> dict:
    """A complete winner record (status verifies every one, as merge does)."""
    files = [{"path": "records.jsonl", "sha256": "0" * 64, "bytes": 1000 * PER_SHARD,
              "records": PER_SHARD}]
    return {"schema_version": 1, "shard": index, "attempt": 1, "records": PER_SHARD,
            "result_sha256": "0" * 64, "files": files, "created_at": NOW - 3600}


def active_range(shards: int) -> range:
    """The last 1% of the shards are the active ones (one contiguous array range)."""
    return range(shards - max(1, shards // 100), shards)


def build(workspace: Path, shards: int, run_id: str, job: str) -> Path:
    """A settled run: plain writes (no fsync: a benchmark), the real plan and records."""
    from synthbatch.agent_stdlib import states
    from synthbatch.agent_stdlib.contracts import RunRecord, ShardSpec, SubmissionRecord
    from synthbatch.agent_stdlib.layout import RunLayout, job_name, run_dir
    from synthbatch.control.config.loader import load_model
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.config.run import RunConfig
    from synthbatch.control.planning.planner import make_plan

    base = make_plan(load_model(REPO / "examples/quickstart.toml", RunConfig),
                     load_model(REPO / "examples/profiles/testbed.toml", Profile), run_id,
                     REPO / "examples")
    plan = replace(base, shards=tuple(ShardSpec(i, i * PER_SHARD, PER_SHARD)
                                      for i in range(shards)),
                   total_records=shards * PER_SHARD)
    runs = RunLayout(run_dir(workspace, run_id))
    root = runs.root
    runs.submissions.mkdir(parents=True)
    runs.slurm_logs.mkdir()
    runs.plan_json.write_text(plan.to_json())
    write(runs.run_json, RunRecord(
        run_id=run_id, name=plan.name, created_at=NOW, plan_sha256="0" * 64,
        agent_pyz="agent-x.pyz", agent_sha256="0" * 64, backend="slurm",
        job_name=job_name(run_id), shard_count=shards).to_dict())
    # What the first status of a finished run writes once accounting has a row for every
    # shard's job (``control/runs/status/totals.py``): this run's jobs are made up (only the
    # active range gets a real held array), so no status could count them, and each
    # would ask sacct again, which no real finished run does.
    write(runs.totals_json, {"schema_version": 1, "job_ids": [job], "totals": {
        "elapsed_s": 3600.0, "gpu_hours": 0.0, "gpu_hours_from": "accounting (sacct)",
        "records_per_s": round(shards * PER_SHARD / 3600, 3), "tokens_per_s": 0.0}})
    write(runs.submission_json(1), SubmissionRecord(
        number=1, argv=("sbatch",), job_id=job, attempts={str(i): 1 for i in range(shards)},
        submitted_at=NOW - 3600, released=True).to_dict())
    old = NOW - 3600
    for index in range(shards):
        folder = runs.attempt(index, 1)
        folder.root.mkdir(parents=True)
        if index % 100 == 37:  # 1% failed an hour ago
            write(folder.attempt_json, attempt(run_id, index, states.FAILED, job,
                                               "client exited with status 1", old))
            write(folder.progress_json, progress(3))
        else:
            write(folder.attempt_json, attempt(run_id, index, states.SUCCEEDED, job,
                                               updated_at=old))
            write(folder.progress_json, progress(PER_SHARD))
            write(runs.winner_json(index), winner(index))
    return root


def make_active(root: Path, run_id: str, shards: int, job: str) -> None:
    """1% of the shards back to ``submitted`` (90%) or ``running`` (10%), as a live run."""
    from synthbatch.agent_stdlib import states
    from synthbatch.agent_stdlib.layout import RunLayout  # this tree's (not in a child)

    runs = RunLayout(root)
    for number, index in enumerate(active_range(shards)):
        folder = runs.attempt(index, 1)
        runs.winner_json(index).unlink(missing_ok=True)
        folder.progress_json.unlink(missing_ok=True)
        running = number % 10 == 0
        write(folder.attempt_json, attempt(run_id, index,
                                           states.RUNNING if running else states.SUBMITTED,
                                           job))
        if running:
            write(folder.progress_json, progress(4))


def imply_pending(root: Path, shards: int) -> int:
    """The layout this tree's submit leaves: a first attempt that has not started has no
    folder (its submission record implies it ``submitted``). Removes the active shards'
    ``submitted`` folders (REF's submit wrote them); returns how many."""
    from synthbatch.agent_stdlib.layout import RunLayout  # this tree's (not in a child)

    removed = 0
    for number, index in enumerate(active_range(shards)):
        if number % 10:  # not one of the running ones
            shutil.rmtree(RunLayout(root).shard_dir(index))
            removed += 1
    return removed


def held_array(name: str, indices: range) -> Optional[str]:
    """Submit a held array with the run's job name; None without a testbed."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        return None
    out = subprocess.run(["sbatch", "--parsable", "--hold",
                          f"--array={indices.start}-{indices.stop - 1}", f"--job-name={name}",
                          "--mem=64M", "-c1", "-o", "/dev/null", "--wrap", "true"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip().split(";")[0] if out.returncode == 0 else None


# ----------------------------------------------------------------------------- measuring


def child_env(tree: str) -> Dict[str, str]:
    from benchmarks.trees import control_package, python_path  # not in a child (older tree)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = python_path(Path(tree))  # bytecode is cached, as when installed
    env["STATUS_SCALE_REPO"] = tree
    env["STATUS_SCALE_PACKAGE"] = control_package(Path(tree))
    return env


def status_argv(run_id: str, profile: Path, latency_s: float = 0.0,
                root: Optional[Path] = None) -> List[str]:
    if latency_s:
        return [sys.executable, str(Path(__file__).resolve()), "--child", str(latency_s),
                str(root), "status", run_id, "--profile", str(profile), "--json"]
    return [sys.executable, "-c", RUN_CLI, "status", run_id, "--profile", str(profile), "--json"]


def timed(argv: List[str], env: Dict[str, str], repeat: int,
          before_each: Optional[Callable[[], None]] = None) -> Tuple[float, dict]:
    """Median wall time over ``repeat`` fresh processes, and the last output (parsed)."""
    times, result = [], None
    for _ in range(repeat):
        if before_each:
            before_each()
        started = time.perf_counter()
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False,
                                cwd=env["STATUS_SCALE_REPO"])  # python -c puts the cwd first
        times.append(time.perf_counter() - started)
    assert result is not None
    try:
        data = json.loads(result.stdout)
    except ValueError:
        data = {"error": (result.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return statistics.median(times), data


def traced(argv: List[str], env: Dict[str, str], root: Path) -> Tuple[int, int]:
    """(files opened, path lookups) under ``root`` in one process, by strace -f."""
    if not shutil.which("strace"):
        return -1, -1
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as log:
        subprocess.run(["strace", "-f", "-qq", "-o", log.name, "-e",
                        "trace=openat,open,stat,lstat,newfstatat,statx,readlink,access",
                        *argv], env=env, capture_output=True, check=False,
                       cwd=env["STATUS_SCALE_REPO"])
        lines = [line for line in log.read().splitlines() if f'"{root}' in line]
    opens = sum(1 for line in lines if "open" in line.split("(")[0])
    return opens, sum(1 for line in lines if LOOKUPS.search(line.split('"')[0]))


def export_before(ref: str, into: Path) -> Optional[Path]:
    """``ref`` exported by ``benchmarks.trees.export`` into ``into`` (None if there is no
    such ref)."""
    from benchmarks.trees import export  # not in a child (older tree)

    try:
        return export(ref, into)[0]
    except subprocess.CalledProcessError:
        return None


def measure(tmp: Path, shards: int, args: argparse.Namespace, before: Optional[Path],
            rows: List[dict]) -> None:
    from synthbatch.agent_stdlib.layout import job_name  # this tree's (not in a child)

    run_id = f"scale-{shards}-{os.getpid():06x}"
    job = held_array(job_name(run_id), active_range(shards)) or "999999990"
    workspace = tmp / f"ws-{shards}"
    try:
        started = time.perf_counter()
        root = build(workspace, shards, run_id, job)
        print(f"# built {shards} shards in {time.perf_counter() - started:.0f} s "
              f"(held array {job})", flush=True)
        profile = tmp / f"profile-{shards}.toml"
        profile.write_text((REPO / "examples/profiles/testbed.toml").read_text().replace(
            '"/tmp/synthbatch-workspace"', json.dumps(str(workspace))))
        for mix in ("settled", "active"):
            if mix == "active":
                make_active(root, run_id, shards, job)
            rows.append(measure_mix(root, run_id, profile, shards, mix, args, before))
            print(row_line(rows[-1]), flush=True)
    finally:
        if job != "999999990":
            subprocess.run(["scancel", job], check=False)
        shutil.rmtree(workspace, ignore_errors=True)


def measure_mix(root: Path, run_id: str, profile: Path, shards: int, mix: str,
                args: argparse.Namespace, before: Optional[Path]) -> dict:
    from synthbatch.agent_stdlib.layout import RunLayout  # this tree's (not in a child)

    ours = child_env(str(REPO))
    argv = status_argv(run_id, profile)
    drop = lambda: shutil.rmtree(RunLayout(root).observer, ignore_errors=True)  # noqa: E731
    unsettled = 0 if mix == "settled" else len(active_range(shards))
    row: dict = {"shards": shards, "mix": mix, "unsettled": unsettled}
    timed(argv, ours, 1)  # bytecode cached, index built
    if before is not None:
        theirs = child_env(str(before))
        # --before-warm: REF keeps a settled index of its own, measured as its later
        # statuses see it (built by the first run; this tree's index format may differ)
        again = None if args.before_warm else drop
        timed(argv, theirs, 1, drop)
        row["before_s"], data = timed(argv, theirs, args.repeat, again)
        row["before_state"] = data.get("state", data.get("error"))
        row["before_opens"], row["before_lookups"] = traced(argv, theirs, root)
        if args.before_warm and args.latency_ms:
            row["before_latency_s"], _ = timed(
                status_argv(run_id, profile, args.latency_ms / 1000, root.parent.parent),
                theirs, 1)
    if mix == "active":  # REF measured on what its submit writes; this tree on its own
        row["implied"] = imply_pending(root, shards)
    row["cold_s"], _ = timed(argv, ours, args.repeat, drop)
    drop()
    row["cold_opens"], row["cold_lookups"] = traced(argv, ours, root)
    row["warm_s"], data = timed(argv, ours, args.repeat)
    row["warm_state"] = data.get("state", data.get("error"))
    row["counts"] = data.get("counts")
    row["warm_opens"], row["warm_lookups"] = traced(argv, ours, root)
    if args.latency_ms:
        latency = args.latency_ms / 1000
        slow = status_argv(run_id, profile, latency, root.parent.parent)
        row["warm_latency_s"], _ = timed(slow, ours, 1)
        if shards <= args.latency_cold_max:
            row["cold_latency_s"], _ = timed(slow, ours, 1, drop)
            if before is not None and not args.before_warm:
                row["before_latency_s"], _ = timed(slow, child_env(str(before)), 1, drop)
    return row


def row_line(row: dict) -> str:
    def ms(key: str) -> str:
        return f"{row[key] * 1000:.0f}" if key in row else "-"

    return (f"| {row['shards']:,} | {row['mix']} | {row['unsettled']:,} | {ms('before_s')} | "
            f"{ms('cold_s')} | {ms('warm_s')} | {row.get('before_opens', '-')} / "
            f"{row.get('cold_opens', '-')} / {row.get('warm_opens', '-')} | "
            f"{row.get('before_lookups', '-')} / {row.get('cold_lookups', '-')} / "
            f"{row.get('warm_lookups', '-')} | {ms('before_latency_s')} / "
            f"{ms('cold_latency_s')} / {ms('warm_latency_s')} | "
            f"{row.get('before_state', '-')} / {row.get('warm_state')} |")


HEADER = ("| shards | mix | unsettled | before ms | cold ms | warm ms | files opened "
          "before / cold / warm | path lookups before / cold / warm | with {lat} ms "
          "metadata latency: before / cold / warm ms | state before / now |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def child(latency_s: float, root: str, argv: List[str]) -> None:
    """Run the CLI with a metadata latency on every path under ``root``."""
    def slowed(call):  # noqa: ANN001, ANN202
        def wrapper(path=".", *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            if str(os.fspath(path) if not isinstance(path, int) else "").startswith(root):
                time.sleep(latency_s)
            return call(path, *args, **kwargs)
        return wrapper

    for name in ("open", "stat", "lstat", "listdir", "scandir"):
        setattr(os, name, slowed(getattr(os, name)))
    sys.argv = ["synthbatch", *argv]
    importlib.import_module(os.environ["STATUS_SCALE_PACKAGE"] + ".cli.main").main()


def main() -> None:
    """Build, measure, print, clean up."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(float(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=1.0, help="0: no latency runs")
    parser.add_argument("--latency-cold-max", type=int, default=10_000,
                        help="largest run whose cold/before status runs with the latency")
    parser.add_argument("--before", default="main", help="git ref to compare with ('' none)")
    parser.add_argument("--before-warm", action="store_true",
                        help="measure REF with its own settled index (REF has one)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="status-scale-"))
    load = os.getloadavg()[0]
    try:
        before = export_before(args.before, tmp / "before") if args.before else None
        print(f"# status --json, median of {args.repeat} fresh processes; before = "
              f"{args.before if before else 'none'}; load average {load:.1f} on "
              f"{os.cpu_count()} CPUs; {sys.version.split()[0]}")
        print(HEADER.format(lat=args.latency_ms))
        rows: List[dict] = []
        for shards in (int(n) for n in args.shards.split(",")):
            measure(tmp, shards, args, before, rows)
        print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
