"""Benchmark of the allocation agent's runtime figures (issue 5).

Runs the real rendered batch script with bash (sha256 checks, shiv extraction on scratch,
``exec python -I agent.pyz allocation``) against a plan whose steps are local processes,
so the figures measure the agent and not the scheduler:

* batch start -> first server step launched (its log file created)  goal <= 1 s
* agent RSS while serving (VmRSS and peak VmHWM of the agent process)  goal <= 40 MB
* SIGTERM -> every child gone and readiness ``stopped``                goal <= grace + 1 s

Usage: ``python benchmarks/agent.py [--runs N]``. Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synthbatch.agent_stdlib.attempts import load_readiness  # noqa: E402
from synthbatch.agent_stdlib.layout import RunLayout  # noqa: E402
from synthbatch.agent_stdlib.states import READINESS_CLOSED  # noqa: E402
from synthbatch.control.bundle import build_agent_bundle  # noqa: E402
from tests.agent_runs import local_plan, stage_batch  # noqa: E402

FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
GRACE_S = 3.0
GOALS = {"start_to_server_s": 1.0, "rss_mb": 40.0, "sigterm_to_stopped_s": GRACE_S + 1.0}


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark: timed out waiting for {what}")
        time.sleep(0.002)
    return time.monotonic()


def _rss_mb(pid: int) -> Dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024.0
    return fields


def _descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pids: List[int]) -> bool:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            return True
    return False


def _stage(root: Path, pyz: Path) -> Path:
    command = [sys.executable, str(FAKE_SERVER), "--host", "{host}", "--port", "{port}",
               "--model", "fake-model", "--token-latency", "0.05"]
    plan = local_plan(sys.executable, command, records=300)
    plan = plan.replace(runtime=dataclasses.replace(plan.runtime, grace_s=GRACE_S))
    return stage_batch(root, pyz, plan)


def _readiness(path: Path) -> Optional[str]:
    try:
        record = load_readiness(path)
    except Exception:  # noqa: BLE001 - mid-replace: try again
        return None
    return record.state if record else None


def one_run(workdir: Path, pyz: Path) -> Dict[str, float]:
    """Run the batch script once; return the three figures."""
    root = workdir / "run"
    script = _stage(root, pyz)
    paths = RunLayout(root).attempt(0, 1)
    server_log = paths.execution_logs(1) / "server-tiny-0.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
           "SLURM_TMPDIR": str(workdir / "scratch"), "SLURM_ARRAY_TASK_ID": "0"}
    (workdir / "scratch").mkdir()
    started = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=workdir)
    launched = _wait(server_log.exists, 30, "the first server")
    _wait(lambda: _readiness(paths.readiness_json) == "ready", 60, "readiness ready")
    time.sleep(0.5)  # the client step is generating
    rss = _rss_mb(proc.pid)
    children = _descendants(proc.pid)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stopped = _wait(lambda: _readiness(paths.readiness_json) in READINESS_CLOSED
                    and not _alive(children), 30, "readiness stopped and children gone")
    proc.communicate(timeout=30)
    return {"start_to_server_s": launched - started, "rss_mb": rss["VmRSS"],
            "rss_peak_mb": rss["VmHWM"], "sigterm_to_stopped_s": stopped - signalled}


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark and print the figures against the goals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-") as tmp:
        pyz = build_agent_bundle(Path(tmp) / "bundle")
        results = []
        for number in range(args.runs):
            workdir = Path(tmp) / f"run-{number}"
            workdir.mkdir()
            figures = one_run(workdir, pyz)
            results.append(figures)
            print(f"run {number + 1}: "
                  + "  ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)
    print(f"medians over {args.runs} runs (grace {GRACE_S:g} s):")
    ok = True
    for key in results[0]:
        median = statistics.median(r[key] for r in results)
        goal = GOALS.get(key, GOALS.get("rss_mb") if key.startswith("rss") else None)
        verdict = "" if goal is None else ("ok" if median <= goal else "OVER")
        ok = ok and verdict != "OVER"
        print(f"  {key:24s} {median:8.3f}   goal <= {goal:g}  {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
