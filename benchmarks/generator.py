"""Benchmark of the built-in generator against an engine whose ceiling is known (issue 15).

The engine is the fake server with a fixed capacity (``--max-concurrency 128``: 128
requests generate at once, the rest wait in its FIFO queue) and a fixed cost per request
(``max_tokens`` x ``--token-latency``), so its ceiling is exactly
``128 / (max_tokens x token_latency)`` requests per second, and a recipe's ceiling in
records per second is that divided by the requests a record makes (weighted by their
tokens). The real batch script runs with bash (sha256 checks, shiv extraction,
``exec python -I agent.pyz allocation``) against a plan whose steps are local processes:
allocation agent -> fake server -> proxy -> the ``generate`` role, with the client's
concurrency left at its default (adaptive). Two recipes: one LLM column, and a three-column
chain (question -> structured answer -> judge) on the same deployment.

The fake engine is Python too: on a busy machine its own per-request overhead (thread
wake-ups, oversleeping each token) keeps it below the nominal ceiling. So the engine is
first measured alone: a minimal asyncio client with 2 x capacity kept-alive connections
saturates a fresh fake server for 30 s, and what it gets is the engine's measured
ceiling. The goal (>= 0.95) is judged against that; the nominal ratio is printed beside it.

Rounds alternate the two measurements (engine alone, then the generator) and the ratio is
the median of the per-round ratios: this machine is shared, and its load moves the fake
engine's own speed by more than the goal's margin. ``--pin`` runs the engine on
``--engine-cpu`` and everything else on ``--load-cpu`` (as ``benchmarks/proxy.py`` does);
on a shared machine that starves whichever core other work lands on, so it is off by
default.

Printed per recipe: the warmed-up rate (records/s between 25% and 95% of the shard: the
least-squares slope of the client's own progress.json, sampled every 0.1 s), its ratios
to the measured and the nominal ceiling, boot time (batch script start -> first record
written) and what the client ended at (concurrency per alias, errors). Usage:
``python benchmarks/generator.py [--runs N] [--pin]`` (~12 minutes with 3 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan  # noqa: E402
from synthbatch.agent_stdlib.layout import RunLayout  # noqa: E402
from synthbatch.agent_stdlib.statefile import read_json_or_none  # noqa: E402
from synthbatch.control.bundle import build_agent_bundle  # noqa: E402
from tests.agent_runs import recipe_plan, stage_batch  # noqa: E402

FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
CAPACITY = 128
TOKEN_LATENCY_S = 0.25  # x 4 tokens: 1 s a request, 512 wake-ups a second at capacity
GOAL = 0.95

ONE = (ColumnSpec("text", "llm-text", {"model": "gen", "prompt": "Write about {index}.",
                                       "max_tokens": 4}),)
CHAIN = (
    ColumnSpec("level", "category", {"values": ["beginner", "expert"]}),
    ColumnSpec("question", "llm-text", {"model": "gen", "max_tokens": 4,
                                        "prompt": "Write one {level} question, #{index}."}),
    ColumnSpec("answer", "llm-structured", {
        "model": "gen", "prompt": "Answer: {question}", "max_tokens": 4,
        "schema": {"type": "object", "required": ["answer"],
                   "properties": {"answer": {"type": "string"}}}}),
    ColumnSpec("grade", "llm-judge", {
        "model": "gen", "prompt": "Q: {question}\nA: {answer.answer}", "max_tokens": 4,
        "scores": [{"name": "correct", "options": {"1": "yes", "0": "no"}}]}),
)
RECIPES = {"one column": (ONE, 6000), "three columns": (CHAIN, 2000)}


def ceiling(columns: Tuple[ColumnSpec, ...]) -> float:
    """Records per second the engine allows: its capacity over a record's token time."""
    seconds = sum(c.params["max_tokens"] * TOKEN_LATENCY_S for c in columns
                  if c.type.startswith("llm-"))
    return CAPACITY / seconds


ENGINE_CPU: List[str] = []  # ["taskset", "-c", "<cpu>"] when pinning


def _engine_command(host: str, port: str) -> Tuple[str, ...]:
    return (*ENGINE_CPU, sys.executable, str(FAKE_SERVER), "--host", host, "--port", port,
            "--model", "fake-model", "--max-concurrency", str(CAPACITY), "--token-latency",
            str(TOKEN_LATENCY_S))


async def _saturate(port: int, seconds: float) -> float:
    """Requests per second the engine answers to 2 x CAPACITY kept-alive connections
    (the first 4 s left out)."""
    body = json.dumps({"model": "fake-model", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "x"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    done: List[float] = []
    start = time.monotonic()

    async def connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < start + seconds:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            done.append(time.monotonic())
        writer.close()

    await asyncio.gather(*(connection() for _ in range(2 * CAPACITY)))
    counted = sorted(t for t in done if start + 4 <= t <= start + seconds - 1)
    return slope([(t, n) for n, t in enumerate(counted)])


def slope(points: List[Tuple[float, int]]) -> float:
    """Least-squares slope of (time, count): a fixed-cost engine answers in waves of up to
    CAPACITY, and a fit over the whole window is not thrown off by where its edges cut a
    wave (a difference of two samples is, by up to a wave)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_c = sum(c for _, c in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (c - mean_c) for t, c in points) / var


def engine_ceiling(workdir: Path, seconds: float = 30.0) -> float:
    """The fake engine's own requests per second, measured alone."""
    port_file = workdir / "engine.port"
    server = subprocess.Popen([*_engine_command("127.0.0.1", "0"), "--port-file",
                               str(port_file)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists():
            time.sleep(0.05)
        return asyncio.run(_saturate(int(port_file.read_text()), seconds))
    finally:
        server.terminate()
        server.wait(timeout=10)


def _plan(columns: Tuple[ColumnSpec, ...], records: int) -> Plan:
    command = _engine_command("{host}", "{port}")
    plan = recipe_plan(columns, records=records, gen_queue=256, max_retries=5,
                       request_timeout_s=120.0)
    gen = dataclasses.replace(plan.deployments[0], command=command, startup_timeout_s=30.0)
    return dataclasses.replace(plan, deployments=(gen,))


def _progress(path: Path) -> Optional[Dict[str, Any]]:
    return read_json_or_none(path)


def one_run(workdir: Path, pyz: Path, columns: Tuple[ColumnSpec, ...],
            records: int, extra_env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Run one shard of ``records`` through the real batch script (``extra_env`` added to
    its environment); its figures."""
    root = workdir / "run"
    script = stage_batch(root, pyz, _plan(columns, records))
    paths = RunLayout(root).attempt(0, 1)
    output = paths.output / "records-000000000000.jsonl"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
           "SLURM_TMPDIR": str(workdir / "scratch"), "SLURM_ARRAY_TASK_ID": "0",
           **(extra_env or {})}
    (workdir / "scratch").mkdir()
    started = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=workdir)
    first: Optional[float] = None
    samples: List[Tuple[float, int]] = []
    last: Dict[str, Any] = {}
    while proc.poll() is None:
        now = time.monotonic()
        if first is None and output.exists() and output.stat().st_size:
            first = now
        data = _progress(paths.progress_json)
        if data:
            samples.append((now, data["records_done"]))
            last = data
        time.sleep(0.1)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark: the allocation exited {proc.returncode}; see {root}")
    window = [(t, n) for t, n in samples if records * 0.25 <= n <= records * 0.95]
    gen = last.get("aliases", {}).get("gen", {})
    return {"boot_s": (first or started) - started, "rate": slope(window),
            "concurrency": gen.get("concurrency"), "errors": gen.get("errors", {})}


def main(argv: Optional[List[str]] = None) -> int:
    """Run both recipes and print the ratios against the goal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="rounds per recipe")
    parser.add_argument("--pin", action="store_true", help="engine and the rest on two cpus")
    parser.add_argument("--engine-cpu", type=int, default=1)
    parser.add_argument("--load-cpu", type=int, default=0)
    args = parser.parse_args(argv)
    if args.pin and shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        os.sched_setaffinity(0, {args.load_cpu})  # children (bash, the agent) inherit it
        ENGINE_CPU[:] = ["taskset", "-c", str(args.engine_cpu)]
    ok = True
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-gen-") as tmp:
        pyz = build_agent_bundle(Path(tmp) / "bundle")
        print(f"engine: fake server, capacity {CAPACITY} requests, {TOKEN_LATENCY_S:g} s per "
              f"token, max_tokens 4 a request; client concurrency: default (adaptive); "
              + (f"engine on cpu {args.engine_cpu}, the rest on cpu {args.load_cpu}"
                 if ENGINE_CPU else "unpinned"))
        for name, (columns, records) in RECIPES.items():
            results, measured = [], []
            for number in range(args.runs):
                workdir = Path(tmp) / f"{name.replace(' ', '-')}-{number}"
                workdir.mkdir()
                # requests/s alone, as records/s of this recipe (its requests cost alike)
                requests = sum(c.type.startswith("llm-") for c in columns)
                measured.append(engine_ceiling(workdir) / requests)
                results.append(one_run(workdir, pyz, columns, records))
            rate = statistics.median(r["rate"] for r in results)
            boot = statistics.median(r["boot_s"] for r in results)
            engine = statistics.median(measured)
            ratios = [r["rate"] / m for r, m in zip(results, measured)]
            ratio = statistics.median(ratios)
            ok = ok and ratio >= GOAL
            print(f"{name:14s} {records:5d} records: {rate:7.2f} records/s; engine alone "
                  f"{engine:6.2f} -> {ratio:.3f} (rounds "
                  f"{', '.join(f'{r:.3f}' for r in ratios)}; goal >= {GOAL}); nominal "
                  f"{ceiling(columns):6.2f} -> {rate / ceiling(columns):.3f}; boot "
                  f"{boot:.2f} s; client ended at concurrency {results[-1]['concurrency']}, "
                  f"errors {results[-1]['errors'] or 'none'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
