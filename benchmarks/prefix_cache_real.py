"""Prefix-cache benchmark on a real engine (issue 30): the document-grounded recipe on
llama.cpp (xllamacpp + SmolLM2-135M, ``.work/serving/llamacpp``), 2 replicas with several
slots each (``cache_prompt`` is llama-server's default), ``before`` and ``after`` side by
side in one run.

* ``before``: the code at ``--before REF`` (default ``34f292a^``: main before issue 30's
  layout and affinity landed), the recipe as that code lays it out (the document at the
  start of each column's prompt, the judge's own text after); the proxy routes by least
  outstanding requests, no affinity key.
* ``after``: this tree, the document as the recipe's ``context``, the judge a continuation
  of the answer's conversation, per-record affinity with the load bound.

Both sides use the same proxy and generator flow as ``benchmarks/prefix_cache.py`` (its
``side``), client concurrency fixed at 2 x the slots (``--concurrency``), fresh replicas
(cold caches) for each side. Reported per side: records/s (records over the generator's
wall time), the prefix-cache hit rate per replica from llama.cpp's ``/metrics``
(``prompt_tokens_cached_total / (prompt_tokens_total + prompt_tokens_cached_total)``),
affinity hits / load-bound fallbacks from the proxy, and for ``after`` the figures the
generator published in ``progress.json`` (``aliases.gen.cache``, what ``status --shard N``
shows). Goal: ``after`` >= 1.3x ``before``.

On a 2-core machine each replica gets ``--threads`` (default 1) CPU threads: the two
replicas share the two cores with everything else on the machine, so the figure is a
measurement of prompt-evaluation work saved, not of a GPU's batching.

``python benchmarks/prefix_cache_real.py [--records N] [--repeat K]`` (~3 minutes a
repeat with the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import prefix_cache  # noqa: E402
from prefix_cache import JUDGE, plan_file, side  # noqa: E402

from benchmarks.trees import export  # noqa: E402
from synthbatch.agent_stdlib.contracts import ColumnSpec, SeedDataSpec  # noqa: E402
from synthbatch.agent_stdlib.layout import AttemptLayout  # noqa: E402
from synthbatch.agent_stdlib.statefile import read_json  # noqa: E402

TEXT_TOKENS = 8
JUDGE_TOKENS = 32
SERVING = REPO / ".work" / "serving" / "llamacpp"
WORDS = ("the river city market school garden winter summer house road bridge north south "
         "light water stone music paper letter window friend doctor teacher farmer harbor "
         "train morning evening village forest mountain island station library museum "
         "kitchen table chair story").split()


def grounded(after: bool) -> Tuple[Tuple[ColumnSpec, ...], Dict[str, Any]]:
    """``prefix_cache.grounded`` with room for a small real model's words: three text
    columns read the document (the answer as text: a 135M model's JSON is not what is
    measured), the judge reads the answer; a record the model cannot judge is dropped
    (``on_error = "drop"``, counted, the same on both sides)."""
    doc = "" if after else "Document:\n{document}\n\n"
    text = {"model": "gen", "max_tokens": TEXT_TOKENS}
    columns = (
        ColumnSpec("summary", "llm-text", {**text, "prompt": doc + "Summarize the document."}),
        ColumnSpec("question", "llm-text", {**text,
                                            "prompt": doc + "Ask one question about it."}),
        ColumnSpec("answer", "llm-text", {**text,
                                          "prompt": doc + "Answer from the document: "
                                          "{question}"}),
        ColumnSpec("grade", "llm-judge", {
            "model": "gen", "max_tokens": JUDGE_TOKENS, "scores": [JUDGE],
            "prompt": "Is that answer grounded in the document?" if after else
            "Question: {question}\nAnswer: {answer}",
            **({"continue_from": "answer"} if after else {})}),
    )
    return columns, {"on_error": "drop",
                     **({"context": "Document:\n{document}"} if after else {})}


def seed_file(path: Path, rows: int, words: int) -> SeedDataSpec:
    """One distinct document of ``words`` common words (about one token each) per row."""
    rng = random.Random(30)
    with path.open("w") as out:
        for _ in range(rows):
            out.write(json.dumps({"document": " ".join(rng.choices(WORDS, k=words))}) + "\n")
    return SeedDataSpec(str(path), "in-order", ("document",), rows=rows)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(engines: Any, within_s: float, what: str) -> None:
    """Until every replica of ``engines`` (``procs``, ``urls``, ``stop()``) answers
    ``/health``; stops them and exits if one dies or ``within_s`` passes."""
    deadline = time.monotonic() + within_s
    for proc, url in zip(engines.procs, engines.urls):
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                engines.stop()
                raise SystemExit(f"{what} at {url} did not get ready")
            time.sleep(0.5)


class LlamaEngines:
    """``count`` llama.cpp replicas (``serve-llamacpp`` under the serving environment)."""

    def __init__(self, workdir: Path, args: argparse.Namespace, count: int) -> None:
        python = SERVING / "venv" / "bin" / "python"
        self.procs: List[subprocess.Popen] = []
        self.urls: List[str] = []
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO),
               "HOME": str(workdir)}
        for i in range(count):
            port = free_port()
            self.procs.append(subprocess.Popen(
                [str(python), "-m", "agent_stdlib", "serve-llamacpp", "-m",
                 str(SERVING / "model.gguf"), "--port", str(port), "-a", "fake-model",
                 "-t", str(args.threads), "-np", str(args.slots), "-c",
                 str(args.slots * args.slot_ctx), "--metrics"], cwd=REPO, env=env,
                stdout=subprocess.DEVNULL, stderr=(workdir / f"engine-{i}.log").open("w")))
            self.urls.append(f"http://127.0.0.1:{port}")
        wait_ready(self, 120.0, "llama.cpp")

    def counters(self) -> List[Dict[str, float]]:
        """Per replica: llama.cpp's counters (``llamacpp:*``)."""
        out = []
        for url in self.urls:
            text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            out.append({line.split(" ")[0]: float(line.rsplit(" ", 1)[1])
                        for line in text.splitlines() if line and not line.startswith("#")})
        return out

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=30)


    def reset(self) -> None:
        """Nothing: each side starts fresh replicas."""

    @staticmethod
    def hit_rate(c: Dict[str, float]) -> float:
        cached = c.get("llamacpp:prompt_tokens_cached_total", 0.0)
        return cached / max(1.0, cached + c.get("llamacpp:prompt_tokens_total", 0.0))

    @staticmethod
    def evaluated(c: Dict[str, float]) -> float:
        return c.get("llamacpp:prompt_tokens_total", 0.0)


def metric_sums(text: str) -> Dict[str, float]:
    """Prometheus text -> per metric name (labels dropped) the sum of its samples."""
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


class VllmEngines:
    """``count`` vLLM CPU replicas with automatic prefix caching (``.work/serving/vllm``),
    started once for every side: between sides each replica's prefix cache is emptied
    (``POST /reset_prefix_cache``, vLLM's dev-mode endpoint) and the counters read as
    differences, since a vLLM CPU start takes minutes here."""

    def __init__(self, workdir: Path, args: argparse.Namespace, count: int) -> None:
        serving = REPO / ".work" / "serving" / "vllm"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir),
               "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_SERVER_DEV_MODE": "1",
               "OMP_NUM_THREADS": str(args.threads)}
        self.procs: List[subprocess.Popen] = []
        self.urls: List[str] = []
        for i in range(count):
            port = free_port()
            self.procs.append(subprocess.Popen(
                [str(serving / "venv" / "bin" / "python"), "-m",
                 "vllm.entrypoints.openai.api_server", "--model", str(serving / "model"),
                 "--host", "127.0.0.1", "--port", str(port),
                 "--served-model-name", "fake-model", "--enable-prefix-caching",
                 "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "2048",
                 "--max-num-seqs", str(args.slots)], cwd=workdir, env=env,
                stdout=subprocess.DEVNULL, stderr=(workdir / f"vllm-{i}.log").open("w")))
            self.urls.append(f"http://127.0.0.1:{port}")
        wait_ready(self, args.startup_s, f"vLLM (logs in {workdir})")
        self.base = self._raw()

    def _raw(self) -> List[Dict[str, float]]:
        return [metric_sums(urllib.request.urlopen(url + "/metrics", timeout=10)
                            .read().decode()) for url in self.urls]

    def reset(self) -> None:
        """Empty every replica's prefix cache; counters start again from here."""
        for url in self.urls:
            request = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
            urllib.request.urlopen(request, timeout=30).read()
        self.base = self._raw()

    def counters(self) -> List[Dict[str, float]]:
        """Per replica: vLLM's counters since the last reset."""
        return [{k: v - base.get(k, 0.0) for k, v in now.items()}
                for now, base in zip(self._raw(), self.base)]

    @staticmethod
    def hit_rate(c: Dict[str, float]) -> float:
        return (c.get("vllm:prefix_cache_hits_total", 0.0)
                / max(1.0, c.get("vllm:prefix_cache_queries_total", 0.0)))

    @staticmethod
    def evaluated(c: Dict[str, float]) -> float:
        """Prompt tokens computed (not read from the prefix cache)."""
        return (c.get("vllm:prompt_tokens_total", 0.0)
                - c.get("vllm:prefix_cache_hits_total", 0.0))

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=60)


def run_side(name: str, tree: Path, workdir: Path, args: argparse.Namespace,
             seeds: SeedDataSpec, shared: Optional[VllmEngines] = None) -> Dict[str, Any]:
    """One side on fresh replicas (llama.cpp) or on ``shared`` ones with their caches
    emptied (vLLM): its records/s, hit rates and affinity."""
    folder = workdir / name
    folder.mkdir()
    plan = folder / "plan.json"
    prefix_cache.WORKLOADS["grounded"] = grounded  # this module's recipe
    plan_file(plan, "grounded", name.startswith("after"), args.records, seeds,
              args.concurrency or 2 * args.replicas * args.slots)
    engines: Any = shared or LlamaEngines(folder, args, args.replicas)
    engines.reset()
    try:
        # --max-queued: the proxy samples each replica's /metrics (its hit ratio), as
        # in an allocation (DeploymentSpec.max_queued_requests, default 256)
        result = side(tree, folder, plan, engines, args.records, ("--max-queued", "256"))
        counters = engines.counters()
    finally:
        if shared is None:
            engines.stop()
    result["rate"] = args.records / result["seconds"]
    result["hit_rates"] = [engines.hit_rate(c) for c in counters]
    result["evaluated"] = [engines.evaluated(c) for c in counters]
    progress = read_json(AttemptLayout(folder).progress_json) or {}
    result["dropped"] = progress.get("records_dropped", 0)
    result["published"] = progress.get("aliases", {}).get("gen", {}).get("cache")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Run both sides ``--repeat`` times and print the ratio with the hit rates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="34f292a^", help="git ref of the 'before' code")
    parser.add_argument("--records", type=int, default=24)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--engine", choices=("llamacpp", "vllm"), default="llamacpp")
    parser.add_argument("--startup-s", type=float, default=900.0,
                        help="how long a vLLM replica may take to get ready")
    parser.add_argument("--slots", type=int, default=4,
                        help="llama.cpp slots (vLLM: --max-num-seqs) per replica")
    parser.add_argument("--slot-ctx", type=int, default=1024, help="context per slot")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per replica")
    parser.add_argument("--words", type=int, default=300, help="words per seed document")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=0,
                        help="client concurrency (default: 2 x the slots of all replicas)")
    args = parser.parse_args(argv)
    if args.engine == "llamacpp" and not (SERVING / "model.gguf").exists():
        raise SystemExit(f"no llama.cpp serving environment at {SERVING}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="synthbatch-bench-prefix-real-") as tmp:
        workdir = Path(tmp)
        before, commit = export(args.before, workdir / "before-tree")
        seeds = seed_file(workdir / "docs.jsonl", args.records, args.words)
        engine = ("vLLM CPU (prefix caching)" if args.engine == "vllm" else "llama.cpp")
        print(f"engine: {engine} SmolLM2-135M, {args.replicas} replicas x {args.slots} "
              f"slots, {args.threads} thread(s) each; {args.records} records of the "
              f"grounded recipe ({args.words}-word document, 3 columns + judge); before = "
              f"{args.before} ({commit})", flush=True)
        started = time.monotonic()
        shared = (VllmEngines(workdir, args, args.replicas) if args.engine == "vllm"
                  else None)
        if shared:
            print(f"vLLM replicas ready after {time.monotonic() - started:.0f} s", flush=True)
        try:
            ok = repeat(args, workdir, before, seeds, shared)
        finally:
            if shared:
                shared.stop()
    return 0 if ok else 1


def repeat(args: argparse.Namespace, workdir: Path, before: Path, seeds: SeedDataSpec,
           shared: Optional[VllmEngines]) -> bool:
    """``--repeat`` runs of both sides; prints each; every ratio at the goal?"""
    ok = True
    for k in range(args.repeat):
        r = {}
        for name, tree in (("before", before), ("after", REPO)):
            r[name] = run_side(f"{name}-{k}", tree, workdir, args, seeds, shared)
        b, a = r["before"], r["after"]
        ratio = a["rate"] / b["rate"]
        ok = ok and ratio >= 1.3
        fmt = ", ".join
        print(f"run {k + 1}: before {b['rate']:.3f} records/s (hit rate per replica "
              f"{fmt(f'{h:.2f}' for h in b['hit_rates'])}, prompt tokens evaluated "
              f"{sum(b['evaluated']):.0f}, dropped {b['dropped']}); after "
              f"{a['rate']:.3f} (hit rate per replica "
              f"{fmt(f'{h:.2f}' for h in a['hit_rates'])}, evaluated "
              f"{sum(a['evaluated']):.0f}, dropped {a['dropped']}, affinity "
              f"{a['affinity'] or 'none'}; progress.json cache {a['published']}) -> "
              f"{ratio:.3f}x (goal >= 1.3x)", flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
