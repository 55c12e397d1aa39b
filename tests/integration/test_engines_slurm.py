"""Real inference engines on CPU, started by the agent as srun steps on the testbed.

llama.cpp (xllamacpp + SmolLM2-135M) runs in the normal suite; vLLM CPU is marked slow.
Each needs its serving environment (`scripts/serving-env llamacpp|vllm`, built by
`make test`): skipped without it, failed under CI=true.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fixtures.fake_openai_server import serve_in_thread
from synthbatch.agent_stdlib.contracts import TelemetryRecord
from synthbatch.agent_stdlib.statefile import load_record
from tests.integration.runs import cli_json, serving_env, wait_final, write_profile

pytestmark = pytest.mark.slurm


def _run_to_end(run_file: Path, profile: Path, timeout_s: float) -> Dict[str, Any]:
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    return wait_final(run_id, profile, timeout_s, interval_s=2.0)


def _records(tmp_path: Path, run_id: str, profile: Path) -> List[Dict[str, Any]]:
    out = tmp_path / "merged.jsonl"
    cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    return [json.loads(line) for line in out.read_text().splitlines()]


def _server_logs(tmp_path: Path, run_id: str) -> str:
    runs = tmp_path / "workspace" / "runs" / run_id
    return "\n".join(p.read_text(errors="replace") for p in runs.rglob("server-*.log"))


def metric_types(text: str) -> Dict[str, str]:
    """Metric name -> type, from a Prometheus exposition's ``# TYPE`` lines."""
    return {parts[2]: parts[3] for parts in (line.split() for line in text.splitlines())
            if len(parts) == 4 and parts[:2] == ["#", "TYPE"]}


def _live_metrics(run_dir: Path, timeout_s: float) -> Dict[str, str]:
    """``metric_types`` of the first replica's own ``/metrics``, read while it serves (its
    URL from the agent's ``telemetry.json``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in run_dir.rglob("telemetry.json"):
            record = load_record(path, TelemetryRecord)
            if record is not None and record.replicas and record.stopping_at is None:
                url = record.replicas[0].url.rstrip("/") + "/metrics"
                return metric_types(urllib.request.urlopen(url, timeout=10).read().decode())
        time.sleep(0.1)
    pytest.fail(f"no serving replica in {run_dir} after {timeout_s}s")


def test_llamacpp_generates_real_text_through_slurm(slurm_cluster, tmp_path, python_exe):
    env = serving_env("llamacpp")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'schema_version = 1\nname = "llama"\nrecords = 6\n[shards]\ncount = 2\n'
        '[client]\nmodel = "smol"\n'
        'prompt_template = "Write one short sentence about the number {index}."\n'
        "max_tokens = 24\ntemperature = 0.0\nconcurrency = 2\n"
        '[[deployments]]\nalias = "smol"\nengine = "llamacpp"\n'
        f'model = "{env / "model.gguf"}"\npython = "{env / "venv" / "bin" / "python"}"\n'
        'served_name = "smollm2"\nextra_args = ["-t", "1", "-np", "2", "-c", "1024"]\n'
        "startup_timeout_s = 120\n"
    )
    profile = write_profile(tmp_path, python_exe, mem_mb=1024, cpus_per_task=2,
                            default_time_limit="00:15:00", grace_s=10)
    status = _run_to_end(run_file, profile, 300)
    assert status["state"] == "succeeded", status
    records = _records(tmp_path, status["run_id"], profile)
    assert [r["index"] for r in records] == list(range(6))
    for record in records:  # what the pipeline guarantees, not the model's prose
        assert record["prompt"] == \
            f"Write one short sentence about the number {record['index']}."
        assert isinstance(record["completion"], str) and record["completion"].strip(), record
        assert record["usage"]["completion_tokens"] > 0
        assert (record["model"], record["served_model"]) == ("smol", "smollm2")
    assert "serve-llamacpp: listening" in _server_logs(tmp_path, status["run_id"])
    # the agent's telemetry read llama.cpp's own /metrics names (issue 32): each shard's
    # replica answered with running and waiting figures (this build exports no KV usage)
    runs = tmp_path / "workspace" / "runs" / status["run_id"]
    telemetry = [load_record(p, TelemetryRecord) for p in sorted(runs.rglob("telemetry.json"))]
    assert len(telemetry) == 2 and all(t is not None and t.series for t in telemetry)
    for record in telemetry:
        (replica,) = record.replicas
        assert (replica.engine, replica.error) == ("llamacpp", None), replica
        assert None not in (replica.running, replica.waiting), replica


@pytest.mark.slow
def test_vllm_cpu_serves_a_shard_and_the_proxy_reads_its_metrics(slurm_cluster, tmp_path,
                                                                  python_exe):
    env = serving_env("vllm")
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'schema_version = 1\nname = "vllm"\nrecords = 16\n[shards]\ncount = 1\n'
        '[client]\nmodel = "smol"\nprompt_template = "Name a color, number {index}."\n'
        "max_tokens = 16\ntemperature = 0.0\nconcurrency = 2\n"
        '[[deployments]]\nalias = "smol"\nengine = "vllm"\n'
        f'model = "{env / "model"}"\npython = "{env / "venv" / "bin" / "python"}"\n'
        'served_name = "smollm2"\n'
        'extra_args = ["--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "2048"]\n'
        "startup_timeout_s = 400\nmax_queued_requests = 8\n"
        '[deployments.env]\nHF_HUB_OFFLINE = "1"\nVLLM_CPU_KVCACHE_SPACE = "1"\n'
        'VLLM_CPU_OMP_THREADS_BIND = "nobind"\n'
        "[resources]\nmem_mb = 3500\n"
    )
    profile = write_profile(tmp_path, python_exe, mem_mb=3500, cpus_per_task=2,
                            default_time_limit="00:15:00", grace_s=10)
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    exported = _live_metrics(tmp_path / "workspace" / "runs" / run_id, 900)
    status = wait_final(run_id, profile, 900, interval_s=2.0)
    assert status["state"] == "succeeded", status
    # the fake server's /metrics says what real vLLM says: every vllm: name it exports is
    # exported by vLLM CPU under the same name and type (issue 32's proof)
    with serve_in_thread(model="fake-model") as fake:
        faked = metric_types(urllib.request.urlopen(fake.url + "/metrics", timeout=10)
                             .read().decode())
    faked = {name: kind for name, kind in faked.items() if name.startswith("vllm:")}
    assert len(faked) >= 8, faked
    assert {name: exported.get(name) for name in faked} == faked, exported
    records = _records(tmp_path, status["run_id"], profile)
    assert [r["index"] for r in records] == list(range(16))
    for record in records:  # text from the model, not its prose
        assert record["completion"].strip() and record["served_model"] == "smollm2", record
        assert record["usage"]["completion_tokens"] > 0
    logs = _server_logs(tmp_path, status["run_id"])
    assert '"GET /metrics HTTP/1.1" 200' in logs  # the proxy's sampler read real metrics
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in logs
    # the agent's telemetry read vLLM's own names (issue 32): running, waiting, KV usage
    runs = tmp_path / "workspace" / "runs" / status["run_id"]
    (path,) = runs.rglob("telemetry.json")
    record = load_record(path, TelemetryRecord)
    assert record is not None and record.series, record
    (replica,) = record.replicas
    assert replica.engine == "vllm" and replica.error is None, replica
    assert None not in (replica.running, replica.waiting, replica.kv_cache_usage), replica
    assert 0.0 <= replica.kv_cache_usage <= 1.0
    assert record.started_at <= record.ready_at <= record.stopping_at <= record.stopped_at
