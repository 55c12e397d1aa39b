"""Benchmark of the agent's serving telemetry (issue 32): records/s with and without it.

The generator benchmark's setup (``benchmarks/generator.py``: the real batch script, the
agent, a fake engine at its capacity of 128 requests, the adaptive client, one LLM
column) runs the same shard with sampling off (``SYNTHBATCH_TELEMETRY_S=0``) and on at the
default interval (5 s), alternating within each round, and prints the ratio of the
records/s (median of the per-round ratios; goal >= 0.99), plus an ``info`` line at a 1 s
interval (five times the default's work). It also prints the size of ``telemetry.json``
at the end of each run and what one shard-hour makes of it: bytes per series point (the
file's size over its points) x the points of an hour (capped at the ring's ``MAX_POINTS``)
plus the rest of the file; goal <= 1 MB. Last, an ``info`` line: the sampler's own CPU
time per replica sample (``time.process_time`` over 200 rounds against a fake engine in
another process: one GET of /metrics, the parse, the rewrite of telemetry.json) as a share
of one core at the default interval: what the records/s ratio cannot resolve below its
noise. Usage:
``python benchmarks/telemetry.py [--runs N] [--records N]`` (~4 minutes at 3 rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.generator import FAKE_SERVER, ONE, one_run  # noqa: E402
from synthbatch.agent_stdlib.allocation.telemetry import (  # noqa: E402
    INTERVAL_ENV,
    INTERVAL_S,
    MAX_POINTS,
    Telemetry,
)
from synthbatch.agent_stdlib.layout import RunLayout  # noqa: E402
from synthbatch.agent_stdlib.statefile import read_bytes  # noqa: E402
from synthbatch.control.bundle import build_agent_bundle  # noqa: E402

GOAL = 0.99
MAX_BYTES_PER_HOUR = 1024 * 1024
SETTINGS = {"off": "0", "default": str(INTERVAL_S), "1 s": "1"}


def hour_bytes(path: Path) -> Dict[str, float]:
    """The telemetry file's size, its points, and its size after one hour of samples."""
    raw = read_bytes(path) or b"{}"
    data = json.loads(raw)
    points = len(data["series"])
    per_point = len(json.dumps(data["series"], separators=(",", ":"))) / max(1, points)
    interval = data["interval_s"] or INTERVAL_S
    hour_points = min(MAX_POINTS, int(3600 / interval))
    rest = len(raw) - per_point * points
    return {"bytes": len(raw), "points": points,
            "hour_bytes": rest + per_point * hour_points}


def sample_cpu_s(workdir: Path, rounds: int = 200) -> float:
    """The sampler's CPU seconds per replica sample, against a fake engine (its own
    process) with 128 requests' worth of counters."""
    port_file = workdir / "engine.port"
    server = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--port", "0", "--port-file",
                               str(port_file), "--max-concurrency", "128"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        telemetry = Telemetry(workdir / "telemetry.json", interval=0)
        telemetry.start({"gen": [url]}, {})
        telemetry.sample()
        before = time.process_time()
        for _ in range(rounds):
            telemetry.sample()
        return (time.process_time() - before) / rounds
    finally:
        server.terminate()
        server.wait(timeout=10)


def main(argv: Optional[List[str]] = None) -> int:
    """Alternate the settings for ``--runs`` rounds; print the ratios and the bound."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds (each runs every setting)")
    parser.add_argument("--records", type=int, default=3000)
    args = parser.parse_args(argv)
    rates: Dict[str, List[float]] = {name: [] for name in SETTINGS}
    sizes: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-telemetry-") as tmp:
        pyz = build_agent_bundle(Path(tmp) / "bundle")
        for number in range(args.runs):
            order = list(SETTINGS) if number % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                workdir = Path(tmp) / f"{name.replace(' ', '-')}-{number}"
                workdir.mkdir()
                result = one_run(workdir, pyz, ONE, args.records,
                                 {INTERVAL_ENV: SETTINGS[name]})
                rates[name].append(result["rate"])
                path = RunLayout(workdir / "run").attempt(0, 1).telemetry_json
                sizes[name] = hour_bytes(path)
                print(f"round {number + 1} {name:8s}: {result['rate']:7.2f} records/s, "
                      f"telemetry.json {sizes[name]['bytes']:.0f} bytes "
                      f"({sizes[name]['points']:.0f} points)", flush=True)
    ok = True
    for name in ("default", "1 s"):
        ratios = [on / off for on, off in zip(rates[name], rates["off"])]
        ratio = statistics.median(ratios)
        verdict = ("ok" if ratio >= GOAL else "UNDER") if name == "default" else "info"
        ok = ok and verdict != "UNDER"
        print(f"sampling {name:8s}: {statistics.median(rates[name]):7.2f} records/s vs off "
              f"{statistics.median(rates['off']):7.2f} -> {ratio:.4f} (rounds "
              f"{', '.join(f'{r:.4f}' for r in ratios)}; goal >= {GOAL}) {verdict}")
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-telemetry-cpu-") as tmp:
        cpu = sample_cpu_s(Path(tmp))
    print(f"sampler CPU: {cpu * 1000:.2f} ms per replica sample = "
          f"{cpu / INTERVAL_S:.4%} of one core at {INTERVAL_S:g} s per replica (info)")
    hour = sizes["default"]["hour_bytes"]
    ok = ok and hour <= MAX_BYTES_PER_HOUR
    print(f"state per shard-hour at {INTERVAL_S:g} s (1 replica): {hour / 1024:.1f} KB "
          f"(goal <= {MAX_BYTES_PER_HOUR // 1024} KB) "
          + ("ok" if hour <= MAX_BYTES_PER_HOUR else "OVER"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
