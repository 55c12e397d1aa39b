"""The adaptive concurrency's ramp on a model of the fake engine, free of the machine's
load (issue 30): ``LatencyLimit`` of this tree and of ``--before REF`` side by side.

A time-stepped simulation (``--dt`` seconds a step) of ``benchmarks/concurrency.py``'s
engines: ``capacity`` requests run at once, the rest wait in a FIFO queue, and while W
wait every running request's tokens take ``overload_factor(0.05, W, capacity)`` (the
fake server's own rule) times longer; 4 tokens a request. The client keeps
``int(limit)`` requests out and feeds each answer's latency to the rule. No Python
start-up, no HTTP, no other process: what is left is the rule's own cost.

Printed per engine: ready -> last record of the 10 s job (capacity 128, 1,280 records)
and of each steady sweep's shard, as a ratio of the engine's nominal rate, for
``after``, ``before`` and fixed ``capacity``; and the steady rate (least-squares slope
between 25% and 95% of the records) of each.
Goal: the 10 s job ``after`` >= 0.93 of nominal (exit status 1 if not).
Usage: ``python benchmarks/ramp_model.py [--before REF]`` (seconds).
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import inspect
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.concurrency import (  # noqa: E402
    ENGINES,
    JOB_GOAL,
    SECONDS,
    SLOWDOWN,
    TOKENS,
    nominal,
)
from benchmarks.generator import slope  # noqa: E402
from benchmarks.trees import export  # noqa: E402
from fixtures.fake_openai_server import overload_factor  # noqa: E402


def rule_class(tree: Path) -> Any:
    """``LatencyLimit`` of the tree at ``tree`` (loaded from its file: standard library
    only, no relative imports)."""
    path = tree / "agent_stdlib" / "client" / "concurrency.py"
    spec = importlib.util.spec_from_file_location(f"concurrency_{abs(hash(tree))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.LatencyLimit


def simulate(rule: Any, capacity: int, records: int, fixed: Optional[int] = None,
             dt: float = 0.002) -> Tuple[float, List[Tuple[float, int]]]:
    """One shard against the model; (seconds to the last record, (time, done) samples)."""
    limit = rule(128, 1024) if rule else None  # sizing.bounds of one replica
    timed = limit is not None and "now" in inspect.signature(limit.answered).parameters
    token_s = ENGINES[capacity]
    now, sent, done, out = 0.0, 0, 0, 0
    running: List[List[float]] = []  # [tokens done, sent at]
    queue: collections.deque = collections.deque()
    samples: List[Tuple[float, int]] = []

    def send() -> None:
        nonlocal sent, out
        while sent < records and out < (fixed or int(limit.limit)):
            out, sent = out + 1, sent + 1
            (running if len(running) < capacity else queue).append([0.0, now])

    send()
    while done < records:
        now += dt
        step = dt / (token_s * overload_factor(SLOWDOWN, len(queue), capacity))
        finished = []
        for item in running:
            item[0] += step
            if item[0] >= TOKENS:
                finished.append(item)
        for item in finished:
            running.remove(item)
            if queue:
                running.append(queue.popleft())
        for item in finished:
            if limit is not None:
                extra = {"now": now} if timed else {}
                limit.answered(now - item[1], out, **extra)
            out, done = out - 1, done + 1
            send()
        samples.append((now, done))
    return now, samples


def figures(rule: Any, capacity: int, records: int, fixed: Optional[int] = None,
            dt: float = 0.002) -> Dict[str, float]:
    """Ready -> last record vs nominal, and the steady rate (25-95%)."""
    wall, samples = simulate(rule, capacity, records, fixed, dt)
    window = [(t, n) for t, n in samples if records * 0.25 <= n <= records * 0.95]
    return {"job": records / wall / nominal(capacity), "steady": slope(window[::10])}


def main(argv: Optional[List[str]] = None) -> int:
    """Print the model's figures for after, before and fixed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref measured as 'before'")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-ramp-") as tmp:
        before_tree, commit = export(args.before, Path(tmp) / "before")
        rules = {"after": rule_class(REPO), f"before ({commit})": rule_class(before_tree)}
        cases = [(128, int(nominal(128) * 10), 0.002)] + [
            (c, int(nominal(c) * SECONDS[c]), 0.002 if c < 512 else 0.01) for c in ENGINES]
        ok = True
        for number, (capacity, records, dt) in enumerate(cases):
            rows = {name: figures(rule, capacity, records, None, dt)
                    for name, rule in rules.items()}
            ok = ok and (number > 0 or rows["after"]["job"] >= JOB_GOAL)
            rows[f"fixed {capacity}"] = figures(None, capacity, records, capacity, dt)
            print(f"capacity {capacity} ({records} records, nominal "
                  f"{nominal(capacity):.0f}/s): " + "; ".join(
                      f"{name} ready -> last {r['job']:.3f} of nominal, steady "
                      f"{r['steady']:.1f}/s" for name, r in rows.items())
                  + (f"; goal >= {JOB_GOAL}" if number == 0 else ""), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
