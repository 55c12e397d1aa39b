"""Benchmark of the default (adaptive) concurrency against a fixed-concurrency sweep, on
fake engines that slow down when queued past their capacity (issue 30).

Each engine is the fake server with ``--max-concurrency C`` (16, 128, 512),
``--overload-slowdown 0.05`` (while W requests wait, every running request's tokens take
``1 + 0.05 x W / C`` times longer: 256 in flight against 16 run at 0.57 of the rate at
16) and 4 tokens a request (0.1 s, 1 s and 4 s a request: nominal 160, 128 and 128
requests/s). One ``llm-text`` column; the generator (``python -m agent_stdlib generate``)
talks to the engine directly, one process per measurement, side by side in one run:

* ``fixed N``: ``client.concurrency`` N for N in C/2, C, 2C and 256 (today's default
  depth, ``max_queued_requests``); the best of them is the reference;
* ``after``: this tree's default (adaptive);
* ``before``: the default of ``--before REF`` (default ``main``), exported with
  ``git archive`` into the temporary folder (no checkout is touched).

The rate is the least-squares slope of the generator's ``progress.json`` between 25% and
95% of the shard. Then the 10 s job: the engine of capacity 128 (nominal 128 records/s),
1,280 records, ready (the generator's process started against a ready engine) -> its
last record written, as a ratio of the nominal rate, for ``after``, ``before`` and
``fixed 128`` (the engine's knee from the first request: what start-up and the fake
engine's own overhead leave on this machine).
Usage: ``python benchmarks/concurrency.py [--quick] [--before REF]`` (~8 minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.generator import slope  # noqa: E402
from benchmarks.trees import export  # noqa: E402
from synthbatch.agent_stdlib.clientenv import ClientEnv  # noqa: E402
from synthbatch.agent_stdlib.contracts import ColumnSpec  # noqa: E402
from synthbatch.agent_stdlib.statefile import read_json_or_none  # noqa: E402
from tests.agent_runs import recipe_plan  # noqa: E402

FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
SLOWDOWN = 0.05
TOKENS = 4
ENGINES = {16: 0.025, 128: 0.25, 512: 1.0}  # capacity -> seconds a token
SECONDS = {16: 12.0, 128: 15.0, 512: 32.0}  # each steady measurement's length at nominal
GOAL, JOB_GOAL = 0.95, 0.93
COLUMNS = (ColumnSpec("text", "llm-text", {"model": "gen", "prompt": "Item {index}.",
                                           "max_tokens": TOKENS}),)


def nominal(capacity: int) -> float:
    """Requests per second of the engine at its capacity, nothing waiting."""
    return capacity / (TOKENS * ENGINES[capacity])


def start_engine(workdir: Path, capacity: int) -> Tuple[subprocess.Popen, str]:
    """A fake engine of ``capacity``; (process, base URL)."""
    port_file = workdir / f"engine-{capacity}.port"
    port_file.unlink(missing_ok=True)  # an earlier engine's port must not be read
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_SERVER), "--port", "0", "--port-file", str(port_file),
         "--model", "fake-model", "--max-concurrency", str(capacity), "--token-latency",
         str(ENGINES[capacity]), "--overload-slowdown", str(SLOWDOWN)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not port_file.exists():
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{int(port_file.read_text())}"


def generate(tree: Path, workdir: Path, url: str, records: int,
             concurrency: Optional[int]) -> Dict[str, float]:
    """One shard through ``tree``'s generator; its warmed-up rate, wall time and limit."""
    client = {"concurrency": concurrency} if concurrency else {}
    plan = recipe_plan(COLUMNS, records=records, gen_queue=256, max_retries=5,
                       request_timeout_s=600.0, **client)
    workdir.mkdir(parents=True)
    (workdir / "plan.json").write_text(plan.to_json())
    progress = workdir / "progress.json"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(tree),
           **ClientEnv(endpoints={"gen": url, "judge": url}, num_records=records,
                       output_dir=str(workdir / "out"),
                       progress_file=str(progress)).to_environ()}
    (workdir / "out").mkdir()
    started = time.monotonic()
    log = open(workdir / "generate.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "agent_stdlib", "generate", "--plan",
                             str(workdir / "plan.json")], env=env, cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=log)
    samples: List[Tuple[float, int]] = []
    limits: List[Tuple[int, int]] = []  # (records done, the limit then)
    while proc.poll() is None:
        try:
            last = read_json_or_none(progress) or {}
            samples.append((time.monotonic(), last["records_done"]))
            limits.append((last["records_done"], last["aliases"]["gen"]["concurrency"]))
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    wall = time.monotonic() - started
    log.close()
    if proc.returncode != 0:
        tail = (workdir / "generate.log").read_text(errors="replace").splitlines()[-3:]
        raise SystemExit(f"benchmark: generate exited {proc.returncode}: {' | '.join(tail)}")
    window = [(t, n) for t, n in samples if records * 0.25 <= n <= records * 0.95]
    rate = slope(window) if len({n for _, n in window}) > 2 else records / wall
    steady = [c for n, c in limits if records * 0.25 <= n <= records * 0.95] or [0]
    return {"rate": rate, "wall": wall, "limit": statistics.median(steady)}


def sweep(tmp: Path, before: Path, capacity: int, scale: float) -> bool:
    """Fixed points, after and before on one engine; prints one line; goal met?"""
    records = int(nominal(capacity) * SECONDS[capacity] * scale)
    points = sorted({capacity // 2, capacity, 2 * capacity, 256})
    proc, url = start_engine(tmp, capacity)
    try:
        fixed = {n: generate(REPO, tmp / f"c{capacity}-fixed{n}", url, records, n)
                 for n in points}
        after = generate(REPO, tmp / f"c{capacity}-after", url, records, None)
        old = generate(before, tmp / f"c{capacity}-before", url, records, None)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    best_n = max(fixed, key=lambda n: fixed[n]["rate"])
    best = fixed[best_n]["rate"]
    print(f"capacity {capacity:3d} ({records} records, nominal {nominal(capacity):.0f}/s): "
          f"fixed " + ", ".join(f"{n}: {r['rate']:.1f}" for n, r in fixed.items())
          + f" -> best {best:.1f} at {best_n}; after {after['rate']:.1f}/s = "
          f"{after['rate'] / best:.3f} of best (median limit {after['limit']:.0f}); before "
          f"{old['rate']:.1f}/s = {old['rate'] / best:.3f} (median limit "
          f"{old['limit']:.0f}); goal >= {GOAL}", flush=True)
    return after["rate"] / best >= GOAL


def job(tmp: Path, before: Path, runs: int) -> bool:
    """The 10 s job on the engine of capacity 128: ready -> last record vs nominal."""
    capacity = 128
    records = int(nominal(capacity) * 10)
    proc, url = start_engine(tmp, capacity)
    ratios: Dict[str, List[float]] = {"after": [], "before": [], "fixed": []}
    try:
        for number in range(runs):
            for name, tree, fixed in (("after", REPO, None), ("before", before, None),
                                      ("fixed", REPO, capacity)):
                r = generate(tree, tmp / f"job-{name}-{number}", url, records, fixed)
                ratios[name].append(records / r["wall"] / nominal(capacity))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    best = {name: max(values) for name, values in ratios.items()}
    print(f"10 s job, capacity {capacity} ({records} records, nominal "
          f"{nominal(capacity):.0f}/s): ready -> last record after "
          + ", ".join(f"{v:.3f}" for v in ratios["after"]) + " of nominal; before "
          + ", ".join(f"{v:.3f}" for v in ratios["before"]) + f"; fixed {capacity} (the "
          "best possible here: start-up and the fake engine's own overhead) "
          + ", ".join(f"{v:.3f}" for v in ratios["fixed"]) + f"; goal >= {JOB_GOAL}",
          flush=True)
    return best["after"] >= JOB_GOAL


def main(argv: Optional[List[str]] = None) -> int:
    """Run the sweeps and the 10 s job; print the ratios against the goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref measured as 'before'")
    parser.add_argument("--quick", action="store_true", help="half-length sweeps, 1 job run")
    parser.add_argument("--capacities", default="16,128,512")
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-conc-") as name:
        tmp = Path(name)
        before, commit = export(args.before, tmp / "before")
        print(f"engines: fake server, {TOKENS} tokens a request, overload slowdown "
              f"{SLOWDOWN} x waiting/capacity; before = {args.before} ({commit})",
              flush=True)
        for capacity in (int(c) for c in args.capacities.split(",") if c):
            ok = sweep(tmp, before, capacity, 0.5 if args.quick else 1.0) and ok
        ok = job(tmp, before, 1 if args.quick else 2) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
