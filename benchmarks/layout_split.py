"""The automatic layout's split of a GPU budget between a writer and a judge of different
sizes, against every split, with ``synthbatch benchmark`` on the local backend.

Two fake engines (``fixtures/fake_openai_server.py``) stand for a writer and a judge: a
token costs ``--token-latency`` x ``--model-size`` seconds, the size being each model's
active parameters in billions as ``control/planning/modelfacts.py`` reads them from the
small ``config.json`` folders written here (a 3B-class writer, a 1B-class judge), and each
replica generates at most ``--max-concurrency`` requests at once (the GPU's batch). The
budget is 8 GPUs on one local "node" (indices only; no GPU is used), one GPU a replica.

First a short pilot: a benchmark of one even split (``w4``, ``--pilot-records``); the
plan with ``--pilot`` then splits the budget by the work it measured (``pilot`` case).
Then one benchmark file, one case per split: ``auto`` (the base run, ``[resources] gpus =
8`` and no replicas written: the layout's estimate chooses), ``pilot`` (the pilot's split,
written) and ``w1`` ... ``w7`` (``k`` writer replicas, ``8 - k`` judge replicas, written).
Each case is one point at a fixed client concurrency above every split's capacity;
``benchmark analyze`` gives each case's records/s (the generator's wall time, boot
excluded). Goals: auto >= 0.9 x the best split, and pilot >= 0.9 x the best split.

    python benchmarks/layout_split.py [--records 300] [--pilot-records 100]
        [--token-latency 0.01] [--writer-tokens 48] [--judge-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from synthbatch.control import api  # noqa: E402
from synthbatch.control.runs.modelinfo import read_facts  # noqa: E402

FAKE = HERE.parent / "fixtures" / "fake_openai_server.py"
BUDGET = 8
SLOTS = 4  # requests a replica generates at once

WRITER = {"hidden_size": 3072, "intermediate_size": 8192, "num_attention_heads": 24,
          "num_key_value_heads": 8, "num_hidden_layers": 28, "vocab_size": 128256,
          "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
JUDGE = {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 16, "vocab_size": 128256,
         "tie_word_embeddings": True, "torch_dtype": "bfloat16"}


def model(folder: Path, config: Dict[str, Any]) -> float:
    """Write a config.json + index folder; its active parameters in billions."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 2 * 10**9}, "weight_map": {}}))
    return read_facts(str(folder)).active_params / 1e9


def deployment(alias: str, size: float, latency: float) -> str:
    return f"""
[[deployments]]
alias = "{alias}"
engine = "openai"
model = "{{config_dir}}/models/{alias}"
served_name = "{alias}"
command = ["{{python}}", "{FAKE}", "--host", "{{host}}", "--port", "{{port}}",
           "--model", "{alias}", "--token-latency", "{latency}", "--model-size", "{size:.3f}",
           "--max-concurrency", "{SLOTS}"]
gpus = 1
startup_timeout_s = 120
"""


def files(root: Path, records: int, latency: float, tokens: tuple) -> Path:
    """The models, the base run, the benchmark file and a local profile under ``root``."""
    writer, judge = model(root / "models" / "writer", WRITER), model(root / "models" / "judge",
                                                                    JUDGE)
    (root / "run.toml").write_text(f"""schema_version = 1
name = "split"
records = {records}
[shards]
count = 1
[resources]
gpus = {BUDGET}
time_limit = "00:20:00"
cpus = 2
mem_mb = 2048
[client]
seed = 3
[[client.columns]]
name = "topic"
type = "category"
values = ["tides", "stars", "rivers", "glaciers"]
[[client.columns]]
name = "draft"
type = "llm-text"
model = "writer"
prompt = "Write a short paragraph about {{topic}}."
max_tokens = {tokens[0]}
[[client.columns]]
name = "verdict"
type = "llm-text"
model = "judge"
prompt = "Is this paragraph accurate? {{draft}}"
max_tokens = {tokens[1]}
""" + deployment("writer", writer, latency) + deployment("judge", judge, latency))
    (root / "profile.toml").write_text(f"""schema_version = 1
backend = "local"
workspace = "{root / 'ws'}"
gpus_per_node = {BUDGET}
gpu_memory_gb = 80
python = "{sys.executable}"
default_time_limit = "00:20:00"
signal_lead_s = 10
grace_s = 5
[local]
max_concurrent = 1
gpus = {list(range(BUDGET))}
""")
    print(f"writer {writer:.2f} B active parameters, judge {judge:.2f} B (fake engine: "
          f"{latency} s a token per billion, {SLOTS} at once a replica)", flush=True)
    return root / "run.toml"


def split_case(name: str, writers: int) -> str:
    """A case with ``writers`` writer replicas and the rest of the budget judges."""
    return (f'[[cases]]\nname = "{name}"\ndeployments.writer = {{ replicas = {writers} }}\n'
            f'deployments.judge = {{ replicas = {BUDGET - writers} }}\n')


def bench_file(path: Path, name: str, records: int, cases: List[str]) -> Path:
    """A benchmark of ``cases`` of the base run, one point each."""
    path.write_text(f"""schema_version = 1
name = "{name}"
run = "run.toml"
concurrency = [{4 * BUDGET * SLOTS}]
[records]
fixed = {records}
""" + "\n".join(cases))
    return path


def finished(bench: Path, profile: str) -> Dict[str, Any]:
    """Run a benchmark and wait for every case; its analysis."""
    out = api.benchmark_run(bench, profile)
    for case in out["cases"]:
        status = api.wait(case["run_id"], profile, timeout_s=1800, interval_s=2.0)
        print(f"{out['benchmark_id']} case {case['case']}: {status.state}", flush=True)
    return api.benchmark_analyze(out["benchmark_id"], profile)


def writers_of(plan: Any) -> int:
    """The writer replicas a plan chose."""
    return next(int(c["chosen"]["replicas"]) for c in plan.layout if c["alias"] == "writer")


def main() -> int:
    """Run the sweep; print records/s per split and auto / best."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--pilot-records", type=int, default=100)
    parser.add_argument("--token-latency", type=float, default=0.01)
    parser.add_argument("--writer-tokens", type=int, default=48)
    parser.add_argument("--judge-tokens", type=int, default=32)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="layout-split-"))
    run = files(root, args.records, args.token_latency,
                (args.writer_tokens, args.judge_tokens))
    profile = str(root / "profile.toml")
    plan = api.plan(run, profile)
    started = time.monotonic()
    pilot = finished(bench_file(root / "pilot.toml", "pilot", args.pilot_records,
                                [split_case("w4", BUDGET // 2)]), profile)
    piloted = api.plan(run, profile, pilot=pilot["benchmark_id"])
    for line in (plan.summary + piloted.summary).splitlines():
        if line.startswith("layout: "):
            print(line, flush=True)
    chosen = {"auto": writers_of(plan), "pilot": writers_of(piloted)}
    cases = (['[[cases]]\nname = "auto"\n', split_case("pilot", chosen["pilot"])]
             + [split_case(f"w{k}", k) for k in range(1, BUDGET)])
    result = finished(bench_file(root / "bench.toml", "split", args.records, cases), profile)
    rates = {c["case"]: c["best_records_per_s"] or 0.0 for c in result["cases"]}
    splits = {k: v for k, v in rates.items() if k.startswith("w")}
    best = max(splits, key=lambda k: splits[k])
    print(f"{'case':6s} {'writer':>6s} {'judge':>6s} {'records/s':>10s}")
    for case, rate in rates.items():
        w = chosen[case] if case in chosen else int(case[1:])
        print(f"{case:6s} {w:6d} {BUDGET - w:6d} {rate:10.2f}")
    ratios = {k: rates[k] / splits[best] if splits[best] else 0.0 for k in chosen}
    for kind, ratio in ratios.items():
        print(f"{kind} split {chosen[kind]}:{BUDGET - chosen[kind]} -> {rates[kind]:.2f} "
              f"records/s; best split {best} {splits[best]:.2f} records/s; ratio {ratio:.3f} "
              f"(goal >= 0.9) {'ok' if ratio >= 0.9 else 'MISS'}")
    print(f"{time.monotonic() - started:.0f} s")
    ok = all(r >= 0.9 for r in ratios.values())
    if not args.keep:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
