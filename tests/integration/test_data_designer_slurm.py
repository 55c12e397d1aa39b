"""A NeMo Data Designer config as the client, on the real Slurm testbed (issue 16).

The config has a seed dataset, a sampler column and two dependent LLM columns on two model
aliases, served by two deployments of the fake server (deterministic text, so every value
of every record is checked). Needs the client environment (`scripts/client-env dd`, built
by `make test`): skipped without it, failed under CI=true.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Dict, List

import pytest

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib.layout import RunLayout
from synthbatch.agent_stdlib.statefile import read_json
from tests.conftest import FAKE_SERVER, REPO
from tests.integration.runs import cli_json, wait_final, wait_until, write_profile

pytestmark = pytest.mark.slurm
CLIENT_ENV = REPO / ".work" / "client" / "dd"
TOPICS = ["the moon", "rivers", "bicycles", "volcanoes", "libraries"]
TONES = ["cheerful", "formal", "curious"]
CONFIG = """\
data_designer:
  model_configs:
    - alias: writer
      model: meta/llama-3.1-8b-instruct
      provider: nvidia
      inference_parameters: {{max_tokens: {writer_tokens}, temperature: 0.7}}
    - alias: critic
      model: meta/llama-3.1-8b-instruct
      provider: nvidia
      inference_parameters: {{max_tokens: 5, temperature: 0.0}}
  seed_config:
    source: {{seed_type: local, path: topics.csv}}
  columns:
    - name: tone
      column_type: sampler
      sampler_type: category
      params: {{values: {tones}}}
    - name: sentence
      column_type: llm-text
      model_alias: writer
      prompt: "Write one {{{{ tone }}}} sentence about {{{{ topic }}}}."
    - name: critique
      column_type: llm-text
      model_alias: critic
      prompt: "Judge: {{{{ sentence }}}}"
"""


def dd_python() -> str:
    if not (CLIENT_ENV / ".complete").exists():
        message = "no Data Designer client environment: run scripts/client-env dd"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return str(CLIENT_ENV / "venv" / "bin" / "python")


def write_dd_run(tmp_path: Path, records: int, shards: int, latency: float = 0.0,
                 writer_tokens: int = 6, buffer_size: int = 3) -> Dict[str, str]:
    """The config, its seed and run.toml; returns the served names of both deployments."""
    (tmp_path / "topics.csv").write_text("topic\n" + "\n".join(TOPICS) + "\n")
    (tmp_path / "dataset.yaml").write_text(CONFIG.format(writer_tokens=writer_tokens,
                                                         tones=json.dumps(TONES)))
    served = {"writer": f"writer-{secrets.token_hex(3)}", "judge": f"judge-{secrets.token_hex(3)}"}
    deployments = "".join(
        f'[[deployments]]\nalias = "{alias}"\nmodel = "{name}"\n'
        f"command = {json.dumps(['{python}', str(FAKE_SERVER), '--host', '{host}', '--port', '{port}', '--model', '{served_name}', '--token-latency', str(latency)])}\n"  # noqa: E501
        "gpus = 1\nstartup_timeout_s = 60\n" for alias, name in served.items())
    (tmp_path / "run.toml").write_text(
        # auto_retry off: failures are retried by hand in these tests
        f'schema_version = 1\nname = "dd"\nauto_retry = false\nrecords = {records}\n'
        "[retries]\nin_allocation = 0\n"  # a server crash fails the attempt
        f'[shards]\ncount = {shards}\n'
        '[client]\ndata_designer = "{config_dir}/dataset.yaml"\n'
        f'python = "{dd_python()}"\n'
        '[client.models]\ncritic = "judge"\n'
        f"[client.run_config]\nbuffer_size = {buffer_size}\n"
        + deployments + '[resources]\nmem_mb = 3072\ntime_limit = "00:10:00"\n')
    return served


def check_record(record: Dict[str, Any], served: Dict[str, str], writer_tokens: int) -> None:
    """Every value: the seed row of the record's global index, the sampler's value, and
    the two LLM columns exactly as the fake server writes them (the second on the first)."""
    assert set(record) == {"index", "topic", "tone", "sentence", "critique"}, record
    assert record["topic"] == TOPICS[record["index"] % len(TOPICS)], record
    assert record["tone"] in TONES
    prompt = f"Write one {record['tone']} sentence about {record['topic']}."
    assert record["sentence"] == expected_completion(served["writer"], prompt, writer_tokens)
    assert record["critique"] == expected_completion(served["judge"],
                                                     f"Judge: {record['sentence']}", 5)


def test_three_shard_data_designer_run_merges_exactly(slurm_cluster, tmp_path, python_exe):
    served = write_dd_run(tmp_path, records=23, shards=3)
    profile = write_profile(tmp_path, python_exe, mem_mb=3072)
    planned = cli_json("plan", str(tmp_path / "run.toml"), "--profile", str(profile))
    assert planned["data_designer"]["checked"] is True  # on the login node, with DD itself
    run_id = cli_json("submit", str(tmp_path / "run.toml"), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, timeout_s=420, interval_s=2.0)
    assert status["state"] == "succeeded", status
    assert status["records_done"] == 23

    out = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert manifest["complete"] and manifest["records"] == len(records) == 23
    assert [r["index"] for r in records] == list(range(23))  # global, contiguous, in order
    for record in records:
        check_record(record, served, writer_tokens=6)
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    card = json.loads((layout.merged / "card.json").read_text())  # DD's profile of each shard
    assert sorted(card["data_designer_profiles"]) == ["0", "1", "2"]
    for shard, count in enumerate((8, 8, 7)):
        [one] = card["data_designer_profiles"][str(shard)]["passes"]
        assert (one["pass"], one["records"]) == (1, count)
        assert one["profile"]["num_records"] == count
        assert {c["column_name"] for c in one["profile"]["column_statistics"]} >= {
            "sentence", "critique"}
    assert card["client"]["kind"] == "data-designer" and card["records"] == 23
    assert "Data Designer's own profile of each shard" in (layout.merged / "README.md").read_text()
    for shard, count in enumerate((8, 8, 7)):
        progress = read_json(layout.attempt(shard, 1).progress_json)
        assert progress is not None
        assert (progress["records_done"], progress["failures"]) == (count, 0)
        log = (layout.attempt(shard, 1).execution_logs(1) / "client.log").read_text()
        assert f"dd: pass 1: generating {count} of {count} records" in log
        assert "9464" not in log  # no metrics endpoint
        assert "openaipublic" not in log and "column profile calculation" not in log


def test_a_requeue_mid_shard_keeps_what_was_written(slurm_cluster, tmp_path, python_exe):
    served = write_dd_run(tmp_path, records=30, shards=1, latency=0.05, buffer_size=2)
    profile = write_profile(tmp_path, python_exe, mem_mb=3072, grace_s=10)
    submitted = cli_json("submit", str(tmp_path / "run.toml"), "--profile", str(profile))
    run_id, key = submitted["run_id"], f"{submitted['job_id']}_0"
    paths = RunLayout(tmp_path / "workspace" / "runs" / run_id).attempt(0, 1)
    output = paths.output / "records-000000000000.jsonl"

    def lines() -> List[bytes]:
        return [ln for ln in (output.read_bytes() if output.exists() else b"").split(b"\n")
                if ln]

    wait_until("6 records written", lambda: len(lines()) >= 6, timeout_s=240)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", key)
    wait_until("the first execution to stop", lambda: "stopped by a signal" in (
        (paths.execution_logs(1) / "client.log").read_text()), timeout_s=120)
    kept = lines()
    assert 6 <= len(kept) < 30
    status = wait_final(run_id, profile, timeout_s=420, interval_s=2.0)
    assert status["state"] == "succeeded", status
    final = lines()
    assert set(kept) <= set(final)  # every record the first execution wrote, byte for byte
    assert sorted(json.loads(ln)["index"] for ln in final) == list(range(30))
    assert [json.loads(ln)["index"] for ln in final] == list(range(30))
    for raw in final:
        check_record(json.loads(raw), served, writer_tokens=6)
    second = (paths.execution_logs(2) / "client.log").read_text()
    assert f"dd: resuming: {len(kept)} records kept" in second
    assert f"dd: pass 1: generating {30 - len(kept)} of 30 records" in second
    attempt = read_json(paths.attempt_json)
    assert attempt is not None and attempt["restarts"] == 1


def test_data_designer_with_the_real_llamacpp_model_writes_real_text(slurm_cluster, tmp_path,
                                                                       python_exe):
    serving = REPO / ".work" / "serving" / "llamacpp"
    if not (serving / ".complete").exists():
        if os.environ.get("CI") == "true":
            pytest.fail("no llamacpp serving environment: run scripts/serving-env llamacpp")
        pytest.skip("no llamacpp serving environment: run scripts/serving-env llamacpp")
    write_dd_run(tmp_path, records=4, shards=2, writer_tokens=24, buffer_size=2)
    config = tmp_path / "dataset.yaml"  # greedy and seeded: the answers do not vary by luck
    text = config.read_text()
    for tokens, temperature in ((24, "0.7"), (5, "0.0")):
        old = f"{{max_tokens: {tokens}, temperature: {temperature}}}"
        assert old in text
        text = text.replace(old, f"{{max_tokens: {tokens}, temperature: 0.0, "
                                 "extra_body: {seed: 7}}")
    config.write_text(text)
    run = tmp_path / "run.toml"
    head = run.read_text().split("[[deployments]]")[0]
    run.write_text(
        head.replace('critic = "judge"', 'writer = "smol"\ncritic = "smol"')
        + '[[deployments]]\nalias = "smol"\nengine = "llamacpp"\n'
        f'model = "{serving / "model.gguf"}"\npython = "{serving / "venv" / "bin" / "python"}"\n'
        'served_name = "smollm2"\nextra_args = ["-t", "1", "-np", "2", "-c", "2048"]\n'
        'startup_timeout_s = 120\n[resources]\nmem_mb = 3072\ntime_limit = "00:15:00"\n')
    profile = write_profile(tmp_path, python_exe, mem_mb=3072, cpus_per_task=2,
                            default_time_limit="00:15:00", grace_s=10)
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, timeout_s=600, interval_s=2.0)
    assert status["state"] == "succeeded", status
    out = tmp_path / "merged.jsonl"
    cli_json("merge", run_id, "--output", str(out), "--profile", str(profile))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # what the pipeline guarantees, never the small model's prose: every record in its
    # place with its own seed row and sampler value, and text from the model in both
    # LLM columns (a served model, not the fake server; not an echo of the prompt)
    assert [r["index"] for r in records] == [0, 1, 2, 3]
    for record in records:
        assert set(record) == {"index", "topic", "tone", "sentence", "critique"}, record
        assert record["topic"] == TOPICS[record["index"]] and record["tone"] in TONES
        for column in ("sentence", "critique"):
            assert isinstance(record[column], str) and record[column].strip(), record
        assert record["sentence"] != f"Write one {record['tone']} sentence about " \
                                     f"{record['topic']}.", record
    logs = "".join(p.read_text(errors="replace") for p in
                   (tmp_path / "workspace" / "runs" / run_id).rglob("server-*.log"))
    assert "serve-llamacpp: listening" in logs


def preflight_failure(tmp_path: Path, python_exe: str) -> str:
    """Submit (no login-node check: submit does not run one), wait, return the reason."""
    profile = write_profile(tmp_path, python_exe, mem_mb=3072)
    run_id = cli_json("submit", str(tmp_path / "run.toml"), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile, timeout_s=240, interval_s=2.0)
    assert status["state"] == "failed", status
    paths = RunLayout(tmp_path / "workspace" / "runs" / run_id).attempt(0, 1)
    attempt = read_json(paths.attempt_json)
    assert attempt is not None and attempt["state"] == "failed"
    assert not list(paths.execution_logs(1).glob("server-*"))  # no server was started
    return str(attempt["reason"])


def test_a_client_environment_without_data_designer_fails_preflight(slurm_cluster, tmp_path,
                                                                    python_exe):
    write_dd_run(tmp_path, records=2, shards=1)
    run = tmp_path / "run.toml"
    run.write_text(run.read_text().replace(dd_python(), python_exe))
    reason = preflight_failure(tmp_path, python_exe)
    assert reason == (f"preflight: data designer: data-designer is not installed for "
                      f"{python_exe}; install it there: {python_exe} -m pip install "
                      "'data-designer==0.9.7' (scripts/client-env dd builds such an "
                      "environment)")


def test_a_config_data_designer_rejects_fails_preflight_with_its_message(
        slurm_cluster, tmp_path, python_exe):
    write_dd_run(tmp_path, records=2, shards=1)
    config = tmp_path / "dataset.yaml"
    config.write_text(config.read_text().replace("{{ topic }}", "{{ subject }}"))
    reason = preflight_failure(tmp_path, python_exe)
    assert reason == (f"preflight: data designer: {config}: column 'sentence': The prompt "
                      "template for 'sentence' references a column that does not exist: "
                      "'subject'.")


CRASH_ONCE = """\
import os, sys
marker, args = sys.argv[1], sys.argv[2:]
try:
    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    args += ["--exit-after", "16"]  # the first start of this server dies mid-shard
except FileExistsError:
    pass
os.execv(sys.executable, [sys.executable, FAKE_SERVER] + args)
"""


def test_a_retry_copies_the_records_the_failed_attempt_kept(slurm_cluster, tmp_path,
                                                             python_exe):
    served = write_dd_run(tmp_path, records=20, shards=1, latency=0.02, buffer_size=2)
    wrapper = tmp_path / "crash_once.py"
    wrapper.write_text(CRASH_ONCE.replace("FAKE_SERVER", repr(str(FAKE_SERVER))))
    run = tmp_path / "run.toml"
    text = run.read_text()
    writer = text.index('alias = "writer"')
    head, rest = text[:writer], text[writer:]
    rest = rest.replace(f'"{FAKE_SERVER}"', f'"{wrapper}", "{tmp_path / "crashed"}"', 1)
    run.write_text(head + rest)
    profile = write_profile(tmp_path, python_exe, mem_mb=3072)
    run_id = cli_json("submit", str(run), "--profile", str(profile))["run_id"]
    first = wait_final(run_id, profile, timeout_s=300, interval_s=2.0)
    assert first["state"] == "failed", first
    layout = RunLayout(tmp_path / "workspace" / "runs" / run_id)
    kept = (layout.attempt(0, 1).output / "records-000000000000.jsonl").read_bytes()
    kept_lines = [ln for ln in kept.split(b"\n") if ln]
    assert 0 < len(kept_lines) < 20
    cli_json("retry", run_id, "--yes", "--profile", str(profile))
    final = wait_final(run_id, profile, timeout_s=300, interval_s=2.0)
    assert final["state"] == "succeeded", final
    second = layout.attempt(0, 2)
    lines = [ln for ln in (second.output / "records-000000000000.jsonl").read_bytes()
             .split(b"\n") if ln]
    assert set(kept_lines) <= set(lines)  # copied byte for byte, not generated again
    assert [json.loads(ln)["index"] for ln in lines] == list(range(20))
    for raw in lines:
        check_record(json.loads(raw), served, writer_tokens=6)
    log = (second.execution_logs(1) / "client.log").read_text()
    assert f"dd: resuming: {len(kept_lines)} records copied from {layout.attempt(0, 1).output}" \
        in log
    assert f"dd: pass 1: generating {20 - len(kept_lines)} of 20 records" in log
