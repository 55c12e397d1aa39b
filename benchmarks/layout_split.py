"""The automatic layout's split of a GPU budget between a writer and a judge of different
sizes, against every split, with ``synthbatch benchmark`` on the local backend.

Two fake engines (``fixtures/fake_openai_server.py``) stand for a writer and a judge: a
token costs ``--token-latency`` x ``--model-size`` seconds, the size being each model's
active parameters in billions as ``control/planning/modelfacts.py`` reads them from the
small ``config.json`` folders written here (a 3B-class writer, a 1B-class judge), and each
replica generates at most ``--max-concurrency`` requests at once (the GPU's batch). The
budget is 8 GPUs on one local "node" (indices only; no GPU is used), one GPU a replica.

One benchmark file, one case per split: ``auto`` (the base run, ``[resources] gpus = 8``
and no replicas written: the layout chooses) and ``w1`` ... ``w7`` (``k`` writer replicas,
``8 - k`` judge replicas, written). Each case is one point at a fixed client concurrency
above every split's capacity; ``benchmark analyze`` gives each case's records/s (the
generator's wall time, boot excluded). Goal: auto >= 0.9 x the best split.

    python benchmarks/layout_split.py [--records 300] [--token-latency 0.01]
        [--writer-tokens 48] [--judge-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from control import api  # noqa: E402
from control.runs.modelinfo import read_facts  # noqa: E402

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
    cases = ['[[cases]]\nname = "auto"\n'] + [
        f'[[cases]]\nname = "w{k}"\ndeployments.writer = {{ replicas = {k} }}\n'
        f'deployments.judge = {{ replicas = {BUDGET - k} }}\n' for k in range(1, BUDGET)]
    bench = root / "bench.toml"
    bench.write_text(f"""schema_version = 1
name = "split"
run = "run.toml"
concurrency = [{4 * BUDGET * SLOTS}]
[records]
fixed = {records}
""" + "\n".join(cases))
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
    return bench


def main() -> int:
    """Run the sweep; print records/s per split and auto / best."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--token-latency", type=float, default=0.01)
    parser.add_argument("--writer-tokens", type=int, default=48)
    parser.add_argument("--judge-tokens", type=int, default=32)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="layout-split-"))
    bench = files(root, args.records, args.token_latency,
                  (args.writer_tokens, args.judge_tokens))
    profile = str(root / "profile.toml")
    plan = api.plan(root / "run.toml", profile)
    for line in plan.summary.splitlines():
        if line.startswith("layout: "):
            print(line, flush=True)
    started = time.monotonic()
    out = api.benchmark_run(bench, profile)
    for case in out["cases"]:
        status = api.wait(case["run_id"], profile, timeout_s=1800, interval_s=2.0)
        print(f"case {case['case']}: {status.state}", flush=True)
    result = api.benchmark_analyze(out["benchmark_id"], profile)
    rates = {c["case"]: c["best_records_per_s"] or 0.0 for c in result["cases"]}
    splits = {k: v for k, v in rates.items() if k != "auto"}
    best = max(splits, key=lambda k: splits[k])
    chosen = {c["alias"]: c["chosen"].get("replicas") for c in plan.layout}
    print(f"{'case':6s} {'writer':>6s} {'judge':>6s} {'records/s':>10s}")
    for case, rate in rates.items():
        w = chosen["writer"] if case == "auto" else int(case[1:])
        print(f"{case:6s} {w:6d} {BUDGET - w:6d} {rate:10.2f}")
    ratio = rates["auto"] / splits[best] if splits[best] else 0.0
    print(f"auto split {chosen['writer']}:{chosen['judge']} -> {rates['auto']:.2f} records/s; "
          f"best split {best} {splits[best]:.2f} records/s; ratio {ratio:.3f} (goal >= 0.9) "
          f"{'ok' if ratio >= 0.9 else 'MISS'}; {time.monotonic() - started:.0f} s")
    if not args.keep:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    return 0 if ratio >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
