"""Prefix-cache benchmark (issue 30): prompt layout, affinity routing and dispatch order
against the code at ``--before REF`` (default ``main``), side by side in one run.

The engine is the fake server's prefix cache model (``fixtures/fake_openai_server.py``,
this tree's for both sides): ``--replicas`` replicas, each with ``--capacity`` slots, a
per-replica LRU of ``--cache-blocks`` blocks of 16 tokens, ``--prefill-latency`` seconds per
*uncached* prompt token and ``--token-latency`` per output token (a token is a word). Each
side runs its own proxy (``python -m agent_stdlib proxy``, the replicas as backends) and
its own generator (``python -m agent_stdlib generate --plan``, client concurrency fixed at
2 x the replicas' slots so that the limiter is not what is measured), from this tree
(``after``) or from ``git archive REF`` (``before``); the replicas are restarted (cold
caches) for every measurement. Records/s is the shard's records over the generator's
wall time.

Workloads:

* ``grounded``: a distinct 2,000-token seed document per record; three LLM columns read it
  (a summary, a question, an answer to the question), a judge reads the answer. ``before``
  has the document at the start of each column's prompt (the best layout main allows) and
  the judge's rubric, question and answer as main lays them out; ``after`` declares the
  document as the recipe's ``context`` and the judge ``continue_from = "answer"``.
  Goal: >= 1.5x ``before``, and >= 0.9 of the *limit*: the records/s the replicas allow
  when every shared prefix is computed once per replica, i.e. the prompt tokens a record
  leaves uncached on one replica with an unbounded cache (measured: ``after``'s requests
  of a few records on one such replica, its ``vllm:prefix_cache_*`` counters) plus its
  output tokens, over the slots of all replicas.
* ``independent``: one LLM column, nothing shared. Goal: ``after`` >= 0.98x ``before``.
* ``shared system``: one system prompt (200 tokens) for every request, two columns.
  Goal: replicas' busy time (from their counters: prefill of uncached tokens + output)
  within 10% of each other.

``python benchmarks/prefix_cache.py [--records N] [--before REF]`` (~4 minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.trees import export  # noqa: E402
from synthbatch.agent_stdlib.clientenv import ClientEnv  # noqa: E402
from synthbatch.agent_stdlib.contracts import ColumnSpec, Plan, SeedDataSpec  # noqa: E402
from synthbatch.agent_stdlib.statefile import read_json_or_none  # noqa: E402
from tests.agent_runs import recipe_plan  # noqa: E402

FAKE_SERVER = REPO / "fixtures" / "fake_openai_server.py"
DOC_TOKENS = 2000
MAX_TOKENS = 4
SCHEMA = {"type": "object", "required": ["answer"], "properties": {"answer": {"type": "string"}}}
JUDGE = {"name": "grounded", "options": {"1": "grounded", "0": "not grounded"}}


def grounded(after: bool) -> Tuple[Tuple[ColumnSpec, ...], Dict[str, Any]]:
    """The document-grounded recipe as each side writes it (columns, client fields)."""
    doc = "" if after else "Document:\n{document}\n\n"
    columns = [
        ColumnSpec("summary", "llm-text", {"model": "gen", "max_tokens": MAX_TOKENS,
                                           "prompt": doc + "Summarize the document."}),
        ColumnSpec("question", "llm-text", {"model": "gen", "max_tokens": MAX_TOKENS,
                                            "prompt": doc + "Ask one question about it."}),
        ColumnSpec("answer", "llm-structured", {
            "model": "gen", "max_tokens": MAX_TOKENS, "schema": SCHEMA,
            "prompt": doc + "Answer from the document: {question}"}),
        ColumnSpec("grade", "llm-judge", {
            "model": "gen", "max_tokens": MAX_TOKENS, "scores": [JUDGE],
            "prompt": "Is that answer grounded in the document?" if after else
            "Question: {question}\nAnswer: {answer.answer}",
            **({"continue_from": "answer"} if after else {})}),
    ]
    return tuple(columns), ({"context": "Document:\n{document}"} if after else {})


def independent(after: bool) -> Tuple[Tuple[ColumnSpec, ...], Dict[str, Any]]:
    """One column, nothing shared between requests."""
    return (ColumnSpec("text", "llm-text", {"model": "gen", "max_tokens": 4 * MAX_TOKENS,
                                            "prompt": "Write about {index} " * 40}),), {}


SYSTEM = " ".join(f"rule{i}" for i in range(200))


def shared_system(after: bool) -> Tuple[Tuple[ColumnSpec, ...], Dict[str, Any]]:
    """Two columns under one system prompt that every request shares."""
    system = {} if after else {"system": SYSTEM}
    columns = (
        ColumnSpec("a", "llm-text", {"model": "gen", "max_tokens": 2 * MAX_TOKENS, **system,
                                     "prompt": "First about {index}."}),
        ColumnSpec("b", "llm-text", {"model": "gen", "max_tokens": 2 * MAX_TOKENS, **system,
                                     "prompt": "Second about {index}."}))
    return columns, ({"context": SYSTEM} if after else {})


WORKLOADS = {"grounded": grounded, "independent": independent,
             "shared system": shared_system}
RECORDS = {"grounded": 700, "independent": 1500, "shared system": 1500}


def seed_file(path: Path, rows: int) -> SeedDataSpec:
    """One distinct document of DOC_TOKENS words per row."""
    rng = random.Random(30)
    words = [f"w{i}" for i in range(5000)]
    with path.open("w") as out:
        for _ in range(rows):
            out.write(json.dumps({"document": " ".join(rng.choices(words, k=DOC_TOKENS))})
                      + "\n")
    return SeedDataSpec(str(path), "in-order", ("document",), rows=rows)


def plan_file(path: Path, workload: str, after: bool, records: int, seeds: SeedDataSpec,
              concurrency: int) -> None:
    """Write the plan of one side. Fields left at their default are left out (the
    client's ``context`` and ``reuse`` when empty, the plan's ``restarts_in_allocation``
    when 0): an older ``before`` tree has no such fields."""
    columns, client = WORKLOADS[workload](after)
    plan: Plan = recipe_plan(columns, records=records, concurrency=concurrency,
                             seed_data=seeds if workload == "grounded" else None,
                             max_retries=5, request_timeout_s=300.0, **client)
    plan = dataclasses.replace(plan, deployments=plan.deployments[:1])
    data = plan.to_dict()
    for key in ("context", "reuse"):
        if not data["client"].get(key):
            data["client"].pop(key, None)
    if not data.get("restarts_in_allocation"):
        data.pop("restarts_in_allocation", None)
    path.write_text(json.dumps(data))


class Engines:
    """The fake replicas (fresh caches)."""

    def __init__(self, workdir: Path, args: argparse.Namespace, count: int) -> None:
        self.procs, self.urls = [], []
        for i in range(count):
            port_file = workdir / f"engine-{i}.port"
            port_file.unlink(missing_ok=True)
            self.procs.append(subprocess.Popen(
                [sys.executable, str(FAKE_SERVER), "--port", "0", "--port-file",
                 str(port_file), "--model", "fake-model", "--max-concurrency",
                 str(args.capacity), "--token-latency", str(args.token_latency),
                 "--prefill-latency", str(args.prefill_latency), "--cache-blocks",
                 str(args.cache_blocks)], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
            while not port_file.exists():
                time.sleep(0.05)
            self.urls.append(f"http://127.0.0.1:{port_file.read_text().strip()}")

    def counters(self) -> List[Dict[str, float]]:
        """Per replica: prefix cache queries and hits, output tokens."""
        out = []
        for url in self.urls:
            text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            values: Dict[str, float] = {}
            for line in text.splitlines():
                if line and not line.startswith("#"):
                    name = line.split("{")[0].split(" ")[0]
                    values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            out.append(values)
        return out

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


def side(tree: Path, workdir: Path, plan: Path, engines: Engines,
         records: int, proxy_args: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """Run one side's proxy and generator against ``engines``; its figures
    (``proxy_args``: more flags for the proxy)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(tree),
           "HOME": str(workdir)}
    port_file = workdir / "proxy.port"
    port_file.unlink(missing_ok=True)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "agent_stdlib", "proxy", "--port-file", str(port_file)]
        + [a for url in engines.urls for a in ("--backend", url)] + list(proxy_args),
        cwd=tree, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists():
            time.sleep(0.05)
        out = workdir / "out"
        out.mkdir(exist_ok=True)
        env.update(ClientEnv(
            endpoints={"gen": f"http://127.0.0.1:{port_file.read_text().strip()}"},
            num_records=records, output_dir=str(out),
            progress_file=str(workdir / "progress.json")).to_environ())
        started = time.monotonic()
        done = subprocess.Popen([sys.executable, "-m", "agent_stdlib", "generate", "--plan",
                                 str(plan)], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=(workdir / "generate.log").open("w"))
        samples = []
        while done.poll() is None:
            try:
                samples.append((time.monotonic(), (read_json_or_none(
                    workdir / "progress.json") or {})["records_done"]))
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            raise SystemExit(f"generate ({tree}) exited {done.returncode}: "
                             f"{(workdir / 'generate.log').read_text()[-500:]}")
        metrics = ""
        try:
            metrics = urllib.request.urlopen(
                f"http://127.0.0.1:{port_file.read_text().strip()}/metrics",
                timeout=10).read().decode()
        except OSError:
            pass
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
    affinity = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines() if line.startswith(
                    "synthbatch_proxy_affinity_total{")}
    window = [(t, n) for t, n in samples if records * 0.25 <= n <= records * 0.95]
    return {"rate": slope(window) if len(window) > 2 else records / seconds,
            "seconds": seconds, "affinity": affinity}


def slope(points: List[Tuple[float, int]]) -> float:
    """Least-squares slope of (time, records done): the steady rate, start and tail left
    out (as benchmarks/generator.py measures it)."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_c = sum(c for _, c in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (c - mean_c) for t, c in points) / var


def busy(counters: Dict[str, float], args: argparse.Namespace) -> float:
    """A replica's busy slot-seconds by the model: uncached prompt tokens and output."""
    uncached = counters.get("vllm:prefix_cache_queries_total", 0.0) - counters.get(
        "vllm:prefix_cache_hits_total", 0.0)
    return (uncached * args.prefill_latency
            + counters.get("vllm:generation_tokens_total", 0.0) * args.token_latency)


def hit_rate(rows: List[Dict[str, float]]) -> float:
    queries = sum(r.get("vllm:prefix_cache_queries_total", 0.0) for r in rows)
    return sum(r.get("vllm:prefix_cache_hits_total", 0.0) for r in rows) / max(1.0, queries)


def measure(workload: str, trees: Dict[str, Path], workdir: Path, args: argparse.Namespace,
            seeds: SeedDataSpec) -> Dict[str, Dict[str, Any]]:
    """Both sides of one workload, each on fresh replicas."""
    results = {}
    for name, tree in trees.items():
        folder = workdir / f"{workload.replace(' ', '-')}-{name}"
        folder.mkdir()
        plan = folder / "plan.json"
        records = args.records or RECORDS[workload]
        plan_file(plan, workload, name == "after", records, seeds,
                  2 * args.replicas * args.capacity)
        engines = Engines(folder, args, args.replicas)
        try:
            result = side(tree, folder, plan, engines, records)
            result["replicas"] = engines.counters()
        finally:
            engines.stop()
        result["busy"] = [busy(r, args) for r in result["replicas"]]
        result["utilization"] = sum(result["busy"]) / (
            args.replicas * args.capacity * result["seconds"])
        result["hit_rate"] = hit_rate(result["replicas"])
        results[name] = result
    return results


def limit(tree: Path, workdir: Path, args: argparse.Namespace, seeds: SeedDataSpec) -> float:
    """Records/s when every shared prefix is computed once per replica (see the module
    docstring): a few records on one replica with an unbounded cache and no latency."""
    folder = workdir / "limit"
    folder.mkdir()
    sample = 20
    plan = folder / "plan.json"
    plan_file(plan, "grounded", True, sample, seeds, 8)
    quick = argparse.Namespace(**{**vars(args), "token_latency": 0.0, "prefill_latency": 0.0,
                                  "cache_blocks": 10 ** 7})
    engines = Engines(folder, quick, 1)
    try:
        side(tree, folder, plan, engines, sample)
        counters = engines.counters()[0]
    finally:
        engines.stop()
    per_record = busy(counters, args) / sample
    return args.replicas * args.capacity / per_record


def main(argv: Optional[List[str]] = None) -> int:
    """Run the workloads and print each goal's ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="git ref of the 'before' code")
    parser.add_argument("--records", type=int, default=0,
                        help="records a run (default: per workload, ~15-30 s each)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=16,
                        help="slots per replica (16: the engines, not this 2-core "
                             "machine's CPU, are the bottleneck)")
    parser.add_argument("--token-latency", type=float, default=0.05)
    parser.add_argument("--prefill-latency", type=float, default=0.0005)
    parser.add_argument("--cache-blocks", type=int, default=8192)
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    args = parser.parse_args(argv)
    ok = True
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-prefix-") as tmp:
        workdir = Path(tmp)
        before, commit = export(args.before, workdir / "before")
        trees = {"before": before, "after": REPO}
        seeds = seed_file(workdir / "docs.jsonl", args.records or RECORDS["grounded"])
        print(f"engine: {args.replicas} fake replicas x {args.capacity} slots, "
              f"{args.prefill_latency:g} s per uncached prompt token, {args.token_latency:g} s "
              f"per output token, {args.cache_blocks} blocks of 16 tokens each; before = "
              f"{args.before} ({commit})", flush=True)
        for workload in args.only:
            r = measure(workload, trees, workdir, args, seeds)
            b, a = r["before"], r["after"]
            ratio = a["rate"] / b["rate"]
            spread = (max(a["busy"]) - min(a["busy"])) / max(a["busy"])
            line = (f"{workload:13s}: before {b['rate']:7.2f} records/s (hit rate "
                    f"{b['hit_rate']:.2f}), after {a['rate']:7.2f} (hit rate "
                    f"{a['hit_rate']:.2f}, affinity {a['affinity'] or 'none'}, engine busy "
                    f"{a['utilization']:.2f} of its slots) -> "
                    f"{ratio:.3f}x; replicas' busy time spread {spread:.3f} (before "
                    f"{(max(b['busy']) - min(b['busy'])) / max(b['busy']):.3f})")
            if workload == "grounded":
                ceiling = limit(REPO, workdir, args, seeds)
                line += (f"; limit {ceiling:.2f} records/s -> {a['rate'] / ceiling:.3f} "
                         f"(goals >= 1.5x, >= 0.9)")
                ok = ok and ratio >= 1.5 and a["rate"] / ceiling >= 0.9
            elif workload == "independent":
                line += " (goal >= 0.98x)"
                ok = ok and ratio >= 0.98
            else:
                line += " (goal spread <= 0.10)"
                ok = ok and spread <= 0.10
            print(line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
