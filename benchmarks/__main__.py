"""The project's performance suite: ``python -m benchmarks all`` (``make bench``).

Runs each benchmark of this folder as its own process, in turn (never two at once: every
figure is a ratio measured side by side inside one benchmark, and two benchmarks at once
would measure each other), and writes ``benchmarks/results/latest.json``: the machine
(CPUs, load, Python, kernel), and per benchmark its command, exit status, seconds and the
summary lines it printed (each ratio with the absolute values beside it, as the benchmark
prints them). ``--only NAME`` reruns some and keeps the others' last records. A benchmark
whose tools are missing (nginx and wrk for the proxy, a Slurm testbed for status and
submit) is recorded as skipped, with the reason.

    python -m benchmarks all [--quick] [--only NAME ...] [--output PATH]
    python -m benchmarks list
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "latest.json"


def _tools(*names: str) -> Optional[str]:
    missing = [n for n in names if shutil.which(n) is None]
    return f"missing {', '.join(missing)} (Debian: apt-get install -y {' '.join(missing)})" \
        if missing else None


def _slurm() -> Optional[str]:
    if os.environ.get("SLURM_CONF") and shutil.which("squeue"):
        return None
    return "no Slurm testbed in the environment (. scripts/testbed-env first)"


# name -> (script, full argv, --quick argv, the goal it is judged on, why it cannot run)
SUITE: Dict[str, Tuple[str, List[str], List[str], str, Callable[[], Optional[str]]]] = {
    "proxy": ("proxy.py", [], ["--quick"],
              "short req/s >= 0.6 of nginx; streaming >= 0.97 of direct, 0 lost",
              lambda: _tools("nginx", "wrk")),
    "status": ("status_scale.py", [], ["--shards", "2000", "--repeat", "3"],
               "status --json: files opened <= unsettled shards + 20; <= 0.5 s at 100,000 "
               "settled shards", _slurm),
    "submit_merge": ("submit_merge.py", [], ["--submit", "1000:0", "--merge-shards", "200",
                                             "--records-per-shard", "500"],
                     "submit of 10,000 / 100,000 shards <= 3 / 30 s; merge >= 0.7 of cat",
                     _slurm),
    "agent": ("agent.py", [], ["--runs", "1"],
              "first server step <= 1 s; RSS <= 40 MB; stop <= grace + 1 s", lambda: None),
    "generator": ("generator.py", [], ["--runs", "1"],
                  "generator >= 0.95 of the engine alone", lambda: None),
    "layout": ("layout_split.py", [], ["--records", "60", "--pilot-records", "40"],
               "automatic and pilot writer/judge splits >= 0.9 of the best split's "
               "records/s",
               lambda: None),
    "merge_parquet": ("merge_parquet.py", [], ["--records", "20000", "--rounds", "1"],
                      "merge to parquet >= 0.5 of pyarrow directly; working memory at 2x "
                      "the records <= 1.15x", lambda: None),
    "rejection": ("rejection.py", [], ["--repeat", "1"],
                  "each rejection of a hostile file and each redaction < 0.5 s CPU",
                  lambda: None),
    "prefix_cache": ("prefix_cache.py", [], ["--only", "grounded"],
                     "grounded >= 1.5x main and >= 0.9 of the limit; independent >= 0.98x; "
                     "shared system prompt: replicas' busy time within 10%", lambda: None),
    "telemetry": ("telemetry.py", [], ["--runs", "1", "--records", "1500"],
                  "records/s with serving telemetry sampled >= 0.99 of without; <= 1 MB "
                  "of telemetry state per shard-hour", lambda: None),
    "concurrency": ("concurrency.py", [], ["--quick"],
                    "default concurrency >= 0.95 of the best fixed (capacity 16/128/512, "
                    "slowing when over-queued); 10 s job >= 0.93 of nominal", lambda: None),
    "reuse": ("reuse.py", [], ["--records", "20000"],
              "rerun reusing every cell <= 0.05 of the first run's wall time (100,000 "
              "records, 1 s per request); each reused record read once", lambda: None),
    "ramp_model": ("ramp_model.py", [], [],
                   "the 10 s job on a model of the fake engine (no machine load) >= 0.93 "
                   "of nominal", lambda: None),
}


def machine() -> Dict[str, object]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "load_average": os.getloadavg(),
            "python": platform.python_version(), "kernel": platform.release(),
            "platform": platform.platform(), "measured_at": time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def summary(output: str) -> List[str]:
    """The lines a reader compares: ratios, goals, medians (at most 40)."""
    keys = ("ratio", "goal", "vs ", "->", "records/s", "ms", " MB", "median", "ok", "MISS",
            "OVER", "target")
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    return [line for line in lines if any(k in line for k in keys)][-40:]


def run_one(name: str, quick: bool) -> Dict[str, object]:
    """Run one benchmark; its record for latest.json."""
    script, full, short, goal, blocker = SUITE[name]
    argv = [sys.executable, str(HERE / script), *(short if quick else full)]
    record: Dict[str, object] = {"name": name, "argv": argv[1:], "goal": goal,
                                 "quick": quick}
    why = blocker()
    if why:
        return {**record, "status": "skipped", "why": why}
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out:
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT, cwd=HERE.parent)
        out.seek(0)
        text = out.read()
    print(text, end="", flush=True)
    return {**record, "status": "ok" if code == 0 else "failed", "exit_code": code,
            "seconds": round(time.monotonic() - started, 1), "summary": summary(text)}


def _previous(path: Path) -> List[Dict[str, object]]:
    from synthbatch.agent_stdlib.statefile import read_json_or_none

    found = (read_json_or_none(path) or {}).get("benchmarks")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def main(argv: Optional[List[str]] = None) -> int:
    """``all``: run the suite and write the results; ``list``: name the benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("all", "list"))
    parser.add_argument("--quick", action="store_true", help="shorter runs of each")
    parser.add_argument("--only", nargs="+", choices=sorted(SUITE), default=None)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, (script, _, _, goal, _) in SUITE.items():
            print(f"{name:13s} benchmarks/{script:17s} goal: {goal}")
        return 0
    results = []
    for name in args.only or list(SUITE):
        print(f"== {name}", flush=True)
        results.append(run_one(name, args.quick))
        print(f"== {name}: {results[-1]['status']}"
              + (f" ({results[-1]['why']})" if results[-1].get("why") else ""), flush=True)
    if args.only:  # keep the other benchmarks' last figures
        results = [r for r in _previous(args.output) if r.get("name") not in args.only] \
            + results
    args.output.parent.mkdir(parents=True, exist_ok=True)
    temp = args.output.with_suffix(".tmp")
    temp.write_text(json.dumps({"machine": machine(), "benchmarks": results}, indent=2) + "\n")
    os.replace(temp, args.output)
    print(f"wrote {args.output}")
    return 0 if all(r["status"] != "failed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
